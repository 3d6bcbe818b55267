"""torch_xla's `torch_xla._internal` package: the helpers its tests use (`pjrt`, `tpu`, `utils`)."""
