"""torch_xla's `torch_xla.test.test_utils`: training-loop printing and TensorBoard summaries."""

from .._src.test_utils import close_summary_writer as close_summary_writer
from .._src.test_utils import get_summary_writer as get_summary_writer
from .._src.test_utils import mp_test as mp_test
from .._src.test_utils import now as now
from .._src.test_utils import print_test_update as print_test_update
from .._src.test_utils import print_training_update as print_training_update
from .._src.test_utils import write_to_summary as write_to_summary

__all__ = [
    "close_summary_writer",
    "get_summary_writer",
    "mp_test",
    "now",
    "print_test_update",
    "print_training_update",
    "write_to_summary",
]
