"""torch_xla's `torch_xla.utils` package."""
