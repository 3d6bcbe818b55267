"""torch_xla's `torch_xla.debug.model_comparator` (`mc`): save intermediate tensors of two runs and
compare them (`lazyxla/_src/model_comparator.py`)."""

import sys

from .._src.model_comparator import compare as compare
from .._src.model_comparator import compare_tensors as compare_tensors
from .._src.model_comparator import configure as configure
from .._src.model_comparator import main as main
from .._src.model_comparator import save as save
from .._src.model_comparator import tensor_file_compare as tensor_file_compare

__all__ = ["compare", "compare_tensors", "configure", "main", "save", "tensor_file_compare"]

if __name__ == "__main__":
    sys.exit(main())
