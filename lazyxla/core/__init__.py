"""torch_xla's `torch_xla.core` package: `xla_model` (`xm`) and the `dynamo_bridge` stub."""
