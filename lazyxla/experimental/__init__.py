"""torch_xla's `torch_xla.experimental` package: experimental APIs land here as submodules."""
