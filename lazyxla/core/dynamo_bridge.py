"""torch_xla's `torch_xla.core.dynamo_bridge`: importable; its graph extraction is not built yet.

`torch.compile(model, backend="openxla")` support is issue 3 (a trace-once `torch.compile` backend);
until it lands these entry points raise `NotImplementedError`.
"""

from __future__ import annotations

from typing import Any

from .._src.tensor import is_lazy as is_xla_tensor

_WHY = (
    "torch_xla.core.dynamo_bridge.{} is not implemented by lazyxla yet: the torch.compile backend "
    "is issue 3 (a trace-once backend). Run the model without torch.compile, or wrap the step in "
    "lazyxla.compile / torch_xla.compile"
)


def extract_compiled_graph(xla_model: Any, xla_args: Any) -> Any:
    raise NotImplementedError(_WHY.format("extract_compiled_graph"))


def extract_graph_helper(xla_model: Any, sym_constants_to_graph_vars: Any = None) -> Any:
    raise NotImplementedError(_WHY.format("extract_graph_helper"))


def extract_internal(xla_model: Any) -> Any:
    raise NotImplementedError(_WHY.format("extract_internal"))


def partition_fx_graph_for_cpu_fallback(xla_model: Any, xla_args: Any, *args: Any) -> Any:
    raise NotImplementedError(_WHY.format("partition_fx_graph_for_cpu_fallback"))


__all__ = [
    "extract_compiled_graph",
    "extract_graph_helper",
    "extract_internal",
    "is_xla_tensor",
    "partition_fx_graph_for_cpu_fallback",
]
