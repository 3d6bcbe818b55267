"""torch_xla's `torch_xla.utils.stablehlo_test_utils`: helpers its StableHLO tests use."""

from .._src import stablehlo_test_utils as _impl

compare_exported_program_and_saved_model_result = (
    _impl.compare_exported_program_and_saved_model_result
)
has_tf_package = _impl.has_tf_package
load_save_model_and_inference = _impl.load_save_model_and_inference
wrap_func_as_nn_module = _impl.wrap_func_as_nn_module

__all__ = [
    "compare_exported_program_and_saved_model_result",
    "has_tf_package",
    "load_save_model_and_inference",
    "wrap_func_as_nn_module",
]
