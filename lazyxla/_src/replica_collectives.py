"""torch_xla's collectives of `xm` (`all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all`,
`collective_broadcast`, `collective_permute`, ...), split from xla_model.py, which re-exports them.

Each runs where it is called: inside an SPMD manual region over mesh axes (manual.py), on a
DataParallel replica thread over the threads (Note [DataParallel replicas], `all_reduce` only),
across the processes of one job (Note [Cross-process collectives] in collectives.py), else over
one replica, where a reduction is the input (times `scale`), a gather or scatter over one shard is
the input, and a permutation keeps the value (pair `(0, 0)`) or, as XLA's collective-permute does
for a device nobody sends to, gives zeros.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from . import collectives, manual, runtime_api

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"
_REDUCE_TYPES = (REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, REDUCE_MIN, REDUCE_MAX)


def _refuse_in_replica(name: str) -> None:
    from . import data_parallel

    if data_parallel.current() is not None:
        raise NotImplementedError(
            f"xm.{name} inside a DataParallel replica: lazyxla's thread replicas reduce with "
            "xm.all_reduce / xm.reduce_gradients / xm.optimizer_step only (Note [DataParallel "
            "replicas]); for other collectives run one process per device (torch_xla.launch)"
        )


def _check_reduce_type(reduce_type: str) -> None:
    if reduce_type not in _REDUCE_TYPES:
        raise ValueError(f"invalid reduce type {reduce_type!r}; expected one of {_REDUCE_TYPES}")


def _check_groups(groups: Any, what: str) -> None:
    if groups:
        members = sorted(r for g in groups for r in g)
        if members != [0]:
            raise ValueError(
                f"{what}: replica groups {groups} name replicas other than 0, but lazyxla runs "
                "one replica"
            )


def _results(
    inputs: torch.Tensor | list[torch.Tensor], out: list[torch.Tensor], no_grad: bool = True
) -> torch.Tensor | list[torch.Tensor]:
    """A reduction's results as `all_reduce` returns them: a new tensor for a tensor, or written
    into the list's tensors (in place) for a list."""
    if isinstance(inputs, torch.Tensor):
        return out[0]
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        for t, o in zip(inputs, out):
            t.copy_(o)
    return inputs


def _scaled(t: torch.Tensor, scale: float) -> torch.Tensor:
    return t * scale if scale != 1.0 else t.clone()


def all_reduce(
    reduce_type: str,
    inputs: torch.Tensor | list[torch.Tensor],
    scale: float = 1.0,
    groups: Any = None,
    pin_layout: bool = True,
) -> torch.Tensor | list[torch.Tensor]:
    """Reduce over replicas, then multiply by `scale`; over one replica, `inputs * scale`.

    A tensor gives a new tensor; a list of tensors is reduced in place and returned.
    """
    del pin_layout
    _check_reduce_type(reduce_type)
    tensors = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    mesh = manual.in_manual_region(tensors)
    if mesh is not None:  # SPMD manual region: a real collective over mesh axes
        out = [manual.all_reduce(t, mesh, reduce_type, scale, groups) for t in tensors]
        return _results(inputs, out, no_grad=False)
    from . import data_parallel

    if data_parallel.current() is not None:  # Note [DataParallel replicas]
        return _results(inputs, data_parallel.all_reduce(reduce_type, tensors, scale, groups))
    if collectives.active() and torch.compiler.is_compiling() and not groups:
        # Under dynamo: torch's functional collective, which it traces into the graph (its
        # lazyxla kernel records the collective when the graph runs), as torch_xla does.
        out = [torch.ops._c10d_functional.all_reduce(t, reduce_type, "") for t in tensors]
        out = [torch.ops._c10d_functional.wait_tensor(o) for o in out]
        out = [o * scale if scale != 1.0 else o for o in out]
        return _results(inputs, out, no_grad=False)
    if collectives.active():  # Note [Cross-process collectives]
        return _results(inputs, collectives.all_reduce(tensors, reduce_type, scale, groups))
    _check_groups(groups, "all_reduce")
    if isinstance(inputs, torch.Tensor):
        return _scaled(inputs, scale)
    if scale != 1.0:
        with torch.no_grad():
            for t in inputs:
                t.mul_(scale)
    return inputs


def all_gather(
    value: torch.Tensor,
    dim: int = 0,
    groups: Any = None,
    output: torch.Tensor | None = None,
    pin_layout: bool = True,
) -> torch.Tensor:
    """Concatenate every replica's `value` along `dim`; over one replica, a copy of `value`."""
    _refuse_in_replica("all_gather")
    del pin_layout
    mesh = manual.in_manual_region([value])
    if mesh is not None:
        result = manual.all_gather(value, mesh, dim, groups)
    elif collectives.active():
        result = collectives.all_gather(value, dim, groups)
    else:
        _check_groups(groups, "all_gather")
        result = torch.cat([value], dim=dim)
    if output is None:
        return result
    _write_out(output, result)
    return output


def _write_out(output: torch.Tensor, result: torch.Tensor) -> None:
    """A collective's `output=` tensor takes the result, as torch_xla's `_out` entry points
    set it: a copy when the shapes agree, else the output becomes the result (its shape too)."""
    with torch.no_grad():
        if output.shape == result.shape:
            output.copy_(result)
        else:
            output.data = result


def reduce_scatter(
    reduce_type: str,
    input: torch.Tensor | list[torch.Tensor],
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: Any = None,
    output: torch.Tensor | list[torch.Tensor] | None = None,
    pin_layout: bool = True,
) -> torch.Tensor | list[torch.Tensor]:
    """Reduce over replicas, scale, and keep this replica's shard of `scatter_dim`.

    Over one replica (`shard_count` must be 1) that is `input * scale`.
    """
    _refuse_in_replica("reduce_scatter")
    del pin_layout
    _check_reduce_type(reduce_type)
    single = isinstance(input, torch.Tensor)
    inputs = [input] if single else list(input)
    mesh = manual.in_manual_region(inputs)
    if mesh is not None and single:
        results = [manual.reduce_scatter(input, mesh, reduce_type, scale, scatter_dim, groups)]
    elif collectives.active():
        results = [
            collectives.reduce_scatter(t, reduce_type, scale, scatter_dim, shard_count, groups)
            for t in inputs
        ]
    else:
        _check_groups(groups, "reduce_scatter")
        if shard_count != 1:
            raise ValueError(
                f"reduce_scatter: shard_count={shard_count} must equal the number of replicas (1)"
            )
        results = [_scaled(t, scale) for t in inputs]
    if output is None:
        return results[0] if single else results
    for o, r in zip([output] if single else output, results, strict=True):
        _write_out(o, r)
    return output


def all_gather_bucketized(
    input_list: list[torch.Tensor],
    dim: int = 0,
    groups: Any = None,
    output: list[torch.Tensor] | None = None,
    pin_layout: bool = False,
    bucket_cap_mb: int = 160,
) -> list[torch.Tensor]:
    """`all_gather` of each tensor of `input_list`. torch_xla fills buckets of `bucket_cap_mb`
    to coalesce the collectives; here they are all in the step's graph, where XLA combines them."""
    if pin_layout:
        raise RuntimeError("For xm.all_gather_bucketized, pin_layout=True is not yet supported.")
    results = [all_gather(t, dim, groups) for t in input_list]
    if output is None:
        return results
    for o, r in zip(output, results, strict=True):
        _write_out(o, r)
    return output


def reduce_scatter_bucketized(
    reduce_type: str,
    input_list: torch.Tensor | list[torch.Tensor],
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: Any = None,
    output: torch.Tensor | list[torch.Tensor] | None = None,
    pin_layout: bool = False,
    bucket_cap_mb: int = 160,
) -> torch.Tensor | list[torch.Tensor]:
    """`reduce_scatter` of each tensor of `input_list` (buckets: see `all_gather_bucketized`)."""
    if pin_layout:
        raise RuntimeError(
            "For xm.reduce_scatter_bucketized, pin_layout=True is not yet supported."
        )
    return reduce_scatter(reduce_type, input_list, scale, scatter_dim, shard_count, groups, output)


def all_to_all(
    value: torch.Tensor,
    split_dimension: int,
    concat_dimension: int,
    split_count: int,
    groups: Any = None,
    pin_layout: bool = True,
) -> torch.Tensor:
    """Split `value` among replicas and concatenate what each receives; one replica: a copy."""
    _refuse_in_replica("all_to_all")
    del pin_layout
    mesh = manual.in_manual_region([value])
    if mesh is not None:
        return manual.all_to_all(value, mesh, split_dimension, concat_dimension, groups)
    if collectives.active():
        return collectives.all_to_all(value, split_dimension, concat_dimension, split_count, groups)
    _check_groups(groups, "all_to_all")
    if split_count != 1:
        raise ValueError(
            f"all_to_all: split_count={split_count} must equal the number of replicas (1)"
        )
    return value.clone()


def collective_broadcast(
    tensors: Sequence[torch.Tensor],
    root_ordinal: int = 0,
    groups: Any = None,
    pin_layout: bool = True,
) -> None:
    """Overwrite `tensors` (in place) on every replica with their values on `root_ordinal`.

    Every replica records the same graph: a multiply by a device-data 1 (root) or 0 (others),
    then a sum over the replicas.
    """
    _refuse_in_replica("collective_broadcast")
    del pin_layout
    if not collectives.active():
        _check_groups(groups, "collective_broadcast")
        if root_ordinal != 0:
            raise ValueError(f"collective_broadcast: root {root_ordinal} is not a replica (0)")
        return
    me = runtime_api.global_ordinal()
    with torch.no_grad():
        for t in tensors:
            keep = torch.tensor(1 if me == root_ordinal else 0, dtype=t.dtype).to(t.device)
            t.mul_(keep)
        all_reduce(REDUCE_SUM, list(tensors), groups=groups)


def send(value: torch.Tensor, channel_id: int) -> torch.Tensor:
    """torch_xla's XLA `Send` by channel id: not available (see the error)."""
    raise NotImplementedError(
        "xm.send/xm.recv pair XLA Send/Recv ops by channel id inside one compiled program; "
        "lazyxla's processes run separate programs. Use torch.distributed.send/recv on the "
        "'xla' process group (dist.init_process_group('xla', init_method='xla://')), or "
        "xm.collective_permute(t, pairs) when every process takes part"
    )


def recv(output: torch.Tensor, channel_id: int) -> torch.Tensor:
    """torch_xla's XLA `Recv` by channel id: not available (see `send`)."""
    return send(output, channel_id)


def collective_permute(value: torch.Tensor, pairs: Sequence[Sequence[int]]) -> torch.Tensor:
    """Send `value` from replica `src` to `dst` for each `[src, dst]` in `pairs`.

    A replica that receives nothing gets zeros, as in XLA. With one replica the only valid pair is
    `[0, 0]`.
    """
    _refuse_in_replica("collective_permute")
    mesh = manual.in_manual_region([value])
    if mesh is not None:
        return manual.collective_permute(value, mesh, pairs)
    if collectives.active():
        return collectives.collective_permute(value, pairs)
    for pair in pairs:
        if any(r != 0 for r in pair):
            raise ValueError(
                f"collective_permute: pair {list(pair)} names a replica other than 0, but lazyxla "
                "runs one replica"
            )
    return value.clone() if pairs else torch.zeros_like(value)
