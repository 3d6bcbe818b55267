"""torch_xla's `torch_xla.utils.utils`: synthetic data and environment flags."""

from .._src.env_utils import SampleGenerator as SampleGenerator
from .._src.env_utils import check_env_flag as check_env_flag
from .._src.env_utils import getenv_as as getenv_as

__all__ = ["SampleGenerator", "check_env_flag", "getenv_as"]
