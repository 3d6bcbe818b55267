"""torch_xla's `torch_xla._dynamo` package: `config` and the `dynamo_bridge` helpers."""
