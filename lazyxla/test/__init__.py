"""torch_xla's `torch_xla.test` package: `test_utils`."""
