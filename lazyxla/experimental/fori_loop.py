"""torch_xla's `torch_xla.experimental.fori_loop`: `fori_loop` and `while_loop` lowered to
`jax.lax.while_loop`. Importing it routes `torch._higher_order_ops.while_loop` on lazyxla
tensors to one `xla::while_loop` node (as importing torch_xla's module does for XLA tensors)."""

from lazyxla._src.control_flow import fori_loop as fori_loop
from lazyxla._src.control_flow import register_while_loop_hop as _register
from lazyxla._src.control_flow import while_loop_hop as while_loop

_register()

__all__ = ["fori_loop", "while_loop"]
