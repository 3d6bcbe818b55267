"""Every cross-process collective against a NumPy reference (run by test_collectives.py).

`python progs_collectives.py OUT_DIR` under `CPU_NUM_DEVICES=N`: `torch_xla.launch` starts N
processes; each records every collective (dtypes, scale, replica groups), syncs once, checks its
results against NumPy on every process's inputs (each process can make every input: they depend
only on the rank), runs the same step again on new data (no new compile), and writes a summary to
OUT_DIR/rank<r>.json. A mismatch raises, which fails the launch.
"""

import json
import os
import sys

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr

DTYPES = {"float32": torch.float32, "int32": torch.int32, "bfloat16": torch.bfloat16}


def value(rank, dtype, step, shape=(4, 6)):
    """Rank r's input: small integers (exact in every dtype, products included)."""
    g = np.random.default_rng(1000 * step + rank)
    return g.integers(1, 4, size=shape).astype(np.float64)


def groupings(n):
    out = [None]
    if n == 4:
        out += [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 3], [1, 2]]]
    return out


def members(groups, n, r):
    if groups is None:
        return list(range(n))
    return next(g for g in groups if r in g)


REDUCE = {
    "sum": lambda a: np.sum(a, axis=0),
    "mul": lambda a: np.prod(a, axis=0),
    "min": lambda a: np.min(a, axis=0),
    "max": lambda a: np.max(a, axis=0),
    "and": lambda a: np.bitwise_and.reduce(a.astype(np.int64), axis=0),
    "or": lambda a: np.bitwise_or.reduce(a.astype(np.int64), axis=0),
}


def record(rank, n, step, dev):
    cases = []
    for dname, dt in DTYPES.items():
        x = torch.tensor(value(rank, dname, step)).to(dt).to(dev)
        for groups in groupings(n):
            for op in REDUCE:
                if op in ("and", "or") and dt.is_floating_point:
                    continue
                for scale in (1.0, 0.5):
                    if scale != 1.0 and not dt.is_floating_point:
                        continue
                    out = xm.all_reduce(op, x, scale=scale, groups=groups)
                    cases.append((("all_reduce", dname, op, scale, groups), out))
            cases.append((("all_gather", dname, 1, groups), xm.all_gather(x, dim=1, groups=groups)))
            k = len(members(groups, n, rank))
            flat = x.reshape(-1)[: 8 * k] if 24 % k else x.reshape(-1)
            rs = xm.reduce_scatter("sum", flat, 0.5, 0, k, groups=groups)
            cases.append((("reduce_scatter", dname, groups), rs))
            a2a = xm.all_to_all(x.reshape(-1)[: 4 * k], 0, 0, k, groups=groups)
            cases.append((("all_to_all", dname, groups), a2a))
        pairs = [[i, (i + 1) % n] for i in range(n)]
        cases.append((("permute", dname, pairs), xm.collective_permute(x, pairs)))
        cases.append((("permute", dname, [[0, n - 1]]), xm.collective_permute(x, [[0, n - 1]])))
        # in place over a list, as torch_xla's all_reduce of a list
        ys = [x.clone(), (x * 2).clone()]
        xm.all_reduce("sum", ys)
        cases.append((("list", dname), ys[0]))
        cases.append((("list2", dname), ys[1]))
    return cases


def reference(key, rank, n, step):
    kind, dname = key[0], key[1]
    vals = [value(r, dname, step) for r in range(n)]
    cast = lambda a: torch.tensor(a).to(DTYPES[dname]).double().numpy()  # noqa: E731
    vals = [cast(v) for v in vals]
    if kind == "all_reduce":
        _, _, op, scale, groups = key
        rows = np.stack([vals[r] for r in members(groups, n, rank)])
        return REDUCE[op](rows) * scale
    if kind == "all_gather":
        groups = key[3]
        return np.concatenate([vals[r] for r in members(groups, n, rank)], axis=1)
    if kind == "reduce_scatter":
        groups = key[2]
        ms = members(groups, n, rank)
        k = len(ms)
        flats = [v.reshape(-1)[: 8 * k] if 24 % k else v.reshape(-1) for v in vals]
        total = np.sum([flats[r] for r in ms], axis=0) * 0.5
        size = total.shape[0] // k
        i = ms.index(rank)
        return total[i * size : (i + 1) * size]
    if kind == "all_to_all":
        groups = key[2]
        ms = members(groups, n, rank)
        k = len(ms)
        i = ms.index(rank)
        return np.concatenate([vals[r].reshape(-1)[: 4 * k][i * 4 : (i + 1) * 4] for r in ms])
    if kind == "permute":
        pairs = key[2]
        src = [a for a, b in pairs if b == rank]
        return vals[src[0]] if src else np.zeros_like(vals[rank])
    if kind in ("list", "list2"):
        mult = 1 if kind == "list" else 2
        return np.sum([v * mult for v in vals], axis=0)
    raise AssertionError(key)


def _mp_fn(index, out_dir):
    n = xr.world_size()
    rank = xr.global_ordinal()
    assert index == rank, (index, rank)
    dev = torch_xla.device()
    checked = 0
    compiles = []
    for step in range(2):
        cases = record(rank, n, step, dev)
        torch_xla.sync()
        compiles.append(met.counter_value("UncachedCompile"))
        for key, out in cases:
            want = reference(key, rank, n, step)
            want = torch.tensor(want).to(DTYPES[key[1]]).double().numpy()  # the result's dtype
            got = out.cpu().double().numpy()
            if got.shape != want.shape or not np.array_equal(got, want):
                raise AssertionError(
                    f"rank {rank}: {key}: got {got.tolist()}, want {want.tolist()}"
                )
            checked += 1
    summary = {
        "rank": rank,
        "world_size": n,
        "checked": checked,
        "compiles": compiles,
        "ordinal": xr.global_ordinal(),
        "local_ordinal": xr.local_ordinal(),
        "master": xm.is_master_ordinal(),
        "rendezvous": [b.decode() for b in xm.rendezvous("tag", f"r{rank}".encode())],
        "mesh_reduce": xm.mesh_reduce("sum", rank + 1, sum),
    }
    if n == 4:  # subgroups of the same processes (a launch of its own cost ~20 s)
        import progs_groups

        progs_groups.main(index)
        summary["groups"] = True
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(summary, f)


if __name__ == "__main__":
    torch_xla.launch(_mp_fn, args=(sys.argv[1],))
