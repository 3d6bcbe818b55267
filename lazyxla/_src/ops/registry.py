"""The lowering registry: aten OpOverload → a pure jnp/lax rule.

A rule receives the op's arguments in schema order: tensors as `jax.Array`s, everything else as
Python
statics (lifted scalars arrive as 0-d arrays). It returns an array or a tuple/list of arrays;
outputs are
cast to the dtypes PyTorch's meta kernels computed at record time. Registering an op twice is an
error
naming the first site.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from torch._ops import OpOverload, OpOverloadPacket


@dataclasses.dataclass(frozen=True)
class Lowering:
    op: OpOverload
    rule: Callable[..., Any]
    # Scalar arguments that shape the program (arange's bounds): baked in, not lifted to inputs.
    static: frozenset[str]
    # Float arguments lifted to graph inputs although their schema type is `float` (an optimizer's
    # lr).
    lift: frozenset[str]
    # Needs the RNG: the rule gets a `key` keyword argument (a jax PRNG key).
    random: bool
    site: str


LOWERINGS: dict[OpOverload, Lowering] = {}

# Note [Opmath]
# ~~~~~~~~~~~~~
# PyTorch computes bf16/fp16 math in float32 ("opmath") and rounds each op's output once. A rule
# written in jnp would instead round every intermediate (a cumsum's running sum, a floor_divide's
# quotient before the floor) to bf16, and drift from eager by many ulps. So the rules of the
# families that compute (the modules below) get their bf16/fp16 array arguments as float32; the
# interpreter casts the outputs to the recorded dtypes (lower.py). Data movement (views, indexing,
# creation) is exact in any dtype and keeps its dtype; matmuls accumulate in float32 through
# `preferred_element_type` (no upcast of their inputs, so TPUs keep their bf16 units); a rule that
# depends on its input's own dtype (nextafter's ulp, rms_norm's default eps) opts out with
# `opmath=False`. The explicit f32 -> bf16 -> f32 converts between two ops stay in the compiled
# program (xla_allow_excess_precision only elides converts XLA inserted itself), so every op's
# output is rounded once, where eager rounds it (tests/ops/test_ops_elementwise.py, bf16 chains).
_OPMATH_MODULES = frozenset(
    f"lazyxla._src.ops.{m}"
    for m in (
        "elementwise",
        "reduction",
        "special_functions",
        "activations",
        "ordering",
        "fft",
        "losses",
        "nn",
        "pooling",
        "decompositions",
        "distances",
        "foreach",
        "rnn",
    )
)
_LOW = (jnp.bfloat16, jnp.float16)


def to_opmath(v: Any) -> Any:
    """`v` (an array, or a tuple/list of them) with bf16/fp16 arrays as float32."""
    if isinstance(v, (tuple, list)):
        return type(v)(to_opmath(x) for x in v)
    return v.astype(jnp.float32) if getattr(v, "dtype", None) in _LOW else v


def with_opmath(rule: Callable[..., Any]) -> Callable[..., Any]:
    """`rule` with its bf16/fp16 array arguments upcast to float32 (Note [Opmath])."""

    @functools.wraps(rule)
    def run(*args: Any, **kwargs: Any) -> Any:
        return rule(*map(to_opmath, args), **{k: to_opmath(v) for k, v in kwargs.items()})

    return run


# Note [Integer inputs, floating results]
# An op that computes a floating result from integer or bool inputs (`sin(int_tensor)`,
# `int_tensor / 3`, `clamp(int_tensor, 0.5, 2.5)`) computes in its *result's* dtype, as eager
# does: float32 by default, float64 after `torch.set_default_dtype(torch.float64)`. The result
# dtype is PyTorch's, recorded on the node; the interpreter (lower.py) makes it readable to the
# rule it is running through `out_dtype()`. (A rule that computed ints in float32 regardless gave
# float64 results with float32 precision, and clamp cast float bounds to the integer dtype: 2.5 to
# 2.)
_out_dtypes: list[tuple] = [()]


def out_dtype(i: int = 0) -> Any:
    """The jnp dtype of output `i` of the node whose rule is running (Note [Integer inputs,
    floating results]); None outside the interpreter."""
    dts = _out_dtypes[0]
    return dts[i] if i < len(dts) else None


def floating_result(x: Any) -> Any:
    """`x`, an integer or bool array cast to the node's floating result dtype (float32 when the
    result is not floating); floating arrays unchanged."""
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    dt = out_dtype()
    return x.astype(dt if dt is not None and jnp.issubdtype(dt, jnp.floating) else jnp.float32)


# Note [Booleans times a value]
# XLA's algebraic simplifier rewrites `convert(pred) * x` as `select(pred, x, 0)`. For an x of
# inf or NaN that gives 0 where IEEE (and eager: `mask.float() * x`, `bool_tensor * x`) gives NaN,
# and +0.0 where eager gives -0.0 for a negative x: masking a tensor that holds -inf hid the NaN
# eager shows. A bool is therefore converted to a floating dtype as `select(pred, 1, 0)`, which
# the simplifier leaves alone, so the product is IEEE's.


def bool_to(x: Any, dt: Any) -> Any:
    """`x.astype(dt)`, with a bool `x` converted to a float or complex `dt` as a select (Note
    [Booleans times a value])."""
    if x.dtype == jnp.bool_ and jnp.issubdtype(dt, jnp.inexact):
        return jnp.where(x, jnp.ones((), dt), jnp.zeros((), dt))
    return x.astype(dt)


def float_operand(x: Any) -> Any:
    """Reduced-precision floats computed in float32 (PyTorch's opmath); ints promoted to the
    result's float dtype (Note [Integer inputs, floating results])."""
    if x.dtype in _LOW:
        return x.astype(jnp.float32)
    return floating_result(x)


def wrap_dim(dim: int, n: int) -> int:
    """A possibly negative dim of an `n`-dimensional array, as a non-negative one."""
    return dim + n if dim < 0 else dim


def axis_of(x: Any, dim: int) -> int:
    """`dim` of array `x` as a non-negative axis (0 for a 0-d array, as PyTorch accepts)."""
    return wrap_dim(dim, x.ndim) if x.ndim else 0


def is_const(v: Any, c: float) -> bool:
    """True if `v` is the Python number `c` (lifted scalars arrive traced: never constants)."""
    return type(v) in (int, float, bool) and v == c


def _overloads(op: OpOverload | OpOverloadPacket) -> list[OpOverload]:
    if isinstance(op, OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def lowering(
    *ops: OpOverload | OpOverloadPacket,
    static: tuple[str, ...] = (),
    lift: tuple[str, ...] = (),
    random: bool = False,
    opmath: bool | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `rule` as the lowering of `ops` (a packet registers all its overloads).
    `opmath`: see Note [Opmath] (None: by the rule's module)."""

    def deco(rule: Callable[..., Any]) -> Callable[..., Any]:
        # (from the code object: `inspect.getsourcelines` read and tokenized each module, ~0.5 s
        # of lazyxla's import)
        code = inspect.unwrap(rule).__code__
        site = f"{code.co_filename}:{code.co_firstlineno}"
        for packet in ops:
            for op in _overloads(packet):
                register(
                    op, rule, static=static, lift=lift, random=random, site=site, opmath=opmath
                )
        return rule

    return deco


def register(
    op: OpOverload,
    rule: Callable[..., Any],
    *,
    static: tuple[str, ...] = (),
    lift: tuple[str, ...] = (),
    random: bool = False,
    site: str = "<table>",
    opmath: bool | None = None,
) -> None:
    if op in LOWERINGS:
        raise RuntimeError(f"{op} already has a lowering, registered at {LOWERINGS[op].site}")
    if opmath if opmath is not None else rule.__module__ in _OPMATH_MODULES:
        rule = with_opmath(rule)
    LOWERINGS[op] = Lowering(op, rule, frozenset(static), frozenset(lift), random, site)
