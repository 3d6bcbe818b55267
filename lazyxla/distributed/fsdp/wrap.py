"""torch_xla's `torch_xla.distributed.fsdp.wrap`: auto-wrap policies."""

from ..._src.fsdp_wrap import always_wrap_policy as always_wrap_policy
from ..._src.fsdp_wrap import lambda_auto_wrap_policy as lambda_auto_wrap_policy
from ..._src.fsdp_wrap import recursive_wrap as recursive_wrap
from ..._src.fsdp_wrap import size_based_auto_wrap_policy as size_based_auto_wrap_policy
from ..._src.fsdp_wrap import transformer_auto_wrap_policy as transformer_auto_wrap_policy

__all__ = [
    "always_wrap_policy",
    "lambda_auto_wrap_policy",
    "recursive_wrap",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]
