"""Memory-efficient attention: `F.scaled_dot_product_attention` and torch_xla's `flash_attention`.

# Note [Blockwise attention]
Naive attention materialises the (Sq, Sk) score matrix per head: its compiled temp memory grows
with the square of the sequence. Here attention is two custom ops, `lazyxla::flash_attention_fwd`
(-> output, logsumexp) and `lazyxla::flash_attention_bwd` (-> dq, dk, dv, dbias), whose lowerings
walk the keys in blocks of `BLOCK_K` with `lax.scan`, keeping a running max, sum and output per
query (the online softmax of FlashAttention). Only one (Sq, BLOCK_K) block of scores exists at a
time, so temp memory is linear in the sequence length (tests/test_attention.py measures it with
XLA's memory analysis). The backward recomputes each block's probabilities from the saved
logsumexp, so nothing quadratic is saved between forward and backward either. A backward that
must itself be differentiable (`create_graph=True`) is recomputed as math attention with autograd
(`_differentiable_backward`): correct to any order, quadratic in memory, paid only there. Keys
are padded to a whole number of blocks and the padding is masked out; a sequence of at most
`BLOCK_K` keys is one block (no scan: the small-size fallback).

On GPU the forward uses cuDNN's fused kernel through `jax.nn.dot_product_attention` and on TPU
JAX's Pallas flash attention (for the cases those kernels take: half precision on GPU, no
segment ids on GPU); their backward is the VJP of the same kernel. The CPU path is what the tests
check; the platform paths are selected by `_platform_kernel` and are not exercised here.

Which calls take this path (`use_blockwise_sdpa`): every `scaled_dot_product_attention` on a
lazy tensor with `dropout_p == 0` and q/k/v of matching batch dims (GQA with `enable_gqa`);
dropout and other shapes keep PyTorch's math decomposition. GQA is computed grouped (each key
head serves its group of query heads), never by repeating keys. Masks (bool or additive float,
any broadcastable shape) are kept at their own shape and sliced per block; an additive mask
that requires grad gets its gradient. Fully masked rows give 0, as eager's math path does.
Under SPMD, `partition_spec` (torch_xla's flash_attention) runs the kernel per shard inside
`jax.shard_map`: the partition spec names how q/k/v/segment ids are split (batch and heads).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from jax.sharding import PartitionSpec as P

from .meta import broadcast_shapes
from .ops.registry import register

aten = torch.ops.aten

# Keys per block. 256 keeps a (Sq, 256) score block per head; at or below it, one block.
BLOCK_K = 256
NEG_INF = -float("inf")


# --- the JAX kernels ------------------------------------------------------------------------------


def _canon(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any, tuple, int, int]:
    """q, k, v as (N, Hk, g, Sq, D), (N, Hk, Sk, D), (N, Hk, Sk, Dv); plus the lead dims."""
    if q.ndim == 2:
        q, k, v = q[None], k[None], v[None]
    if q.ndim == 3:
        q, k, v = q[:, None], k[:, None], v[:, None]
    lead = q.shape[:-3]
    hq, hk = q.shape[-3], k.shape[-3]
    n = int(np.prod(lead)) if lead else 1
    g = hq // hk
    q5 = q.reshape(n, hk, g, q.shape[-2], q.shape[-1])
    k4 = k.reshape(n, hk, k.shape[-2], k.shape[-1])
    v4 = v.reshape(n, hk, v.shape[-2], v.shape[-1])
    return q5, k4, v4, lead, hq, hk


def _bias_full_rank(bias: Any, q_ndim: int, lead: tuple) -> Any:
    """An attention mask/bias broadcastable to q's (*lead, [Hq,] Sq, Sk) scores, with all of
    (*lead, Hq, Sq, Sk)'s dims (a head dim of 1 inserted for queries without one)."""
    if bias.ndim > max(q_ndim, 2):
        raise ValueError(f"attention mask of rank {bias.ndim} for queries of rank {q_ndim}")
    if q_ndim <= 3:  # no head dim: scores are (*lead, Sq, Sk)
        bias = bias.reshape((1,) * (max(q_ndim, 2) - bias.ndim) + bias.shape)
        bias = bias[..., None, :, :]
    full_nd = len(lead) + 3
    return bias.reshape((1,) * (full_nd - bias.ndim) + bias.shape)


def _canon_bias(b: Any, lead: tuple, hk: int, g: int) -> Any:
    """A full-rank bias (`_bias_full_rank`) as 5-D (N|1, Hk|1, g|1, Sq|1, Sk|1), broadcast over
    the lead dims only when it varies along them."""
    blead, bh, bq, bk = b.shape[: len(lead)], b.shape[-3], b.shape[-2], b.shape[-1]
    if all(d == 1 for d in blead):
        nb = 1
        b = b.reshape(1, bh, bq, bk)
    else:
        b = jnp.broadcast_to(b, (*lead, bh, bq, bk)).reshape(-1, bh, bq, bk)
        nb = b.shape[0]
    if bh == 1:
        return b.reshape(nb, 1, 1, bq, bk)
    return b.reshape(nb, hk, g, bq, bk)


def _blocks(x: Any, axis: int, sk: int, nblk: int, bk: int, fill: Any) -> Any:
    """`x` split along `axis` (of size sk, or 1) into `nblk` blocks of `bk`, blocks first."""
    if x.shape[axis] == 1:
        return None
    pad = nblk * bk - sk
    if pad:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, pad)
        x = jnp.pad(x, widths, constant_values=fill)
    shape = x.shape[:axis] + (nblk, bk) + x.shape[axis + 1 :]
    return jnp.moveaxis(x.reshape(shape), axis, 0)


class _Problem:
    """One attention call, canonicalised, with its per-block score function."""

    def __init__(
        self, q, k, v, bias, q_seg, kv_seg, causal: bool, scale: float | None, block: int
    ) -> None:
        ct = jnp.promote_types(q.dtype, jnp.float32)
        self.ct = ct
        self.q, self.k, self.v, self.lead, self.hq, self.hk = _canon(
            q.astype(ct), k.astype(ct), v.astype(ct)
        )
        n, hk, g, sq, d = self.q.shape
        self.g, self.sq, self.sk = g, sq, self.k.shape[2]
        self.scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        self.causal = causal
        block = block or BLOCK_K
        self.bk = bk = min(block, self.sk) if self.sk else 1
        self.nblk = nblk = max(1, -(-self.sk // bk))
        self.pad = nblk * bk - self.sk
        self.kb = _blocks(self.k, 2, self.sk, nblk, bk, 0)  # (nblk, N, Hk, bk, D)
        self.vb = _blocks(self.v, 2, self.sk, nblk, bk, 0)
        self.bias = None
        self.bias_b = None
        if bias is not None:
            b = _bias_full_rank(
                bias if bias.dtype == jnp.bool_ else bias.astype(ct), q.ndim, self.lead
            )
            self.bias_full_shape = b.shape
            self.bias = _canon_bias(b, self.lead, hk, g)
            self.bias_b = _blocks(self.bias, 4, self.sk, nblk, bk, False)
        self.qs = q_seg.reshape(n, sq) if q_seg is not None else None
        self.kvs_b = None
        if kv_seg is not None:
            self.kvs_b = _blocks(kv_seg.reshape(n, self.sk), 1, self.sk, nblk, bk, -1)

    def xs(self) -> dict:
        xs = {"j": jnp.arange(self.nblk), "k": self.kb, "v": self.vb}
        if self.bias_b is not None:
            xs["bias"] = self.bias_b
        if self.kvs_b is not None:
            xs["kvs"] = self.kvs_b
        return xs

    def scores(self, x: dict) -> Any:
        """Scaled, masked scores of all queries against block `x["j"]`: (N, Hk, g, Sq, bk)."""
        s = jnp.einsum("nhgqd,nhkd->nhgqk", self.q, x["k"]) * self.scale
        keep = None
        col = x["j"] * self.bk + jnp.arange(self.bk)
        if self.pad:
            keep = (col < self.sk)[None, None, None, None, :]
        if self.causal:
            c = col[None, :] <= jnp.arange(self.sq)[:, None]
            keep = c if keep is None else keep & c
        bias = x.get("bias", self.bias if self.bias_b is None else None)
        if bias is not None:
            if bias.dtype == jnp.bool_:
                keep = bias if keep is None else keep & bias
            else:
                s = s + bias
        if self.qs is not None:
            seg = self.qs[:, None, None, :, None] == x["kvs"][:, None, None, None, :]
            keep = seg if keep is None else keep & seg
        if keep is not None:
            s = jnp.where(keep, s, NEG_INF)
        return s

    def unblock(self, xb: Any, axis: int) -> Any:
        """Stacked per-block results (blocks first) back along `axis`, padding dropped."""
        x = jnp.moveaxis(xb, 0, axis)
        shape = x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2 :]
        return lax.slice_in_dim(x.reshape(shape), 0, self.sk, axis=axis)

    def out_shape(self, x: Any, like: Any) -> Any:
        """(N, Hk, g, Sq, ...) back to the caller's layout (*lead, Hq, Sq, ...)."""
        return x.reshape(like.shape[:-1] + x.shape[-1:]) if x.ndim == 5 else x.reshape(like.shape)


def _scan(body: Any, init: Any, xs: dict) -> Any:
    if xs["j"].shape[0] == 1:  # one block: no loop
        carry, y = body(init, jax.tree.map(lambda a: a[0], xs))
        return carry, jax.tree.map(lambda a: a[None], y)
    return lax.scan(body, init, xs)


def blockwise_forward(
    q, k, v, bias=None, q_seg=None, kv_seg=None, *, causal=False, scale=None, block=None
):
    """(output, logsumexp) of softmax(q k^T * scale + bias, masked) v, one key block at a time.

    Shapes: q (*lead, Hq, Sq, D), k (*lead, Hk, Sk, D), v (*lead, Hk, Sk, Dv) with Hq a multiple
    of Hk (GQA). Returns output (*lead, Hq, Sq, Dv) in q's dtype and logsumexp (*lead, Hq, Sq)
    in float32 (float64 for float64 inputs). See Note [Blockwise attention].
    """
    pb = _Problem(q, k, v, bias, q_seg, kv_seg, causal, scale, block)
    n, hk, g, sq, _ = pb.q.shape
    dv = pb.v.shape[-1]

    def body(carry, x):
        m, l, acc = carry
        s = pb.scores(x)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)
        p = jnp.exp(s - m_safe[..., None])
        corr = jnp.exp(m - m_safe)
        l = l * corr + jnp.sum(p, axis=-1)
        acc = acc * corr[..., None] + jnp.einsum("nhgqk,nhkd->nhgqd", p, x["v"])
        return (m_new, l, acc), None

    init = (
        jnp.full((n, hk, g, sq), NEG_INF, pb.ct),
        jnp.zeros((n, hk, g, sq), pb.ct),
        jnp.zeros((n, hk, g, sq, dv), pb.ct),
    )
    (m, l, acc), _ = _scan(body, init, pb.xs())
    ok = l > 0
    out = jnp.where(ok[..., None], acc / jnp.where(ok, l, 1.0)[..., None], 0.0)
    lse = jnp.where(
        ok, jnp.where(jnp.isneginf(m), 0.0, m) + jnp.log(jnp.where(ok, l, 1.0)), NEG_INF
    )
    return out.reshape(q.shape[:-1] + (dv,)).astype(q.dtype), lse.reshape(q.shape[:-1])


def blockwise_backward(
    do, q, k, v, o, lse, bias=None, q_seg=None, kv_seg=None, *, causal=False, scale=None,
    bias_grad=False, block=None,
):  # fmt: skip
    """(dq, dk, dv, dbias) of `blockwise_forward`, recomputing each key block's probabilities
    from the saved logsumexp (dbias is None unless `bias_grad`)."""
    pb = _Problem(q, k, v, bias, q_seg, kv_seg, causal, scale, block)
    n, hk, g, sq, d = pb.q.shape
    do5 = do.astype(pb.ct).reshape(pb.q.shape[:-1] + (do.shape[-1],))
    o5 = o.astype(pb.ct).reshape(do5.shape)
    lse5 = lse.astype(pb.ct).reshape(pb.q.shape[:-1])
    delta = jnp.sum(do5 * o5, axis=-1)
    dead = jnp.isneginf(lse5)
    lse_safe = jnp.where(dead, 0.0, lse5)
    want_db = bias_grad and pb.bias is not None and pb.bias.dtype != jnp.bool_

    def body(dq, x):
        s = pb.scores(x)
        p = jnp.where(dead[..., None], 0.0, jnp.exp(s - lse_safe[..., None]))
        dv_j = jnp.einsum("nhgqk,nhgqd->nhkd", p, do5)
        dp = jnp.einsum("nhgqd,nhkd->nhgqk", do5, x["v"])
        ds = p * (dp - delta[..., None])
        dq = dq + jnp.einsum("nhgqk,nhkd->nhgqd", ds, x["k"]) * pb.scale
        dk_j = jnp.einsum("nhgqk,nhgqd->nhkd", ds, pb.q) * pb.scale
        ys = {"dk": dk_j, "dv": dv_j}
        if want_db:
            axes = tuple(i for i in range(4) if pb.bias.shape[i] == 1)
            db = jnp.sum(ds, axis=axes, keepdims=True)
            ys["db"] = db if pb.bias.shape[4] != 1 else jnp.sum(db, axis=4, keepdims=True)
        return dq, ys

    dq, ys = _scan(body, jnp.zeros(pb.q.shape, pb.ct), pb.xs())
    dk = pb.unblock(ys["dk"], 2).reshape(k.shape).astype(k.dtype)
    dv = pb.unblock(ys["dv"], 2).reshape(v.shape).astype(v.dtype)
    dq = dq.reshape(q.shape).astype(q.dtype)
    dbias = None
    if want_db:
        db = ys["db"]
        db = pb.unblock(db, 4) if pb.bias.shape[4] != 1 else jnp.sum(db, axis=0)
        dbias = _sum_to(db, pb.lead, pb.bias_full_shape).reshape(bias.shape).astype(bias.dtype)
    return dq, dk, dv, dbias


def _sum_to(db: Any, lead: tuple, shape: tuple) -> Any:
    """The 5-D bias gradient back to the full-rank bias `shape`, summing broadcast dims."""
    nb, bh, bg, bq, bk = db.shape
    x = db.reshape((*(lead if nb != 1 else (1,) * len(lead)), bh * bg, bq, bk))
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


# --- platform kernels (GPU / TPU) -----------------------------------------------------------------


def _platform_kernel(q, k, v, bias, q_seg, kv_seg, causal: bool, scale: float | None) -> Any:
    """A fused attention kernel JAX offers on this platform for this call, or None."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    platform = jax.default_backend()
    if (
        platform == "gpu"
        and q_seg is None
        and q.ndim == 4
        and q.dtype in (jnp.bfloat16, jnp.float16)
    ):

        def cudnn(q, k, v, bias):
            t = lambda x: None if x is None else jnp.swapaxes(x, 1, 2)  # noqa: E731  (BNSH->BSNH)
            b = bias if bias is None or bias.dtype != jnp.bool_ else None
            m = bias if bias is not None and bias.dtype == jnp.bool_ else None
            out = jax.nn.dot_product_attention(
                t(q),
                t(k),
                t(v),
                bias=b,
                mask=m,
                scale=scale,
                is_causal=causal,
                implementation="cudnn",
            )
            return jnp.swapaxes(out, 1, 2)

        return cudnn
    if platform == "tpu" and q.ndim == 4 and q.shape[1] == k.shape[1] and (
        bias is None or bias.dtype != jnp.bool_
    ):  # fmt: skip
        from jax.experimental.pallas.ops.tpu import flash_attention as pallas_fa

        def pallas(q, k, v, bias):
            seg = None if q_seg is None else pallas_fa.SegmentIds(q_seg, kv_seg)
            return pallas_fa.flash_attention(
                q, k, v, ab=bias, segment_ids=seg, causal=causal, sm_scale=scale
            )

        return pallas
    return None


# --- rules of the custom ops ----------------------------------------------------------------------


def _shard(fn: Any, partition_spec: str, mesh: str, n_in: int, n_out: int) -> Any:
    """`fn` per shard under `jax.shard_map`, when a partition spec is given."""
    if not partition_spec:
        return fn
    from .sharding import mesh_from_key

    m = mesh_from_key(mesh)
    spec = tuple(m.named_sharding(tuple(eval(partition_spec))).spec)  # noqa: S307  (our repr)
    spec = spec + (None,) * (4 - len(spec))
    by_rank = {
        4: P(*spec),
        3: P(*spec[:3]),  # logsumexp (batch, heads, seq)
        2: P(spec[0], spec[2]),  # segment ids (batch, seq)
    }

    def specs(args: tuple) -> tuple:
        return tuple(by_rank.get(a.ndim, P()) for a in args)

    def run(*args: Any) -> Any:
        present = [i for i, a in enumerate(args) if a is not None]

        def body(*xs: Any) -> Any:
            full = list(args)
            for i, x in zip(present, xs):
                full[i] = x
            return fn(*full)

        outs = jax.eval_shape(body, *[args[i] for i in present])
        out_specs = specs(tuple(o for o in outs))
        return jax.shard_map(
            body,
            mesh=m.jax_mesh,
            in_specs=specs(tuple(args[i] for i in present)),
            out_specs=tuple(out_specs),
            check_vma=False,
        )(*[args[i] for i in present])

    return run


def fwd_rule(q, k, v, bias, q_seg, kv_seg, causal, scale, partition_spec="", mesh=""):
    def run(q, k, v, bias, q_seg, kv_seg):
        kernel = _platform_kernel(q, k, v, bias, q_seg, kv_seg, causal, scale)
        if kernel is not None:
            out = kernel(q, k, v, bias)
            return out, jnp.zeros(out.shape[:-1], jnp.float32)  # the VJP backward needs no lse
        return blockwise_forward(q, k, v, bias, q_seg, kv_seg, causal=causal, scale=scale)

    return _shard(run, partition_spec, mesh, 6, 2)(q, k, v, bias, q_seg, kv_seg)


def bwd_rule(
    do, q, k, v, o, lse, bias, q_seg, kv_seg, causal, scale, bias_grad, partition_spec="", mesh=""
):
    def run(do, q, k, v, o, lse, bias, q_seg, kv_seg):
        kernel = _platform_kernel(q, k, v, bias, q_seg, kv_seg, causal, scale)
        if kernel is not None:
            _, vjp = jax.vjp(lambda q, k, v, b: kernel(q, k, v, b), q, k, v, bias)
            dq, dk, dv, db = vjp(do)
        else:
            dq, dk, dv, db = blockwise_backward(
                do, q, k, v, o, lse, bias, q_seg, kv_seg, causal=causal, scale=scale,
                bias_grad=bias_grad,
            )  # fmt: skip
        if db is None:
            db = jnp.zeros((0,), q.dtype)
        return dq, dk, dv, db

    return _shard(run, partition_spec, mesh, 9, 4)(do, q, k, v, o, lse, bias, q_seg, kv_seg)


# --- the custom ops, their eager (CPU) reference and autograd -------------------------------------


def _ref_scores(q, k, bias, q_seg, kv_seg, causal, scale, dtype=torch.float64):
    g = q.shape[-3] // k.shape[-3] if q.dim() >= 3 else 1
    if g > 1:
        k = k.repeat_interleave(g, dim=-3)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.to(dtype) @ k.to(dtype).transpose(-2, -1)) * sc
    if bias is not None:
        s = s.masked_fill(~bias, NEG_INF) if bias.dtype == torch.bool else s + bias.to(dtype)
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(), NEG_INF)
    if q_seg is not None:
        seg = q_seg[:, None, :, None] == kv_seg[:, None, None, :]
        s = s.masked_fill(~seg, NEG_INF)
    return s, g


@torch.library.custom_op("lazyxla::flash_attention_fwd", mutates_args=())
def flash_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    q_segment_ids: torch.Tensor | None,
    kv_segment_ids: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    partition_spec: str = "",
    mesh: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward -> (output, logsumexp). Off lazyxla's device: a float64 reference."""
    s, g = _ref_scores(q, k, bias, q_segment_ids, kv_segment_ids, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(lse.isneginf(), 0.0, lse)[..., None])
    vv = v.double().repeat_interleave(g, dim=-3) if g > 1 else v.double()
    out = (p @ vv).to(q.dtype)
    return out, lse.to(torch.promote_types(q.dtype, torch.float32))


@flash_attention_fwd.register_fake
def _(q, k, v, bias, q_segment_ids, kv_segment_ids, causal, scale, partition_spec="", mesh=""):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty(q.shape[:-1], dtype=torch.promote_types(q.dtype, torch.float32))


@torch.library.custom_op("lazyxla::flash_attention_bwd", mutates_args=())
def flash_attention_bwd(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    bias: torch.Tensor | None,
    q_segment_ids: torch.Tensor | None,
    kv_segment_ids: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    bias_grad: bool,
    partition_spec: str = "",
    mesh: str = "",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward -> (dq, dk, dv, dbias); dbias is empty unless `bias_grad`."""
    s, g = _ref_scores(q, k, bias, q_segment_ids, kv_segment_ids, causal, scale)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    p = torch.exp(s - torch.where(lse.isneginf(), 0.0, lse.double())[..., None])
    p = torch.where(lse.isneginf()[..., None], 0.0, p)
    do = grad_out.double()
    vv = v.double().repeat_interleave(g, dim=-3) if g > 1 else v.double()
    kk = k.double().repeat_interleave(g, dim=-3) if g > 1 else k.double()
    dvv = p.transpose(-2, -1) @ do
    dp = do @ vv.transpose(-2, -1)
    ds = p * (dp - (do * out.double()).sum(-1, keepdim=True))
    dq = (ds @ kk) * sc
    dkk = (ds.transpose(-2, -1) @ q.double()) * sc
    if g > 1:
        dkk = dkk.unflatten(-3, (-1, g)).sum(-3)
        dvv = dvv.unflatten(-3, (-1, g)).sum(-3)
    if bias_grad and bias is not None and bias.dtype != torch.bool:
        db = ds.sum_to_size(bias.shape).to(bias.dtype)
    else:
        db = q.new_empty((0,))
    return dq.to(q.dtype), dkk.to(k.dtype), dvv.to(v.dtype), db


@flash_attention_bwd.register_fake
def _(grad_out, q, k, v, out, lse, bias, qs, kvs, causal, scale, bias_grad, ps="", mesh=""):
    want = bias_grad and bias is not None and bias.dtype != torch.bool
    db = bias.new_empty(bias.shape) if want else q.new_empty((0,))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), db


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, bias, qs, kvs, causal, scale, ps, mesh = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], bias, qs, kvs)
    ctx.statics = (causal, scale, ps, mesh)
    ctx.bias_grad = bias is not None and bias.requires_grad


def _differentiable_backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
    """The backward as ops autograd can differentiate again (`create_graph=True`: a gradient
    penalty, Hessian-vector products). It materialises the (Sq, Sk) probabilities: memory is
    quadratic in the sequence, as eager's math attention; only double backward pays it."""
    q, k, v, out, lse, bias, qs, kvs = ctx.saved_tensors
    causal, scale, ps, _ = ctx.statics
    if ps:
        raise NotImplementedError(
            "double backward (create_graph=True) through flash_attention with partition_spec= "
            "is not supported by lazyxla; call it without partition_spec (SPMD still shards it "
            "by propagation), or take the second derivative outside the attention"
        )
    dtype = torch.promote_types(q.dtype, torch.float32)
    s, g = _ref_scores(q, k, bias, qs, kvs, causal, scale, dtype)
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(m.isneginf(), 0.0, m))
    z = e.sum(-1, keepdim=True)
    p = e / torch.where(z == 0, 1.0, z)  # a fully masked row gives 0, as the kernel does
    vv = v.to(dtype).repeat_interleave(g, dim=-3) if g > 1 else v.to(dtype)
    o = p @ vv
    want = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
    want.append(ctx.bias_grad)
    inputs = [t for t, w in zip((q, k, v, bias), want) if w]
    grads = iter(torch.autograd.grad(o, inputs, grad_out.to(dtype), create_graph=True))
    out_grads = [next(grads).to(t.dtype) if w else None for t, w in zip((q, k, v, bias), want)]
    return (*out_grads, None, None, None, None, None, None)


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_lse: Any) -> tuple:
    if torch.is_grad_enabled():  # create_graph=True: the backward must be differentiable
        return _differentiable_backward(ctx, grad_out)
    q, k, v, out, lse, bias, qs, kvs = ctx.saved_tensors
    causal, scale, ps, mesh = ctx.statics
    dq, dk, dv, db = flash_attention_bwd(
        grad_out.contiguous(), q, k, v, out, lse, bias, qs, kvs, causal, scale, ctx.bias_grad,
        ps, mesh,
    )  # fmt: skip
    return dq, dk, dv, (db if ctx.bias_grad else None), None, None, None, None, None, None


flash_attention_fwd.register_autograd(_backward, setup_context=_setup)

register(torch.ops.lazyxla.flash_attention_fwd.default, fwd_rule, opmath=False)
register(torch.ops.lazyxla.flash_attention_bwd.default, bwd_rule, opmath=False)


# --- F.scaled_dot_product_attention on lazy tensors -----------------------------------------------


def use_blockwise_sdpa(q, k, v, attn_mask, dropout_p: float, enable_gqa: bool) -> bool:
    """Whether `scaled_dot_product_attention` takes the blockwise kernel (Note [Blockwise
    attention]); the other calls keep PyTorch's math decomposition."""
    if dropout_p != 0.0 or q.dim() < 2 or not (q.dim() == k.dim() == v.dim()):
        return False
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1]:
        return False
    if q.dim() >= 3:
        hq, hk = q.shape[-3], k.shape[-3]
        if hq != hk and not (enable_gqa and q.dim() >= 3 and hk and hq % hk == 0):
            return False
    if q.shape[-1] != k.shape[-1] or 0 in q.shape or 0 in k.shape:
        return False
    if attn_mask is not None:
        if attn_mask.dim() > q.dim() or attn_mask.dtype not in (torch.bool, q.dtype):
            return False
        try:
            broadcast_shapes(attn_mask.shape, (*q.shape[:-1], k.shape[-2]))
        except RuntimeError:
            return False
    return q.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def sdpa_kernel(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    """`aten::scaled_dot_product_attention` for lazy tensors (its AutogradPrivateUse1 kernel)."""
    if attn_mask is not None and is_causal:
        raise RuntimeError(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when "
            "is_causal=True"
        )
    if not use_blockwise_sdpa(q, k, v, attn_mask, dropout_p, enable_gqa):
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # The math kernel adds its mask: a bool one as 0/1. PyTorch's composite converts it
            # first (False is -inf, in q's dtype), and so must this kernel, which replaces it.
            attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill_(
                attn_mask.logical_not(), NEG_INF
            )
        return aten._scaled_dot_product_attention_math(
            q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )[0]
    return flash_attention_fwd(q, k, v, attn_mask, None, None, is_causal, scale)[0]


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("scaled_dot_product_attention", sdpa_kernel, "AutogradPrivateUse1")


# --- torch_xla's flash_attention ------------------------------------------------------------------


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sm_scale: float = 1.0,
    *,
    ab: torch.Tensor | None = None,
    partition_spec: Any = None,
    mesh: Any = None,
) -> torch.Tensor:
    """torch_xla's `flash_attention`: softmax(q k^T * sm_scale + ab, masked) v, memory-efficient.

    Args:
        q: queries `[batch, heads, q_len, head_dim]`.
        k, v: keys and values `[batch, kv_heads, kv_len, head_dim]` (kv_heads divides heads).
        causal: mask keys after the query position.
        q_segment_ids, kv_segment_ids: `[batch, len]` ids; a query attends only to keys of its
            own segment (both or neither).
        sm_scale: the score scale (torch_xla's default 1.0: scale q yourself, or pass it).
        ab: an additive bias broadcastable to `[batch, heads, q_len, kv_len]` (gets a gradient).
        partition_spec: under SPMD, how q/k/v are split over `mesh` (e.g. `("data", None, None,
            None)`); the kernel then runs per shard in `jax.shard_map`.
        mesh: the `Mesh` (default: the global mesh).

    Returns:
        `[batch, heads, q_len, head_dim]`, differentiable in q, k, v and ab.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"flash_attention: {name} must be [batch, heads, seq, head_dim], got shape "
                f"{tuple(t.shape)}"
            )
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("flash_attention: pass both q_segment_ids and kv_segment_ids, or neither")
    if q.shape[1] % k.shape[1] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"flash_attention: incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)} (kv heads must divide q heads; k and v must agree)"
        )
    ps, mesh_name = "", ""
    if partition_spec is not None:
        from . import sharding as xs

        mesh = mesh or xs.get_global_mesh()
        if mesh is None:
            raise ValueError(
                "flash_attention: partition_spec needs a mesh (mesh= or set_global_mesh)"
            )
        ps, mesh_name = repr(tuple(partition_spec)), xs.mesh_key(mesh)
    return flash_attention_fwd(
        q, k, v, ab, q_segment_ids, kv_segment_ids, causal, float(sm_scale), ps, mesh_name
    )[0]
