"""StableHLO export: torch.export's ExportedProgram -> a JAX-exported StableHLO program.

# Note [StableHLO export]
`exported_program_to_stablehlo(torch.export.export(model, args))` traces the program's graph
module once on lazy placeholders, exactly as the trace-once backend traces a dynamo graph
(`dynamo.Trace`: same lowering rules, same IR), and hands the traced program's pure JAX function
to `jax.export`. The result is one `jax.export.Exported`: its StableHLO (bytecode and text) is
what torch_xla's `get_stablehlo_bytecode()`/`get_stablehlo_text()` give, and its serialized form
(`Exported.serialize()`) is the artifact a process without PyTorch can run:

    jax.config.update("jax_enable_x64", True)  # torch's int64/float64 inputs keep their width
    exp = jax.export.deserialize(open("model/functions/forward.jax_exported", "rb").read())
    out = exp.call(*weights_and_inputs)

The calling convention is torch_xla's (`StableHLOFunctionMeta`): the program's inputs are the
ExportedProgram's placeholders in order (parameters, buffers, lifted constants, user inputs), and
`input_locations` says where each comes from (a state-dict entry by name, a constant by position,
or the caller's flattened argument by position). Constants created inside the graph (a
`torch.tensor(...)` in `forward`) are inlined (`inline_all_constant=True`, torch_xla's default)
or become extra `constants/` inputs. Outputs are the program's user outputs, unflattened with the
ExportedProgram's output spec. Shapes are static: an ExportedProgram with dynamic dimensions is
refused with a message. `save`/`load` use torch_xla's directory layout (`data/` weights as numpy,
`functions/<name>.{meta,bytecode,mlir}`, `constants/`), plus `functions/<name>.jax_exported`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree

from .tensor import DEVICE_TYPE


@dataclass
class StableHLOExportOptions:
    """torch_xla's export options (those that change lazyxla's export are documented here)."""

    include_human_readable_text: bool = True
    override_tracing_arguments: tuple[Any] | None = None
    override_tracing_kwargs: Mapping[str, Any] | None = None
    save_weights: bool = True
    # Constants made inside the graph: inlined in the StableHLO, or extra inputs (constants/).
    inline_all_constant: bool = True
    export_weights: bool = True
    custom_ops_allowed_in_graph: set[str] = field(default_factory=set)
    export_node_metadata: bool = False


class VariableType(enum.Enum):
    INPUT_ARG = "input_arg"
    PARAMETER = "parameter"
    CONSTANT = "constant"


@dataclass
class VariableSignature:
    shape: list[int]
    dtype: str
    dynamic_dims: list[int] = field(default_factory=list)


@dataclass
class InputLocation:
    type_: VariableType
    position: int = -1
    name: str = ""

    @classmethod
    def parameter(cls, name: str) -> InputLocation:
        return cls(type_=VariableType.PARAMETER, name=name)

    @classmethod
    def input_arg(cls, position: int) -> InputLocation:
        return cls(type_=VariableType.INPUT_ARG, position=position)

    @classmethod
    def constant(cls, position: int) -> InputLocation:
        return cls(type_=VariableType.CONSTANT, position=position)


@dataclass
class StableHLOFunctionMeta:
    name: str
    stablehlo_version: str
    input_signature: list[VariableSignature]
    output_signature: list[VariableSignature]
    input_locations: list[InputLocation]
    unused_inputs: list[Any] = field(default_factory=list)
    input_pytree_spec: str | None = None
    output_pytree_spec: str | None = None


@dataclass
class StableHLOFunc:
    meta: StableHLOFunctionMeta
    bytecode: bytes
    text: str | None
    exported: bytes  # jax.export's serialized form (runs without PyTorch)


@dataclass
class StableHLOModelBundle:
    state_dict: dict[str, Any]
    additional_constants: list[np.ndarray]
    stablehlo_funcs: list[StableHLOFunc]


class _JSON(json.JSONEncoder):
    def default(self, o: Any) -> Any:
        if dataclasses.is_dataclass(o):
            return dataclasses.asdict(o)
        if isinstance(o, enum.Enum):
            return o.value
        return super().default(o)


def _meta_from_json(d: dict) -> StableHLOFunctionMeta:
    def sig(x: dict) -> VariableSignature:
        return VariableSignature(**x)

    def loc(x: dict) -> InputLocation:
        return InputLocation(VariableType(x["type_"]), x["position"], x["name"])

    return StableHLOFunctionMeta(
        name=d["name"],
        stablehlo_version=d["stablehlo_version"],
        input_signature=[sig(x) for x in d["input_signature"]],
        output_signature=[sig(x) for x in d["output_signature"]],
        input_locations=[loc(x) for x in d["input_locations"]],
        unused_inputs=d.get("unused_inputs", []),
        input_pytree_spec=d.get("input_pytree_spec"),
        output_pytree_spec=d.get("output_pytree_spec"),
    )


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _torch(a: Any) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _sig(shape: Any, dtype: Any) -> VariableSignature:
    return VariableSignature(list(shape), str(np.dtype(dtype)))


class StableHLOGraphModule:
    """A program exported to StableHLO, callable like the model it came from."""

    def __init__(self, bundle: StableHLOModelBundle) -> None:
        self._bundle = bundle
        self._funcs = {f.meta.name: f for f in bundle.stablehlo_funcs}
        self._default_method = bundle.stablehlo_funcs[0].meta.name
        self._exported: dict[str, Any] = {}

    def _call_args(self, args: Any, meta: StableHLOFunctionMeta) -> list[Any]:
        flat = pytree.tree_flatten(args)[0] if meta.input_pytree_spec is not None else list(args)
        out = []
        for loc in meta.input_locations:
            if loc.type_ is VariableType.PARAMETER:
                if loc.name not in self._bundle.state_dict:
                    raise ValueError(
                        f"the program needs weight {loc.name!r}, which was not saved "
                        "(save_weights=False): put it in the bundle's state_dict before calling"
                    )
                out.append(self._bundle.state_dict[loc.name])
            elif loc.type_ is VariableType.CONSTANT:
                out.append(self._bundle.additional_constants[loc.position])
            else:
                a = flat[loc.position]
                out.append(_np(a) if isinstance(a, torch.Tensor) else a)
        return out

    def evaluate(self, method_name: str, args: Any) -> Any:
        """Run `method_name` on `args` (the model's own arguments) through JAX."""
        func = self._funcs[method_name]
        exp = self._exported.get(method_name)
        if exp is None:
            exp = self._exported[method_name] = jax.export.deserialize(bytearray(func.exported))
        lazy = any(
            isinstance(a, torch.Tensor) and a.device.type == DEVICE_TYPE
            for a in pytree.tree_leaves(args)
        )
        res = [_torch(r) for r in exp.call(*self._call_args(args, func.meta))]
        if lazy:
            from .api import device

            res = [r.to(device()) for r in res]
        if func.meta.output_pytree_spec is not None:
            return pytree.tree_unflatten(res, pytree.treespec_loads(func.meta.output_pytree_spec))
        return res

    def __call__(self, *args: Any) -> Any:
        return self.evaluate(self._default_method, args)

    def get_stablehlo_bytecode(self, method_name: str | None = None) -> bytes:
        return self._funcs[method_name or self._default_method].bytecode

    def get_stablehlo_text(self, method_name: str | None = None) -> str:
        func = self._funcs[method_name or self._default_method]
        if func.text is None:
            exp = jax.export.deserialize(bytearray(func.exported))
            return exp.mlir_module()
        return func.text

    def get_jax_exported(self, method_name: str | None = None) -> bytes:
        """`jax.export`'s serialized program (`jax.export.deserialize(...).call(*inputs)`)."""
        return self._funcs[method_name or self._default_method].exported

    def save(self, directory_path: os.PathLike, options: StableHLOExportOptions | None = None):
        _save_bundle(self._bundle, directory_path, options)

    @classmethod
    def load(cls, directory_path: os.PathLike) -> StableHLOGraphModule:
        return cls(_load_bundle(directory_path))


def _save_bundle(bundle: StableHLOModelBundle, path: os.PathLike, options: Any) -> None:
    options = options or StableHLOExportOptions()
    if options.save_weights:
        os.makedirs(os.path.join(path, "data"), exist_ok=True)
        for key, val in bundle.state_dict.items():
            with open(os.path.join(path, "data", key), "wb") as f:
                np.save(f, val)
    fdir = os.path.join(path, "functions")
    os.makedirs(fdir, exist_ok=True)
    for func in bundle.stablehlo_funcs:
        name = func.meta.name
        with open(os.path.join(fdir, name + ".meta"), "w") as f:
            json.dump(func.meta, f, cls=_JSON)
        with open(os.path.join(fdir, name + ".bytecode"), "wb") as f:
            f.write(func.bytecode)
        with open(os.path.join(fdir, name + ".jax_exported"), "wb") as f:
            f.write(func.exported)
        if func.text is not None:
            with open(os.path.join(fdir, name + ".mlir"), "w") as f:
                f.write(func.text)
    cdir = os.path.join(path, "constants")
    os.makedirs(cdir, exist_ok=True)
    for i, c in enumerate(bundle.additional_constants):
        with open(os.path.join(cdir, str(i)), "wb") as f:
            np.save(f, c)


def _load_bundle(path: os.PathLike) -> StableHLOModelBundle:
    state_dict = {}
    ddir = os.path.join(path, "data")
    if os.path.isdir(ddir):
        for name in os.listdir(ddir):
            state_dict[name] = np.load(os.path.join(ddir, name), allow_pickle=False)
    cdir = os.path.join(path, "constants")
    consts = sorted(
        (int(n), np.load(os.path.join(cdir, n), allow_pickle=False)) for n in os.listdir(cdir)
    )
    fdir = os.path.join(path, "functions")
    funcs = []
    for name in sorted(os.listdir(fdir)):
        if not name.endswith(".meta"):
            continue
        stem = os.path.join(fdir, name[: -len(".meta")])
        with open(stem + ".meta") as f:
            meta = _meta_from_json(json.load(f))
        with open(stem + ".bytecode", "rb") as f:
            bytecode = f.read()
        with open(stem + ".jax_exported", "rb") as f:
            exported = f.read()
        text = None
        if os.path.exists(stem + ".mlir"):
            with open(stem + ".mlir") as f:
                text = f.read()
        funcs.append(StableHLOFunc(meta, bytecode, text, exported))
    if not funcs:
        raise FileNotFoundError(f"{path} holds no exported StableHLO function (functions/*.meta)")
    return StableHLOModelBundle(state_dict, [v for _, v in consts], funcs)


def _placeholder_locations(ep: Any) -> tuple[list[InputLocation], dict[str, Any], list[Any]]:
    """Where each placeholder of `ep.graph_module` comes from, the weights, the lifted consts."""
    from torch.export.graph_signature import InputKind

    locs: list[InputLocation] = []
    state: dict[str, Any] = {}
    consts: list[Any] = []
    user = 0
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            value = ep.state_dict.get(spec.target)
            if value is None:  # a non-persistent buffer
                value = ep.constants[spec.target]
            state[spec.target] = value
            locs.append(InputLocation.parameter(spec.target))
        elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            consts.append(ep.constants[spec.target])
            locs.append(InputLocation.constant(len(consts) - 1))
        elif spec.kind == InputKind.USER_INPUT:
            locs.append(InputLocation.input_arg(user))
            user += 1
        else:
            raise NotImplementedError(f"exporting a program with a {spec.kind} input")
    return locs, state, consts


def exported_program_to_stablehlo(
    exported_model: Any, options: StableHLOExportOptions | None = None
) -> StableHLOGraphModule:
    """A `torch.export` ExportedProgram as a callable backed by StableHLO (Note [StableHLO
    export]).

    Example:
        >>> ep = torch.export.export(model, (x,))
        >>> shlo = exported_program_to_stablehlo(ep)
        >>> torch.testing.assert_close(shlo(x), model(x))
        >>> print(shlo.get_stablehlo_text())
    """
    from . import api
    from .dynamo import Trace
    from .runtime import jnp_dtype

    options = options or StableHLOExportOptions()
    ep = exported_model
    gm = ep.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val") for n in placeholders]
    for n, v in zip(placeholders, vals):
        if not isinstance(v, torch.Tensor):
            raise NotImplementedError(
                f"exported_program_to_stablehlo: input {n.name} is not a tensor ({v!r}); export "
                "with tensor inputs only"
            )
        if any(not isinstance(d, int) for d in v.shape):
            raise NotImplementedError(
                f"exported_program_to_stablehlo: input {n.name} has dynamic shape "
                f"{tuple(v.shape)}; lazyxla exports static shapes: export without dynamic_shapes"
            )
    locs, state_dict, lifted = _placeholder_locations(ep)
    dev = api.device()
    args = [torch.zeros(v.shape, dtype=v.dtype, device=dev) for v in vals]
    trace = Trace(gm, args)
    n_mut = len(
        [s for s in ep.graph_signature.output_specs if s.kind.name != "USER_OUTPUT"]
    )  # mutated buffers come first in the graph's outputs
    body = trace.program.function()
    consts = [
        np.asarray(leaf.node.data, dtype=jnp_dtype(leaf.node.specs[0].dtype))
        for leaf in trace.leaves
        if leaf.kind != "arg"
    ]
    extra: list[np.ndarray] = []
    if not options.inline_all_constant:
        extra = consts

    def fn(*inputs: Any) -> list[Any]:
        feed = []
        it = iter(inputs[len(args) :]) if not options.inline_all_constant else iter(consts)
        for leaf in trace.leaves:
            feed.append(inputs[leaf.arg] if leaf.kind == "arg" else next(it))
        outs = body(feed, [])
        result = []
        for kind, v in trace.out_plan[n_mut:]:
            if kind == "out":
                result.append(outs[v])
            elif kind == "arg":
                result.append(inputs[v])
            else:
                raise NotImplementedError(
                    f"exported_program_to_stablehlo: the program returns a Python value ({v!r})"
                )
        return result

    in_structs = [jax.ShapeDtypeStruct(tuple(v.shape), jnp_dtype(v.dtype)) for v in vals]
    in_structs += [jax.ShapeDtypeStruct(c.shape, c.dtype) for c in extra]
    exp = jax.export.export(jax.jit(fn))(*in_structs)
    input_locations = list(locs) + [
        InputLocation.constant(len(lifted) + i) for i in range(len(extra))
    ]
    meta = StableHLOFunctionMeta(
        name="forward",
        stablehlo_version=str(jax.export.maximum_supported_calling_convention_version),
        input_signature=[_sig(s.shape, s.dtype) for s in in_structs],
        output_signature=[_sig(a.shape, a.dtype) for a in exp.out_avals],
        input_locations=input_locations,
        input_pytree_spec=pytree.treespec_dumps(ep.call_spec.in_spec)
        if ep.call_spec.in_spec is not None
        else None,
        output_pytree_spec=pytree.treespec_dumps(ep.call_spec.out_spec)
        if ep.call_spec.out_spec is not None
        else None,
    )
    text = exp.mlir_module() if options.include_human_readable_text else None
    func = StableHLOFunc(meta, bytes(exp.mlir_module_serialized), text, bytes(exp.serialize()))
    weights = {k: _np(v) for k, v in state_dict.items()} if options.export_weights else {}
    constants = [_np(c) if isinstance(c, torch.Tensor) else np.asarray(c) for c in lifted]
    return StableHLOGraphModule(StableHLOModelBundle(weights, constants + extra, [func]))


def save_as_stablehlo(
    exported_model: Any, stablehlo_dir: os.PathLike, options: StableHLOExportOptions | None = None
) -> None:
    """Export `exported_model` (a torch.export ExportedProgram) and save it to `stablehlo_dir`
    (load it back with `StableHLOGraphModule.load`)."""
    options = options or StableHLOExportOptions()
    exported_program_to_stablehlo(exported_model, options).save(stablehlo_dir, options)


def save_torch_model_as_stablehlo(
    torchmodel: torch.nn.Module,
    args: tuple[Any, ...],
    path: os.PathLike,
    options: StableHLOExportOptions | None = None,
) -> None:
    """`torch.export.export(torchmodel, args)` saved as StableHLO to `path`."""
    save_as_stablehlo(torch.export.export(torchmodel, tuple(args)), path, options)
