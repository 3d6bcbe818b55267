"""torch_xla's `torch_xla.distributed.fsdp.utils`: the `nn.Linear` patch (Note [Patched nn.Linear],
`lazyxla/_src/fsdp_utils.py`), `checkpoint_module`, and debugging stand-ins for collectives."""

from ..._src.fsdp_utils import BucketizedReduceScatter as BucketizedReduceScatter
from ..._src.fsdp_utils import DummyReduceScatter as DummyReduceScatter
from ..._src.fsdp_utils import XLAPatchedLinear as XLAPatchedLinear
from ..._src.fsdp_utils import apply_xla_patch_to_nn_linear as apply_xla_patch_to_nn_linear
from ..._src.fsdp_utils import checkpoint_module as checkpoint_module
from ..._src.fsdp_utils import dummy_all_gather as dummy_all_gather
from ..._src.fsdp_utils import dummy_all_reduce as dummy_all_reduce

__all__ = [
    "BucketizedReduceScatter",
    "DummyReduceScatter",
    "XLAPatchedLinear",
    "apply_xla_patch_to_nn_linear",
    "checkpoint_module",
    "dummy_all_gather",
    "dummy_all_reduce",
]
