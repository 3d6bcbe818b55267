"""torch_xla's `torch_xla.distributed` package: `parallel_loader` (`pl`) and, with SPMD, `spmd`."""
