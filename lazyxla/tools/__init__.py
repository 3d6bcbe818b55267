"""Developer tools (`python -m lazyxla.tools.op_coverage`)."""
