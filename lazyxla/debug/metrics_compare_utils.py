"""torch_xla's `torch_xla.debug.metrics_compare_utils` (`mcu`): parse, compare metrics reports."""

from .._src.metrics_compare import compare_metrics as compare_metrics
from .._src.metrics_compare import (
    get_data_points_from_metrics_reports as get_data_points_from_metrics_reports,
)
from .._src.metrics_compare import parse_metrics_report as parse_metrics_report

__all__ = ["compare_metrics", "get_data_points_from_metrics_reports", "parse_metrics_report"]
