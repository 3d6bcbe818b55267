"""torch_xla's `stablehlo_custom_call`: a `stablehlo.custom_call` op in the lazy graph.

# Note [Custom calls]
`stablehlo_custom_call(args, call_target, output_shapes, output_dtypes, has_side_effect,
backend_config, api_version, frontend_attributes)` records one `xla::custom_call` node whose
lowering is `jax.ffi.ffi_call`: JAX emits the `stablehlo.custom_call @call_target` with the
`backend_config` string, `api_version` and `has_side_effect` given, and `frontend_attributes` are
attached through `jax.experimental.xla_metadata.set_xla_metadata` (as `mhlo.frontend_attributes`,
what torch_xla sets). It runs when the platform's XLA has the target registered (XLA's own targets
such as `annotate_device_placement`, or one registered with `jax.ffi.register_ffi_target`);
otherwise compiling the graph fails with XLA's "No registered implementation for custom call"
error, as in torch_xla. The op has no autograd: a custom call is opaque to differentiation.
`api_version` 4 (the typed FFI) takes its attributes as a dict, not a string: `backend_config`
must then be empty. Like every lazy op, a custom call whose outputs are never used is not run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import torch

from .ir import Ref, TensorSpec
from .runtime import jnp_dtype
from .tensor import is_lazy, new_tensor, read, state


def _rule(
    *arrays: jax.Array,
    target: str,
    outs: tuple[tuple[tuple[int, ...], Any], ...],
    has_side_effect: bool,
    backend_config: str,
    api_version: int,
    frontend_attributes: tuple[tuple[str, str], ...],
) -> tuple[jax.Array, ...]:
    from jax.experimental.xla_metadata import set_xla_metadata

    results = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in outs]
    call = jax.ffi.ffi_call(
        target,
        results,
        has_side_effect=has_side_effect,
        # StableHLO's 0 is "unspecified" (torch_xla's default), which jax refuses: XLA reads it as
        # the original convention, 1.
        custom_call_api_version=api_version or 1,
        legacy_backend_config=None if api_version == 4 else backend_config,
    )
    if frontend_attributes:
        with set_xla_metadata(**dict(frontend_attributes)):
            return tuple(call(*arrays))
    return tuple(call(*arrays))


def stablehlo_custom_call(
    args: Sequence[torch.Tensor],
    call_target: str,
    output_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[torch.dtype],
    has_side_effect: bool = False,
    backend_config: str = "",
    api_version: int = 0,
    frontend_attributes: dict[str, str] | None = None,
) -> torch.Tensor | list[torch.Tensor]:
    """Call the XLA custom call `call_target` on `args` (Note [Custom calls]).

    Args:
        args: lazyxla tensors, the operands.
        call_target: the registered custom-call target name.
        output_shapes, output_dtypes: one shape and dtype per result.
        has_side_effect: keep the call even if XLA could drop it.
        backend_config: the opaque configuration string (api_version 0-3).
        api_version: the custom-call API version (0-3 legacy, 4 typed FFI).
        frontend_attributes: string attributes attached to the op.

    Returns:
        The result tensor, or the list of them when there are several.

    Example:
        >>> stablehlo_custom_call([t], "annotate_device_placement", [t.shape], [t.dtype],
        ...     has_side_effect=True, frontend_attributes={"_xla_buffer_placement": "device"})
    """
    from .ir import Node

    where = f"stablehlo_custom_call({call_target!r})"
    if len(output_shapes) != len(output_dtypes) or not output_shapes:
        raise ValueError(
            f"{where}: give one dtype per output shape (got {len(output_shapes)} shapes and "
            f"{len(output_dtypes)} dtypes, at least one of each)"
        )
    for i, a in enumerate(args):
        if not (isinstance(a, torch.Tensor) and is_lazy(a)):
            raise ValueError(
                f"{where}: argument {i} is not a tensor on the lazyxla device; move it with "
                f".to(torch_xla.device()) ({type(a).__name__}"
                f"{' on ' + str(a.device) if isinstance(a, torch.Tensor) else ''})"
            )
    if api_version not in (0, 1, 2, 3, 4):
        raise ValueError(f"{where}: api_version must be 0-4, got {api_version}")
    if api_version == 4 and backend_config:
        raise ValueError(
            f"{where}: api_version 4 (typed FFI) takes attributes, not a backend_config string"
        )
    attrs = frontend_attributes or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in attrs.items()):
        raise ValueError(f"{where}: frontend_attributes must map str to str, got {attrs!r}")
    specs = tuple(
        TensorSpec(tuple(int(d) for d in s), dt) for s, dt in zip(output_shapes, output_dtypes)
    )
    outs = tuple((s.shape, jnp_dtype(s.dtype)) for s in specs)
    kwargs = (
        ("target", call_target),
        ("outs", outs),
        ("has_side_effect", bool(has_side_effect)),
        ("backend_config", backend_config),
        ("api_version", int(api_version)),
        ("frontend_attributes", tuple(sorted(attrs.items()))),
    )
    inputs = tuple(read(state(a)) for a in args)
    node = Node(
        "xla::custom_call", _rule, inputs, tuple(Ref(i) for i in range(len(args))), kwargs, specs
    )
    results = [new_tensor((node, i), s) for i, s in enumerate(specs)]
    return results[0] if len(results) == 1 else results


def extract_custom_call_outputs_shape_dtype(n: torch.fx.Node) -> tuple[list, list]:
    """The output shapes and dtypes of an FX node, from torch.export's `meta["val"]`."""
    val = n.meta.get("val")
    if isinstance(val, torch.Tensor):
        return [val.shape], [val.dtype]
    if not isinstance(val, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in val):
        raise ValueError(
            f"{n.target}: a custom call's outputs must be tensors with shapes known to "
            f"torch.export (node {n.name} has meta['val'] = {val!r})"
        )
    return [t.shape for t in val], [t.dtype for t in val]


__all__ = ["extract_custom_call_outputs_shape_dtype", "stablehlo_custom_call"]


# --- torch_xla's xla_marker -----------------------------------------------------------------------

# Note [Pattern markers]
# torch_xla's `torch.ops.xla.mark_tensor(x, name, pos, id, is_input, attr)` (and the
# `StableHLOCompositeBuilder` built on it) tags the inputs and outputs of a pattern so its exporter
# can wrap the ops between them in a `stablehlo.composite`. lazyxla defines the op with torch_xla's
# schema in the `xla` namespace. On a lazyxla tensor it records an identity node carrying the
# marker, and lowering wraps each marked pattern in a `stablehlo.composite` (Note [Composites] in
# `composite.py`): in `xm.get_stablehlo`, in compiled graphs and in `torch_xla.stablehlo` exports.
# On any other tensor it is the identity (a copy, so autograd and torch.export see an op). The
# marker's boundary metadata is validated (name, pos, id and the composite attributes, as
# torch_xla checks them).
XLA_LIB = torch.library.Library("xla", "FRAGMENT")
XLA_LIB.define(
    "mark_tensor(Tensor x, str name, int pos, str id, bool is_input, Any? attr=None) -> Tensor"
)


def check_composite_attr(attr: Any) -> None:
    """torch_xla's validation of a composite's attributes (a dict of str to scalars/lists)."""
    if attr is None:
        return
    if not isinstance(attr, dict):
        raise ValueError("Composite attr must be a Python dictionary.")
    for k, v in attr.items():
        if not isinstance(k, str):
            raise ValueError("Composite attr name must be a Python str.")
        bad = ValueError(
            "Composite attr value must be either Python str, float, int, bool, list[int], "
            "list[float], list[bool]."
        )
        if isinstance(v, (list, tuple)):
            types = {type(e) for e in v}
            if len(types) > 1 or next(iter(types), None) not in (int, float, bool):
                raise bad
        elif type(v) not in (str, float, int, bool):
            raise bad


def _mark_tensor_lazy(*args: Any, **kwargs: Any) -> torch.Tensor:
    from .composite import mark_tensor_lazy

    return mark_tensor_lazy(*args, **kwargs)


def _mark_tensor(
    x: torch.Tensor, name: str, pos: int, id: str, is_input: bool, attr: Any = None
) -> torch.Tensor:
    check_composite_attr(None if attr is None else dict(attr))
    return x.clone()


XLA_LIB.impl("mark_tensor", _mark_tensor, "CompositeExplicitAutograd")
XLA_LIB.impl("mark_tensor", _mark_tensor_lazy, "PrivateUse1")
XLA_LIB.impl("mark_tensor", lambda x, *a, **k: torch.empty_like(x), "Meta")
torch.library.register_autograd(
    "xla::mark_tensor",
    lambda ctx, grad: (grad, None, None, None, None, None),
    setup_context=lambda ctx, inputs, output: None,
)


def serialize_composite_attr(attr: dict | None) -> tuple | None:
    """A composite's attributes as the hashable form `mark_tensor` takes (torch_xla's helper)."""
    if attr is None:
        return None
    check_composite_attr(attr)
    return tuple(attr.items())


def deserialize_composite_attr(attr: Any) -> dict | None:
    return None if attr is None else dict(attr)


class StableHLOCompositeBuilder:
    """torch_xla's helper marking a pattern's inputs and outputs (Note [Pattern markers]).

    Example:
        >>> b = StableHLOCompositeBuilder("test.sdpa", {"scale": 0.25})
        >>> q, k, v = b.mark_inputs(q, k, v)
        >>> out = b.mark_outputs(F.scaled_dot_product_attention(q, k, v, scale=0.25))
    """

    def __init__(self, name: str, attr: dict | None = None) -> None:
        import uuid

        self.name, self.attr, self.id = name, attr, uuid.uuid4().hex

    def _mark(self, tensors: tuple, is_input: bool) -> Any:
        attr = None if is_input else serialize_composite_attr(self.attr)
        out = []
        for pos, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"input must be a torch tensor. Got {type(t)}.")
            out.append(torch.ops.xla.mark_tensor(t, self.name, pos, self.id, is_input, attr))
        return out[0] if len(out) == 1 else tuple(out)

    def mark_inputs(self, *tensors: torch.Tensor) -> Any:
        return self._mark(tensors, True)

    def mark_outputs(self, *tensors: torch.Tensor) -> Any:
        return self._mark(tensors, False)
