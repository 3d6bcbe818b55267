"""torch.linalg's decompositions and what is built on them: SVD, eigen-decompositions, LU, QR,
Cholesky, solves, inverses, determinants, least squares, the matrix exponential, Householder
products.

PyTorch's LAPACK conventions are kept: LU pivots are 1-based int32, `info` outputs are zeros (XLA
reports a failed factorization as NaNs, not as an error code).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch
from jax import lax

from .registry import lowering

aten = torch.ops.aten
_HI = lax.Precision.HIGHEST


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _mm(a, b):
    return jnp.matmul(a, b, precision=_HI)


def _info(a):
    return jnp.zeros(a.shape[:-2], jnp.int32)


def _bcast(a, b):
    """Broadcast the batch dimensions of two matrix stacks."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _lu(a):
    lu, piv, perm = lax.linalg.lu(a)
    return lu, piv, perm


def _saved_lu(a):
    """The (LU, pivots) that det/slogdet return for their backward. PyTorch factors A^T for a
    contiguous real A (LAPACK is column-major) and its backward formulas expect exactly that; lazy
    tensors report contiguous strides."""
    lu, piv, _ = _lu(a if jnp.iscomplexobj(a) else _mT(a))
    return lu, piv.astype(jnp.int32) + 1


@lowering(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return jnp.zeros((0,), a.dtype), s, jnp.zeros((0,), a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


@lowering(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return w, v if compute_v else jnp.zeros((0,), a.dtype)


@lowering(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    lu, piv, _ = _lu(a)
    return lu, piv.astype(jnp.int32) + 1, _info(a)


def _perm_rows(b, perm):
    return jnp.take_along_axis(b, perm[..., :, None].astype(jnp.int32), axis=-2)


def _lu_solve(lu, perm, b, adjoint):
    """Solve A X = B (or A^H X = B) with A[perm] = L U."""
    lu, b = _bcast(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-1])
    tri = lax.linalg.triangular_solve
    if not adjoint:
        y = _perm_rows(b, perm)
        y = tri(lu, y, left_side=True, lower=True, unit_diagonal=True)
        return tri(lu, y, left_side=True, lower=False)
    # A^H = U^H L^H P  →  X = P^T L^{-H} U^{-H} B
    y = tri(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    y = tri(
        lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True
    )
    inv = jnp.argsort(perm, axis=-1)
    return _perm_rows(y, inv)


def _solve_any(lu, perm, b, left, adjoint):
    if left:
        return _lu_solve(lu, perm, b, adjoint)
    # X A = B  ⇔  A^H X^H = B^H
    return _mH(_lu_solve(lu, perm, _mH(b), not adjoint))


@lowering(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    perm = lax.linalg.lu_pivots_to_permutation(pivots - 1, lu.shape[-2])
    return _solve_any(lu, perm, b, left, adjoint)


@lowering(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    lu, piv, perm = _lu(a)
    vector = b.ndim == 1 or (left and b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    bb = b[..., None] if vector else b
    x = _solve_any(lu, perm, bb, left, False)
    if vector:
        x = x[..., 0]
    return x, lu, piv.astype(jnp.int32) + 1, _info(a)


@lowering(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    return jnp.linalg.inv(a), _info(a)


@lowering(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.linalg.qr(a, mode="r")
    q, r = jnp.linalg.qr(a, mode=mode)
    return q, r


@lowering(aten.geqrf.default)
def geqrf(a):
    from jax._src.lax.linalg import geqrf as _geqrf

    return _geqrf(a)


@lowering(aten.linalg_cross.default, opmath=False)
def linalg_cross(a, b, *, dim=-1):
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    if a.dtype not in (jnp.bfloat16, jnp.float16):
        return jnp.cross(a, b, axis=dim)
    # Eager's bf16/fp16 kernel rounds each product and the difference to the dtype (a third of
    # the components differed from one rounding of the float32 result); the explicit float32 ->
    # dtype -> float32 converts keep those roundings in the compiled program (Note [Opmath]).
    dt = a.dtype

    def r(v):
        return v.astype(dt).astype(jnp.float32)

    def c(x, i):
        return jnp.take(x.astype(jnp.float32), i, axis=dim)

    comps = [r(r(c(a, j) * c(b, k)) - r(c(a, k) * c(b, j))) for j, k in ((1, 2), (2, 0), (0, 1))]
    return jnp.stack(comps, axis=dim)


@lowering(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    lo = jnp.linalg.cholesky(a, symmetrize_input=False)
    return (_mH(lo) if upper else lo), _info(a)


@lowering(aten.cholesky.default)
def cholesky(a, upper=False):
    lo = jnp.linalg.cholesky(a, symmetrize_input=False)
    return _mH(lo) if upper else lo


@lowering(aten.cholesky_inverse.default)
def cholesky_inverse(f, upper=False):
    lo = _mH(f) if upper else f
    eye = jnp.broadcast_to(jnp.eye(f.shape[-1], dtype=f.dtype), f.shape)
    tri = lax.linalg.triangular_solve
    y = tri(lo, eye, left_side=True, lower=True)
    return tri(lo, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lowering(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(b, f, upper):
    f, b = _bcast(f, b)
    lo = _mH(f) if upper else f
    tri = lax.linalg.triangular_solve
    y = tri(lo, b, left_side=True, lower=True)
    return tri(lo, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lowering(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    sign, logabs = jnp.linalg.slogdet(a)
    return (sign, logabs, *_saved_lu(a))


@lowering(aten._linalg_det.default)
def linalg_det(a):
    return (jnp.linalg.det(a), *_saved_lu(a))


@lowering(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    a, b = _bcast(a, b)
    return lax.linalg.triangular_solve(
        a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular
    )


@lowering(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    a2, b2 = _bcast(a, b)
    x = lax.linalg.triangular_solve(
        a2, b2, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return x, a2


def _unpack(lu, perm, m, n):
    k = min(m, n)
    eye_l = jnp.eye(m, k, dtype=lu.dtype)
    low = jnp.tril(lu[..., :, :k], -1) + eye_l
    up = jnp.triu(lu[..., :k, :])
    p = _mT(jax.nn.one_hot(perm, m, dtype=lu.dtype))
    return p, low, up


@lowering(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    perm = lax.linalg.lu_pivots_to_permutation(pivots - 1, m)
    p, low, up = _unpack(lu, perm, m, n)
    empty = jnp.zeros((0,), lu.dtype)
    return (
        (p if unpack_pivots else empty),
        (low if unpack_data else empty),
        (up if unpack_data else empty),
    )


@lowering(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    lu, _, perm = _lu(a)
    return _unpack(lu, perm, *a.shape[-2:])


@lowering(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    # Padé in float64: float32 scaling-and-squaring drifts from PyTorch's on large norms.
    if a.dtype == jnp.float32:
        return jsl.expm(a.astype(jnp.float64)).astype(a.dtype)
    return jsl.expm(a)


def _householder_q(a, tau, full):
    m, n = a.shape[-2:]
    k = tau.shape[-1]
    q = jnp.broadcast_to(jnp.eye(m, dtype=a.dtype), a.shape[:-2] + (m, m))
    rows = jnp.arange(m)
    for i in range(k):
        v = jnp.where(rows > i, a[..., :, i], jnp.where(rows == i, 1, 0).astype(a.dtype))
        t = tau[..., i][..., None, None]
        # Q ← Q (I - t v v^H)
        qv = _mm(q, v[..., :, None])
        q = q - t * _mm(qv, jnp.conj(v)[..., None, :])
    return q if full else q[..., :, :n]


@lowering(aten.linalg_householder_product.default)
def linalg_householder_product(a, tau):
    return _householder_q(a, tau, False)


@lowering(aten.ormqr.default)
def ormqr(a, tau, c, left=True, transpose=False):
    q = _householder_q(a, tau, True)
    if transpose:
        q = _mH(q)
    return _mm(q, c) if left else _mm(c, q)


@lowering(aten.linalg_eig.default)
def linalg_eig(a):
    w, v = jnp.linalg.eig(a)
    return w, v


@lowering(aten._linalg_eigvals.default)
def linalg_eigvals(a):
    return jnp.linalg.eigvals(a)


@lowering(aten.linalg_lstsq.default)
def linalg_lstsq(a, b, rcond=None, *, driver=None):
    """Eager CPU's outputs per LAPACK driver (default gelsy): residuals for a tall `a` with gels
    (gelsd/gelss return them only at full rank, a data-dependent shape: CPU fallback), the rank
    with gelsy/gelsd/gelss, the singular values with gelsd/gelss."""
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    if m > n and driver in ("gelsd", "gelss"):
        raise NotImplementedError("lstsq residuals exist only at full rank: data-dependent")
    a2, b2 = _bcast(a, b)
    x = _mm(jnp.linalg.pinv(a2), b2) if m != n else jnp.linalg.solve(a2, b2)
    batch = a2.shape[:-2]
    residuals = jnp.zeros((0,), jnp.real(a[..., :0, :0]).dtype)  # real, as eager's
    if m > n and driver == "gels":
        r = b2 - _mm(a2, x)
        residuals = jnp.sum(jnp.real(r * jnp.conj(r)), axis=-2)
    rank = jnp.zeros((0,), jnp.int64)
    sv = jnp.zeros((0,), residuals.dtype)
    if driver != "gels":
        s = jnp.linalg.svd(a2, compute_uv=False)
        tol = (jnp.finfo(s.dtype).eps * max(m, n) if rcond is None else rcond) * s[..., :1]
        rank = jnp.sum(s > tol, axis=-1).astype(jnp.int64).reshape(batch)
        if driver in ("gelsd", "gelss"):
            sv = s
    return x, residuals, rank, sv
