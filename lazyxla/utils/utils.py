"""torch_xla's `torch_xla.utils.utils`: synthetic data, environment flags, nested-structure
walks and timing."""

from .._src.env_utils import SampleGenerator as SampleGenerator
from .._src.env_utils import check_env_flag as check_env_flag
from .._src.env_utils import getenv_as as getenv_as
from .._src.py_utils import Cleaner as Cleaner
from .._src.py_utils import DataWrapper as DataWrapper
from .._src.py_utils import FnDataGenerator as FnDataGenerator
from .._src.py_utils import LazyProperty as LazyProperty
from .._src.py_utils import TimedScope as TimedScope
from .._src.py_utils import TmpFolder as TmpFolder
from .._src.py_utils import as_list as as_list
from .._src.py_utils import eprint as eprint
from .._src.py_utils import flatten_nested_tuple as flatten_nested_tuple
from .._src.py_utils import for_each_instance as for_each_instance
from .._src.py_utils import for_each_instance_rewrite as for_each_instance_rewrite
from .._src.py_utils import get_free_tcp_ports as get_free_tcp_ports
from .._src.py_utils import get_print_fn as get_print_fn
from .._src.py_utils import list_copy_append as list_copy_append
from .._src.py_utils import null_print as null_print
from .._src.py_utils import parallel_work as parallel_work
from .._src.py_utils import shape as shape
from .._src.py_utils import timed as timed

__all__ = [
    "SampleGenerator",
    "check_env_flag",
    "getenv_as",
    "Cleaner",
    "DataWrapper",
    "FnDataGenerator",
    "LazyProperty",
    "TimedScope",
    "TmpFolder",
    "as_list",
    "eprint",
    "flatten_nested_tuple",
    "for_each_instance",
    "for_each_instance_rewrite",
    "get_free_tcp_ports",
    "get_print_fn",
    "list_copy_append",
    "null_print",
    "parallel_work",
    "shape",
    "timed",
]
