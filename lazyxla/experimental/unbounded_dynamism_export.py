"""torch_xla's `torch_xla.experimental.unbounded_dynamism_export`: FX passes for programs exported
with symbolic dimensions (Note [Unbounded dynamism] in `lazyxla/_src/unbounded_dynamism.py`)."""

from .._src.unbounded_dynamism import call_function as call_function
from .._src.unbounded_dynamism import (
    decompose_dynamic_native_group_norm as decompose_dynamic_native_group_norm,
)
from .._src.unbounded_dynamism import (
    decompose_dynamic_native_layer_norm as decompose_dynamic_native_layer_norm,
)
from .._src.unbounded_dynamism import (
    decompose_dynamic_shape_select as decompose_dynamic_shape_select,
)
from .._src.unbounded_dynamism import decompose_split_with_sizes as decompose_split_with_sizes
from .._src.unbounded_dynamism import dynamic_unsqueeze_to_view as dynamic_unsqueeze_to_view
from .._src.unbounded_dynamism import (
    exported_program_has_symbolic_input_shape as exported_program_has_symbolic_input_shape,
)
from .._src.unbounded_dynamism import (
    flatten_embedding_indices_tensor as flatten_embedding_indices_tensor,
)
from .._src.unbounded_dynamism import native_group_norm_impl as native_group_norm_impl
from .._src.unbounded_dynamism import native_group_norm_pattern as native_group_norm_pattern
from .._src.unbounded_dynamism import native_layer_norm_impl as native_layer_norm_impl
from .._src.unbounded_dynamism import native_layer_norm_pattern as native_layer_norm_pattern
from .._src.unbounded_dynamism import (
    process_exported_program_with_symbolic_input as process_exported_program_with_symbolic_input,
)
from .._src.unbounded_dynamism import remove_no_op_slice as remove_no_op_slice
from .._src.unbounded_dynamism import (
    replace_dynamic_expand_with_xla_op as replace_dynamic_expand_with_xla_op,
)
from .._src.unbounded_dynamism import (
    replace_dynamic_view_with_xla_op as replace_dynamic_view_with_xla_op,
)
from .._src.unbounded_dynamism import wrap_func_as_nn_module as wrap_func_as_nn_module

__all__ = [
    "call_function",
    "decompose_dynamic_native_group_norm",
    "decompose_dynamic_native_layer_norm",
    "decompose_dynamic_shape_select",
    "decompose_split_with_sizes",
    "dynamic_unsqueeze_to_view",
    "exported_program_has_symbolic_input_shape",
    "flatten_embedding_indices_tensor",
    "native_group_norm_impl",
    "native_group_norm_pattern",
    "native_layer_norm_impl",
    "native_layer_norm_pattern",
    "process_exported_program_with_symbolic_input",
    "remove_no_op_slice",
    "replace_dynamic_expand_with_xla_op",
    "replace_dynamic_view_with_xla_op",
    "wrap_func_as_nn_module",
]
