"""StableHLO export: torch.export's ExportedProgram -> a JAX-exported StableHLO program.

# Note [StableHLO export]
`exported_program_to_stablehlo(torch.export.export(model, args))` decomposes the program to core
ATen as torch_xla does (`_run_decompositions`), then traces its graph module once on lazy
placeholders, exactly as the trace-once backend traces a dynamo graph (`dynamo.Trace`: same
lowering rules, same IR), through an FX interpreter that does what torch_xla's
`XLAExportInterpreter` does (`_ExportInterpreter`: factories build on the lazy device, a number
as an op's first Tensor operand becomes a tensor, ops of the namespaces in
`custom_ops_allowed_in_graph` become `stablehlo.custom_call`s, a custom op's kernel for the `XLA`
dispatch key is the one run, `export_node_metadata` tags locations: Note [MLIR debug info]), and
hands the traced program's pure JAX function to `jax.export`. Marked patterns become
`stablehlo.composite`s (Note [Composites]). The result is one `jax.export.Exported`: its
StableHLO (bytecode and text) is what torch_xla's `get_stablehlo_bytecode()`/
`get_stablehlo_text()` give, and its serialized form (`Exported.serialize()`) is the artifact a
process without PyTorch can run:

    jax.config.update("jax_enable_x64", True)  # torch's int64/float64 inputs keep their width
    exp = jax.export.deserialize(open("model/functions/forward.jax_exported", "rb").read())
    out = exp.call(*weights_and_inputs)

The calling convention is torch_xla's (`StableHLOFunctionMeta`): the program's inputs are the
ExportedProgram's tensor placeholders it reads, in order (parameters, buffers, lifted constants,
user inputs; see Note [Non-tensor inputs] for the others), and
`input_locations` says where each comes from (a state-dict entry by name, a constant by position,
or the caller's flattened argument by position). Constants created inside the graph (a
`torch.tensor(...)` in `forward`) are inlined (`inline_all_constant=True`, torch_xla's default)
or become extra `constants/` inputs. Outputs are the program's user outputs, unflattened with the
ExportedProgram's output spec. Shapes are static: an ExportedProgram with dynamic dimensions is
refused with a message. `save`/`load` use torch_xla's directory layout (`data/` weights as numpy,
`functions/<name>.{meta,bytecode,mlir}`, `constants/`), plus `functions/<name>.jax_exported`.

# Note [Non-tensor inputs]
torch.export specialises a program on its non-tensor inputs (an `int` dim, a `float` scale, a
`bool` flag, `None`, each item of a list of ints): their placeholders stay in the graph, unused,
and the graph's ops hold the values. As torch_xla does, the export traces the graph with those
example values and the program does not take them: `input_locations` names only tensor inputs
(and of those, only the ones the program reads), with `position` counted over all the caller's
flattened inputs, so the caller still passes every argument as to the model; the inputs left out
are listed in `unused_inputs` (a non-tensor with signature `[]` and its Python type's name,
`"int"`, `"NoneType"`). Unlike torch_xla, a call whose non-tensor argument differs from the value
baked in is refused with an error rather than silently computing the exported value's result; the
values are kept beside the program (`functions/<name>.constant_inputs.json`).
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
    # (InputLocation, VariableSignature) of each user input the program does not take: unused
    # tensors, and non-tensors (signature `[]` and the Python type's name, as torch_xla records).
    unused_inputs: list[Any] = field(default_factory=list)
    input_pytree_spec: str | None = None
    output_pytree_spec: str | None = None


@dataclass
class StableHLOFunc:
    meta: StableHLOFunctionMeta
    bytecode: bytes
    text: str | None
    exported: bytes  # jax.export's serialized form (runs without PyTorch)
    # The value each non-tensor user input (by flattened position) was exported with: the program
    # is specialised on it, so a call with another value is refused (Note [Non-tensor inputs]).
    constant_inputs: dict[int, Any] = field(default_factory=dict)


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
        unused_inputs=[(loc(a), sig(b)) for a, b in d.get("unused_inputs", [])],
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

    def _call_args(self, args: tuple, kwargs: dict, func: StableHLOFunc) -> list[Any]:
        meta = func.meta
        flat = _flat_user_inputs(args, kwargs, meta)
        for pos, baked in func.constant_inputs.items():
            if pos >= len(flat) or not _same_constant(flat[pos], baked):
                got = flat[pos] if pos < len(flat) else "nothing"
                raise ValueError(
                    f"input {pos} (flattened) of {meta.name!r} was exported as the constant "
                    f"{baked!r} and is baked into the program, but the call gives {got!r}: export "
                    "again with this value (or pass it as a tensor to keep it an input)"
                )
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

    def evaluate(self, method_name: str, args: Any, kwargs: dict | None = None) -> Any:
        """Run `method_name` on `args` (the model's own arguments) through JAX."""
        kwargs = kwargs or {}
        func = self._funcs[method_name]
        exp = self._exported.get(method_name)
        if exp is None:
            exp = self._exported[method_name] = jax.export.deserialize(bytearray(func.exported))
        lazy = any(
            isinstance(a, torch.Tensor) and a.device.type == DEVICE_TYPE
            for a in pytree.tree_leaves((args, kwargs))
        )
        res = [_torch(r) for r in exp.call(*self._call_args(tuple(args), kwargs, func))]
        if lazy:
            from .api import device

            res = [r.to(device()) for r in res]
        if func.meta.output_pytree_spec is not None:
            return pytree.tree_unflatten(res, pytree.treespec_loads(func.meta.output_pytree_spec))
        return res

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.evaluate(self._default_method, args, kwargs)

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
        if func.constant_inputs:
            with open(os.path.join(fdir, name + ".constant_inputs.json"), "w") as f:
                json.dump({str(k): v for k, v in func.constant_inputs.items()}, f)
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
        constant_inputs = {}
        if os.path.exists(stem + ".constant_inputs.json"):
            with open(stem + ".constant_inputs.json") as f:
                constant_inputs = {int(k): v for k, v in json.load(f).items()}
        funcs.append(StableHLOFunc(meta, bytecode, text, exported, constant_inputs))
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


class _ExportInterpreter(torch.fx.Interpreter):
    """Runs the exported graph on lazy tensors as torch_xla's `XLAExportInterpreter` does: ops
    that create tensors (`device=` in the graph is the export-time device, usually `cpu`) create
    them on the lazy device, and a Python number given as an op's first operand where its schema
    takes a Tensor becomes a tensor (the graph holds `aten.sub.Tensor(1.0, x)` after decomposing
    `1.0 - x`)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        device: torch.device,
        node_metadata: Any = None,
        custom_ops: set[str] = frozenset(),
    ) -> None:
        super().__init__(gm)
        self._device = device
        self._serializer = node_metadata  # a GraphModuleSerializer: Note [MLIR debug info]
        self._custom_ops = custom_ops

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "call_function" and getattr(n.target, "namespace", None) in self._custom_ops:
            res = self._custom_call(n)
        else:
            res = super().run_node(n)
        if self._serializer is not None and n.op == "call_function":
            from .mlir_debuginfo import tag_outputs

            res = tag_outputs(res, json.dumps(self._serializer.serialize_metadata(n)))
        return res

    def _custom_call(self, n: torch.fx.Node) -> Any:
        """An op of a namespace in `custom_ops_allowed_in_graph`: a `stablehlo.custom_call` named
        after it (torch_xla's export option), shapes and dtypes from torch.export's metadata."""
        from .custom_call import extract_custom_call_outputs_shape_dtype, stablehlo_custom_call

        args, kwargs = self.fetch_args_kwargs_from_env(n)
        if kwargs:
            raise NotImplementedError(
                f"exporting {n.target} as a custom call: keyword arguments ({sorted(kwargs)}) "
                "have no place in a custom call; pass them positionally"
            )
        shapes, dtypes = extract_custom_call_outputs_shape_dtype(n)
        return stablehlo_custom_call(list(args), str(n.target), shapes, dtypes)

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if _has_xla_kernel(target):
            # A kernel registered for torch_xla's `XLA` key (`torch.library.impl(..., "XLA")`,
            # e.g. one emitting a stablehlo_custom_call) is what torch_xla's export runs.
            keyset = torch._C.DispatchKeySet(torch._C.DispatchKey.XLA)
            return target.redispatch(keyset, *args, **kwargs)
        if "device" in kwargs:
            kwargs = {**kwargs, "device": self._device}
        schema = getattr(target, "_schema", None)
        if (
            schema is not None
            and args
            and isinstance(args[0], (bool, int, float))
            and schema.arguments
            and isinstance(schema.arguments[0].type, torch.TensorType)
        ):
            args = (self._number_tensor(args[0], args[1:]), *args[1:])
        return super().call_function(target, args, kwargs)

    def _number_tensor(self, a: bool | int | float, rest: tuple) -> torch.Tensor:
        """A Python number as an op's first (Tensor) operand, which the decompositions write
        (`sub.Tensor(1.0, x)` for `1.0 - x`): a 0-d constant of the dtype eager computes in (a
        "wrapped number" takes the other operand's dtype when of its kind; a float beside no
        tensor has the default dtype, as torch_xla wraps it). Numbers in later positions stay
        scalars, so 0 and 1 stay inlined as torch_xla inlines them."""
        tensors = [t for t in rest if isinstance(t, torch.Tensor)]
        others = [t for t in tensors if t.dtype != torch.bool] or tensors
        dtype = torch.result_type(others[0], a) if others else None
        return torch.full((), a, dtype=dtype, device=self._device)

    def __call__(self, *args: Any) -> Any:
        return self.run(*args, enable_io_processing=False)


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _has_xla_kernel(target: Any) -> bool:
    """Whether `target` is an op with a kernel of its own for the XLA dispatch key and none for
    lazyxla's (a user's custom op written for torch_xla)."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace == "aten":
        return False
    name = target.name()
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        name, "XLA"
    ) and not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")


def _encode_constant(v: Any) -> Any:
    """A non-tensor input's value as JSON (for `functions/<name>.constant_inputs.json`)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return {"dtype": str(v)}
    return {"repr": repr(v)}


def _same_constant(got: Any, baked: Any) -> bool:
    if isinstance(baked, dict):
        key, text = next(iter(baked.items()))
        return (str(got) if key == "dtype" else repr(got)) == text
    if isinstance(baked, float) and isinstance(got, float) and baked != baked:
        return got != got  # NaN
    return type(got) is type(baked) and got == baked


def _flat_user_inputs(args: tuple, kwargs: dict, meta: StableHLOFunctionMeta) -> list[Any]:
    """The caller's arguments flattened as the ExportedProgram flattened its example inputs."""
    if meta.input_pytree_spec is None:
        if kwargs:
            raise TypeError("this exported program takes no keyword arguments")
        return list(args)
    spec = pytree.treespec_loads(meta.input_pytree_spec)
    # torch.export's in_spec is ((args...), {kwargs}); older programs flatten args alone
    both = (
        spec.type is tuple
        and spec.num_children == 2
        and spec.child(0).type is tuple
        and spec.child(1).type is dict
    )
    tree = (tuple(args), dict(kwargs)) if both else tuple(args)
    if kwargs and not both:
        raise TypeError("this exported program takes no keyword arguments")
    leaves, got = pytree.tree_flatten(tree)
    if got != spec:
        if both and set(kwargs) == set(spec.child(1).context):
            # same keywords in another order: put them in the exported order
            ordered = {k: kwargs[k] for k in spec.child(1).context}
            leaves, got = pytree.tree_flatten((tuple(args), ordered))
        if got != spec:
            raise TypeError(
                "the arguments do not have the structure the program was exported with: expected "
                f"{spec}, got {got}; call it with arguments shaped like the export's example inputs"
            )
    return leaves


def _run_decompositions(exported_model: Any) -> Any:
    """The program in core ATen, as torch_xla's exporter decomposes it before tracing: torch's
    default decompositions, plus `grid_sampler_2d`, and `_safe_softmax` as `softmax`."""
    from torch._decomp import get_decompositions

    table = torch.export.default_decompositions()
    table.update(get_decompositions([torch.ops.aten.grid_sampler_2d]))
    table[torch.ops.aten._safe_softmax.default] = torch.softmax
    return exported_model.run_decompositions(table)


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
    ep = _run_decompositions(exported_model)
    gm = ep.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val") for n in placeholders]
    for n, v in zip(placeholders, vals):
        dynamic = isinstance(v, _SYMBOLIC) or (
            isinstance(v, torch.Tensor) and any(not isinstance(d, int) for d in v.shape)
        )
        if dynamic:
            what = f"shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else f"value {v}"
            raise NotImplementedError(
                f"exported_program_to_stablehlo: input {n.name} has dynamic {what}; lazyxla "
                "exports static shapes (its IR records each op at fixed sizes, so the unbounded "
                "dynamism torch_xla exports is not expressible: Note [Unbounded dynamism]): "
                "export without dynamic_shapes"
            )
    locs, state_dict, lifted = _placeholder_locations(ep)
    dev = api.device()
    # Non-tensor inputs (ints, floats, bools, None, the items of a list of ints) are constants the
    # graph already holds (torch.export specialises on them): traced with their example value,
    # they are no input of the program. See Note [Non-tensor inputs].
    args = [
        torch.zeros(v.shape, dtype=v.dtype, device=dev) if isinstance(v, torch.Tensor) else v
        for v in vals
    ]
    serializer = None
    if options.export_node_metadata:
        from torch._export.serde.serialize import GraphModuleSerializer

        serializer = GraphModuleSerializer(ep.graph_signature, ep.module_call_graph)
    interpreter = _ExportInterpreter(gm, dev, serializer, set(options.custom_ops_allowed_in_graph))
    trace = Trace(interpreter, args)
    n_mut = len(
        [s for s in ep.graph_signature.output_specs if s.kind.name != "USER_OUTPUT"]
    )  # mutated buffers come first in the graph's outputs
    user_plan = trace.out_plan[n_mut:]
    # The program's inputs: the tensor placeholders the traced graph reads or returns.
    read_args = {leaf.arg for leaf in trace.leaves if leaf.kind == "arg"}
    read_args |= {v for kind, v in user_plan if kind == "arg"}
    used = [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor) and i in read_args]
    slot = {arg: k for k, arg in enumerate(used)}
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
        it = iter(inputs[len(used) :]) if not options.inline_all_constant else iter(consts)
        for leaf in trace.leaves:
            feed.append(inputs[slot[leaf.arg]] if leaf.kind == "arg" else next(it))
        outs = body(feed, [])
        result = []
        for kind, v in user_plan:
            if kind == "out":
                result.append(outs[v])
            elif kind == "arg":
                result.append(inputs[slot[v]])
            else:
                raise NotImplementedError(
                    f"exported_program_to_stablehlo: the program returns a Python value ({v!r})"
                )
        return result

    in_structs = [
        jax.ShapeDtypeStruct(tuple(vals[i].shape), jnp_dtype(vals[i].dtype)) for i in used
    ]
    in_structs += [jax.ShapeDtypeStruct(c.shape, c.dtype) for c in extra]
    # A program with the user's own custom calls (stablehlo_custom_call, custom_ops_allowed_in_
    # graph) is what the user asked for: jax.export refuses targets it cannot vouch for otherwise.
    targets = {
        dict(st[4])["target"]
        for st in trace.program.steps
        if len(st) > 6 and st[6] == "xla::custom_call"
    }
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in sorted(targets)]
    exp = jax.export.export(jax.jit(fn), disabled_checks=checks)(*in_structs)
    input_locations = [locs[i] for i in used] + [
        InputLocation.constant(len(lifted) + i) for i in range(len(extra))
    ]
    # torch_xla lists the user inputs the program does not take, with the type of non-tensors.
    unused_inputs: list[Any] = []
    constant_inputs: dict[int, Any] = {}
    for i, v in enumerate(vals):
        if locs[i].type_ is not VariableType.INPUT_ARG or i in slot:
            continue
        if isinstance(v, torch.Tensor):
            sig = VariableSignature(list(v.shape), str(v.dtype).replace("torch.", ""))
        else:
            sig = VariableSignature([], type(v).__name__)
            constant_inputs[locs[i].position] = _encode_constant(v)
        unused_inputs.append((locs[i], sig))
    meta = StableHLOFunctionMeta(
        name="forward",
        stablehlo_version=str(jax.export.maximum_supported_calling_convention_version),
        input_signature=[_sig(s.shape, s.dtype) for s in in_structs],
        output_signature=[_sig(a.shape, a.dtype) for a in exp.out_avals],
        input_locations=input_locations,
        unused_inputs=unused_inputs,
        input_pytree_spec=pytree.treespec_dumps(ep.call_spec.in_spec)
        if ep.call_spec.in_spec is not None
        else None,
        output_pytree_spec=pytree.treespec_dumps(ep.call_spec.out_spec)
        if ep.call_spec.out_spec is not None
        else None,
    )
    text = exp.mlir_module() if options.include_human_readable_text else None
    if text is not None and "XLA_MLIR_DEBUGINFO_BEGIN" in text:
        from .mlir_debuginfo import debuginfo_text

        text = debuginfo_text(text)
    func = StableHLOFunc(
        meta, bytes(exp.mlir_module_serialized), text, bytes(exp.serialize()), constant_inputs
    )
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
