"""torch_xla's `torch_xla._internal.pjrt`: run a function on every device, collect the results."""

from .._src.internal_pjrt import run_multiprocess as run_multiprocess
from .._src.internal_pjrt import spawn as spawn
