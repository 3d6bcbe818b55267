"""torch_xla's FX passes for programs exported with unbounded dynamic dimensions
(`torch_xla.experimental.unbounded_dynamism_export`) and the `xla.dynamic_view` /
`xla.dynamic_expand` ops they introduce (`torch_xla.experimental.xla_dynamic_reshape_ops`).

# Note [Unbounded dynamism]
torch_xla can export a program whose inputs have symbolic dimensions (`torch.export.Dim`) to
StableHLO with `?` dimensions: these passes first rewrite the ExportedProgram's graph so that each
op with a symbolic size names where the size comes from (`xla.dynamic_view(x, sizes, src, src_dim,
target_dim, scale)`: dimension `target_dim` is `src.shape[src_dim] * scale`), then its tracer
lowers them to dynamic HLO. The passes are plain FX graph rewrites and work here on any program
(the rewritten program still runs on CPU and on lazyxla with the same values: the two ops read the
concrete size). What lazyxla cannot do is the second step: its IR records static shapes (each
lowering rule is traced at the recorded shapes), so `exported_program_to_stablehlo` refuses an
ExportedProgram with symbolic input dimensions, and `_xla_mark_dynamic` cannot make a lazy graph
dynamic; export such a model at a fixed size instead (jax.export's own shape polymorphism needs the
program to be traced symbolically, which the lazy tensor IR does not do).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import GraphModule, Node

from .custom_call import XLA_LIB

aten = torch.ops.aten

# --- xla.dynamic_expand / xla.dynamic_view -------------------------------------------------------

XLA_LIB.define(
    "dynamic_expand(Tensor input, SymInt[] size, Tensor src_tensor, int src_dim, int target_dim)"
    " -> Tensor"
)
XLA_LIB.define(
    "dynamic_view(Tensor input, SymInt[] size, Tensor src_tensor, int src_dim, int target_dim, "
    "float mul_scaler) -> Tensor"
)


def _sizes(size: Sequence[Any], src: torch.Tensor, src_dim: int, target: int, scale: Any) -> list:
    out = list(size)
    out[target] = src.shape[src_dim] * int(scale)
    return out


def dynamic_expand(
    input: torch.Tensor,
    size: Sequence[Any],
    src_tensor: torch.Tensor,
    src_dim: int,
    target_dim: int,
) -> torch.Tensor:
    """`input.expand(size)` with `size[target_dim]` read from `src_tensor.shape[src_dim]`."""
    return input.expand(_sizes(size, src_tensor, src_dim, target_dim, 1))


def dynamic_view(
    input: torch.Tensor,
    size: Sequence[Any],
    src_tensor: torch.Tensor,
    src_dim: int,
    target_dim: int,
    mul_scaler: float,
) -> torch.Tensor:
    """`input.view(size)` with `size[target_dim]` = `src_tensor.shape[src_dim] * mul_scaler`."""
    return input.view(_sizes(size, src_tensor, src_dim, target_dim, mul_scaler))


XLA_LIB.impl("dynamic_expand", dynamic_expand, "CompositeExplicitAutograd")
XLA_LIB.impl("dynamic_view", dynamic_view, "CompositeExplicitAutograd")


def _expand_meta(input, size, src_tensor, src_dim, target_dim):  # noqa: ANN001, ANN202
    shape = list(input.shape)
    shape[target_dim] = src_tensor.shape[src_dim]
    return input.new_empty(shape)


def _view_meta(input, size, src_tensor, src_dim, target_dim, mul_scaler):  # noqa: ANN001, ANN202
    return input.view(_sizes(size, src_tensor, src_dim, target_dim, mul_scaler))


XLA_LIB.impl("dynamic_expand", _expand_meta, "Meta")
XLA_LIB.impl("dynamic_view", _view_meta, "Meta")


# --- helpers -------------------------------------------------------------------------------------


def wrap_func_as_nn_module(f: Callable[..., Any]) -> torch.nn.Module:
    """`f` as an `nn.Module` whose `forward(*args)` calls it (for torch.export)."""

    class M(torch.nn.Module):
        def forward(self, *args: Any) -> Any:
            return f(*args)

    return M()


def _symbolic_dims(node: Any) -> list[int]:
    val = node.meta.get("val") if isinstance(node, Node) else None
    if val is None or not hasattr(val, "shape"):
        return []
    return [i for i, d in enumerate(val.shape) if not isinstance(d, int)]


def call_function(
    graph: torch.fx.Graph, target: Callable[..., Any], args: tuple = (), kwargs: dict | None = None
) -> Node:
    """A new `call_function` node in `graph` with its `meta["val"]` computed on the fake inputs."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._inductor.fx_utils import get_fake_args_kwargs

    node = graph.call_function(target, args, kwargs)
    _, fake_args, fake_kwargs = get_fake_args_kwargs(node)
    with enable_python_dispatcher():
        node.meta["val"] = target(*fake_args, **fake_kwargs)
    return node


def _size_of(graph: torch.fx.Graph, src: Node, dim: int) -> Any:
    return call_function(graph, aten.sym_size.int, (src, dim))


def _one_symbolic(node: Any, what: str) -> int | None:
    dims = _symbolic_dims(node)
    if not dims:
        return None
    if len(dims) > 1:
        raise NotImplementedError(f"{what}: only one symbolic dimension is supported, got {dims}")
    return dims[0]


# --- decompositions of norms written without `sub` (no unbounded-dynamism lowering for it) -------


def native_layer_norm_impl(input, normalized_shape, weight, bias, eps):  # noqa: ANN001, ANN201
    """Layer norm over the last dimension, in ops that take unbounded dynamic shapes."""
    mean = torch.mean(input, -1, keepdim=True)
    rstd = torch.rsqrt(torch.var(input, -1, keepdim=True, correction=0) + eps)
    return (input + mean * -1) * rstd * weight + bias


def native_group_norm_impl(input, weight, bias, N, C, HxW, group, eps):  # noqa: ANN001, ANN201, N803
    """Group norm with one channel per group (as a layer norm over the last dimension)."""
    mean = torch.mean(input, -1, keepdim=True)
    rstd = torch.rsqrt(torch.var(input, -1, keepdim=True, correction=0) + eps)
    return (input + mean * -1) * rstd * weight.unsqueeze(1) + bias.unsqueeze(1)


def native_layer_norm_pattern(x, dim, weight, bias, eps):  # noqa: ANN001, ANN201
    return aten.native_layer_norm.default(x, dim, weight, bias, eps)[0]


def native_group_norm_pattern(x, weight, bias, N, C, HxW, group, eps):  # noqa: ANN001, ANN201, N803
    return aten.native_group_norm.default(x, weight, bias, N, C, HxW, group, eps)[0]


def decompose_dynamic_native_layer_norm(gm: GraphModule) -> None:
    """`native_layer_norm(...)[0]` → `native_layer_norm_impl` (normalizing the last dim only)."""
    from torch.fx import subgraph_rewriter

    for match in subgraph_rewriter.replace_pattern_with_filters(
        gm, native_layer_norm_pattern, native_layer_norm_impl, ignore_literals=False
    ):
        for replaced in match.nodes_map.values():
            if isinstance(replaced, list) and len(replaced) != 1:
                raise NotImplementedError("layer norm over more than the last dimension")


def decompose_dynamic_native_group_norm(gm: GraphModule) -> None:
    """`native_group_norm(...)[0]` → `native_group_norm_impl`."""
    from torch.fx import subgraph_rewriter

    subgraph_rewriter.replace_pattern_with_filters(
        gm, native_group_norm_pattern, native_group_norm_impl, ignore_literals=True
    )


# --- the passes ----------------------------------------------------------------------------------


def _calls(gm: GraphModule, *targets: Any) -> list[Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]


def decompose_dynamic_shape_select(gm: GraphModule) -> None:
    """`select.int` of a tensor with a symbolic dim → `slice` of one index, then `view` without it
    (the view's symbolic size is a `sym_size` node, for `replace_dynamic_view_with_xla_op`)."""
    graph = gm.graph
    for n in _calls(gm, aten.select.int):
        src, dim, index = n.args[0], n.args[1], n.args[2]
        sym = _one_symbolic(src, "select")
        if sym is None:
            continue
        if sym == dim:
            raise NotImplementedError("select along the symbolic dimension is not supported")
        shape = src.meta["val"].shape
        index = index % shape[dim] if isinstance(index, int) and index < 0 else index
        with graph.inserting_before(n):
            sliced = call_function(graph, aten.slice, (src, dim, index, index + 1, 1))
            sizes = [
                _size_of(graph, src, d) if d == sym else s for d, s in enumerate(shape) if d != dim
            ]
            view = call_function(graph, aten.view.default, (sliced, sizes))
        n.replace_all_uses_with(view)
        graph.erase_node(n)


def decompose_split_with_sizes(gm: GraphModule) -> None:
    """`split_with_sizes` of a tensor with a symbolic dim → one `slice` per piece."""
    graph = gm.graph
    for n in _calls(gm, aten.split_with_sizes.default):
        src, sizes, dim = n.args[0], n.args[1], n.args[2]
        sym = _one_symbolic(src, "split_with_sizes")
        if sym is None:
            continue
        if sym == dim:
            raise NotImplementedError("split along the symbolic dimension is not supported")
        with graph.inserting_before(n):
            pieces, start = [], 0
            for size in sizes:
                pieces.append(
                    call_function(graph, aten.slice.Tensor, (src, dim, start, start + size))
                )
                start += size
        for user in list(n.users):
            if user.target is not operator.getitem:
                raise NotImplementedError(f"split_with_sizes used by {user.target}, not getitem")
            user.replace_all_uses_with(pieces[user.args[1]])


def flatten_embedding_indices_tensor(gm: GraphModule) -> None:
    """`embedding` with symbolic-shaped indices: flatten the indices first and reshape the
    result back (the reshapes carry the symbolic size, for `replace_dynamic_view_with_xla_op`)."""
    graph = gm.graph
    for n in _calls(gm, aten.embedding.default):
        indices = n.args[1]
        sym = _one_symbolic(indices, "embedding")
        if sym is None:
            continue
        shape = indices.meta["val"].size()
        static = 1
        for d, s in enumerate(shape):
            if d != sym:
                static *= s
        with graph.inserting_before(n):
            sym_size = _size_of(graph, indices, sym)
            restored = [sym_size if d == sym else s for d, s in enumerate(shape)]
            restored.append(n.args[0].meta["val"].size()[-1])
            flat_size = call_function(graph, operator.mul, (sym_size, static))
            flat = call_function(graph, aten.reshape, (indices, [flat_size]))
        n.args = (n.args[0], flat, *n.args[2:])
        with graph.inserting_after(n):
            back = call_function(graph, aten.reshape, (n, restored))
        n.replace_all_uses_with(back)
        back.update_arg(0, n)


def remove_no_op_slice(gm: GraphModule) -> None:
    """Drop `slice(x, dim, 0, INT64_MAX)` (the whole dimension)."""
    for n in _calls(gm, aten.slice.Tensor):
        if n.args[2] == 0 and n.args[3] == torch.iinfo(torch.int64).max:
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)


def _size_source(size: Any, what: str) -> tuple[Node, int, int]:
    """(tensor, dim, scale) of a symbolic size node `sym_size(t, dim)` or `sym_size(t, dim) * k`."""
    scale = 1
    if isinstance(size, Node) and size.target is operator.mul:
        a, b = size.args
        if isinstance(b, int):
            size, scale = a, b
        elif isinstance(a, int):
            size, scale = b, a
        else:
            raise NotImplementedError(f"{what}: a symbolic size times a symbolic size")
    if not (isinstance(size, Node) and size.target is aten.sym_size.int):
        raise NotImplementedError(f"{what}: a symbolic size not read with sym_size ({size})")
    return size.args[0], size.args[1], scale


def replace_dynamic_expand_with_xla_op(gm: GraphModule) -> None:
    """`expand` to a symbolic size → `xla.dynamic_expand`, naming the size's source tensor."""
    for n in _calls(gm, aten.expand.default):
        symbolic = [(d, s) for d, s in enumerate(n.args[1]) if not isinstance(s, int)]
        if not symbolic:
            continue
        if len(symbolic) > 1:
            raise NotImplementedError("expand to more than one symbolic dimension")
        dim, size = symbolic[0]
        src, src_dim, _ = _size_source(size, "expand")
        val = n.args[0].meta.get("val")
        if val is not None and not isinstance(val.shape[dim], int):
            if val.shape[dim] != size.meta["val"]:
                raise NotImplementedError("expanding a symbolic dimension to another symbolic size")
        n.args = (*n.args, src, src_dim, dim)
        n.target = torch.ops.xla.dynamic_expand


_VIEWS = (
    aten.reshape,
    aten.reshape.default,
    aten.view,
    aten.view.default,
    aten._unsafe_view,
    aten._unsafe_view.default,
)


def replace_dynamic_view_with_xla_op(gm: GraphModule) -> None:
    """`view`/`reshape` to a symbolic size → `xla.dynamic_view`, naming the size's source."""
    for n in _calls(gm, *_VIEWS):
        sizes = list(n.args[1])
        symbolic = [d for d, s in enumerate(sizes) if not isinstance(s, int)]
        if not symbolic:
            continue
        if len(symbolic) > 1:
            raise NotImplementedError("view to more than one symbolic dimension")
        dim = symbolic[0]
        src, src_dim, scale = _size_source(sizes[dim], "view")
        n.args = (n.args[0], sizes, src, src_dim, dim, int(scale))
        n.target = torch.ops.xla.dynamic_view


def dynamic_unsqueeze_to_view(gm: GraphModule) -> None:
    """`unsqueeze` of a tensor with a symbolic dim → `view` (its size read with `sym_size`)."""
    graph = gm.graph
    for n in _calls(gm, aten.unsqueeze.default):
        src = n.args[0]
        sym = _one_symbolic(src, "unsqueeze")
        if sym is None:
            continue
        shape = list(src.meta["val"].shape)
        with graph.inserting_before(n):
            shape[sym] = _size_of(graph, src, sym)
            at = n.args[1] % (len(shape) + 1)
            view = call_function(graph, aten.view, (src, shape[:at] + [1] + shape[at:]))
        n.replace_all_uses_with(view)
        graph.erase_node(n)


def exported_program_has_symbolic_input_shape(ep: Any) -> bool:
    """Whether any placeholder of `ep` has a symbolic dimension."""
    return any(_symbolic_dims(n) for n in ep.graph_module.graph.nodes if n.op == "placeholder")


def process_exported_program_with_symbolic_input(ep: Any) -> None:
    """All the passes above, in torch_xla's order, on `ep`'s graph module (in place)."""
    gm = ep.graph_module
    for rewrite in (
        decompose_dynamic_shape_select,
        decompose_split_with_sizes,
        remove_no_op_slice,
        decompose_dynamic_native_group_norm,
        decompose_dynamic_native_layer_norm,
        dynamic_unsqueeze_to_view,
        flatten_embedding_indices_tensor,
        replace_dynamic_expand_with_xla_op,
        replace_dynamic_view_with_xla_op,
    ):
        rewrite(gm)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
