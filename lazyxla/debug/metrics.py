"""torch_xla's `torch_xla.debug.metrics` surface (`met`), and lazyxla's `cpu_fallback_ops()`."""

from .._src.metrics import clear_all as clear_all
from .._src.metrics import clear_counters as clear_counters
from .._src.metrics import clear_metrics as clear_metrics
from .._src.metrics import counter_names as counter_names
from .._src.metrics import counter_value as counter_value
from .._src.metrics import cpu_fallback_ops as cpu_fallback_ops
from .._src.metrics import executed_fallback_ops as executed_fallback_ops
from .._src.metrics import metric_data as metric_data
from .._src.metrics import metric_names as metric_names
from .._src.metrics import metrics_report as metrics_report
from .._src.metrics import short_metrics_report as short_metrics_report

__all__ = [
    "clear_all",
    "clear_counters",
    "clear_metrics",
    "counter_names",
    "counter_value",
    "cpu_fallback_ops",
    "executed_fallback_ops",
    "metric_data",
    "metric_names",
    "metrics_report",
    "short_metrics_report",
]
