"""Lowerings: matrix products, decompositions and solvers (torch.linalg).

float32/float64 products run at full precision (JAX's default matmul precision here is
"highest"); float16/bfloat16 products accumulate in float32 and round once, as PyTorch's CPU
kernels do.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg
from jax import lax

from . import aten, lowers

_LOW = (jnp.float16, jnp.bfloat16)


def _acc_dtype(dtype):
    return jnp.float32 if dtype in _LOW else None


def matmul(a, b, out_dtype=None):
    """a @ b, accumulated in float32 for half types, returned in out_dtype (default a's dtype)."""
    out_dtype = out_dtype or a.dtype
    acc = _acc_dtype(a.dtype)
    return jnp.matmul(a, b, preferred_element_type=acc).astype(out_dtype)


def _scaled_sum(self, product, beta, alpha):
    """beta * self + alpha * product; beta == 0 ignores self entirely (NaN/inf included)."""
    dtype = product.dtype
    acc = _acc_dtype(dtype) or dtype
    scaled = product.astype(acc) * jnp.asarray(alpha).astype(acc)
    base = jnp.where(beta == 0, jnp.zeros((), acc), self.astype(acc) * jnp.asarray(beta).astype(acc))
    return (base + scaled).astype(dtype)


def _keep_acc(a, b):
    """The product in the accumulation dtype (for addmm-like ops that round once at the end)."""
    acc = _acc_dtype(a.dtype)
    return jnp.matmul(a, b, preferred_element_type=acc)


@lowers(aten.mm.default, aten.bmm.default, aten.dot.default)
def mm(self, mat2_or_tensor):
    return matmul(self, mat2_or_tensor)


@lowers(aten.mm.dtype, aten.bmm.dtype)
def mm_dtype(self, mat2, out_dtype):
    return jnp.matmul(self, mat2, preferred_element_type=jnp.float32).astype(out_dtype)


@lowers(aten.mv.default)
def mv(self, vec):
    return matmul(self, vec)


@lowers(aten.vdot.default)
def vdot(self, other):
    return matmul(jnp.conj(self), other)


@lowers(aten.addmm.default, aten.addmv.default, aten.baddbmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _scaled_sum(self, _keep_acc(mat1, mat2), beta, alpha).astype(mat1.dtype)


@lowers(aten.addmm.dtype, aten.baddbmm.dtype)
def addmm_dtype(self, mat1, mat2, out_dtype, *, beta=1, alpha=1):
    product = jnp.matmul(mat1, mat2, preferred_element_type=jnp.float32)
    return _scaled_sum(self.astype(jnp.float32), product, beta, alpha).astype(out_dtype)


@lowers(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_sum(self, jnp.sum(_keep_acc(batch1, batch2), axis=0), beta, alpha).astype(batch1.dtype)


@lowers(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    outer = vec1[:, None] * vec2[None, :]
    if outer.dtype == jnp.bool_:  # bool addr is (beta and self) or (alpha and outer)
        return jnp.logical_or(jnp.logical_and(beta != 0, self), jnp.logical_and(alpha != 0, outer))
    return _scaled_sum(self, outer, beta, alpha)


# ---------------------------------------------------------------- decompositions and solvers
# PyTorch's conventions, which these follow exactly:
# - LU pivots are 1-based int32 row swaps (LAPACK's getrf); `info` tensors are int32, 0 on success,
#   k > 0 for "failed at the k-th pivot / leading minor" (LAPACK's info), one per matrix.
# - Batch dimensions of two operands broadcast.
# - Where the result is not unique (the signs of singular vectors, eigenvectors, Q's columns) the
#   values are JAX's; on CPU JAX calls the same LAPACK routines as PyTorch, so they agree there.
# - `check_errors=True` is not raised from here (a lowering cannot raise on values); PyTorch's
#   public functions call _linalg_check_errors on the info tensor themselves.

def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _broadcast_batch(*xs):
    """The arrays with their batch (all but the last two) dimensions broadcast together."""
    batch = jnp.broadcast_shapes(*(x.shape[:-2] for x in xs))
    return [jnp.broadcast_to(x, batch + x.shape[-2:]) for x in xs]


def _eye_like(a):
    return jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)


def _tri_solve(a, b, *, lower, left=True, adjoint=False, unit=False):
    """Solves op(a) x = b (left) or x op(a) = b, op the conjugate transpose when `adjoint`."""
    a, b = _broadcast_batch(a, b)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=adjoint,
                                       conjugate_a=adjoint, unit_diagonal=unit)


@lowers(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    return _tri_solve(self, B, lower=not upper, left=left, unit=unitriangular)


@lowers(aten.triangular_solve.default)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    """The deprecated form: solves op(A) X = self (op: transpose, not conjugate); also returns A."""
    A_b, B = _broadcast_batch(A, self)
    X = lax.linalg.triangular_solve(A_b, B, left_side=True, lower=not upper, transpose_a=transpose,
                                    unit_diagonal=unitriangular)
    return X, A_b


# ----- Cholesky

def _cholesky_lower(a, upper):
    """The lower Cholesky factor of the Hermitian matrix stored in a's lower (upper) triangle."""
    return lax.linalg.cholesky(_mH(a) if upper else a, symmetrize_input=False)


def _cholesky_info(a, L):
    """LAPACK potrf's info: 0, or the order of the first leading minor that is not positive
    definite. The factor is NaN wherever it failed; only then does the (sequential) search run."""
    def search(a):
        n = a.shape[-1]
        low = jnp.tril(a)
        work = low + _mH(jnp.tril(a, -1))  # the Hermitian matrix the lower triangle stands for
        rows = jnp.arange(n)

        def step(k, state):
            work, info = state
            d = jnp.real(work[..., k, k])
            bad = ~(d > 0)  # NaN too
            info = jnp.where((info == 0) & bad, k + 1, info)
            col = work[..., :, k] / jnp.sqrt(jnp.where(bad, 1, d))[..., None]
            col = jnp.where(rows > k, col, 0)
            work = work - col[..., :, None] * jnp.conj(col)[..., None, :]
            return work, info

        info0 = jnp.zeros(a.shape[:-2], jnp.int32)
        return lax.fori_loop(0, n, step, (work, info0))[1]

    if a.shape[-1] == 0:
        return jnp.zeros(a.shape[:-2], jnp.int32)
    ok = jnp.all(jnp.isfinite(L))
    return lax.cond(ok, lambda a: jnp.zeros(a.shape[:-2], jnp.int32), search, a)


@lowers(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
    a = _mH(self) if upper else self
    L = lax.linalg.cholesky(a, symmetrize_input=False)
    info = _cholesky_info(a, L)
    return (_mH(L) if upper else L), info


@lowers(aten.cholesky.default)
def cholesky(self, upper=False):
    L = _cholesky_lower(self, upper)
    return _mH(L) if upper else L


def _cholesky_factor_solve(L_or_U, B, upper):
    """Solves (L L^H) X = B given L, or (U^H U) X = B given U."""
    L = _mH(L_or_U) if upper else L_or_U
    y = _tri_solve(L, B, lower=True)
    return _tri_solve(L, y, lower=True, adjoint=True)


@lowers(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(self, A, upper):
    return _cholesky_factor_solve(A, self, upper)


@lowers(aten.cholesky_inverse.default)
def cholesky_inverse(self, upper=False):
    return _cholesky_factor_solve(self, _eye_like(self), upper)


# ----- LU

def _lu(a):
    """(LU, 1-based int32 pivots, permutation, info) of partial-pivoting LU (getrf)."""
    lu, pivots, perm = lax.linalg.lu(a)
    k = min(a.shape[-2], a.shape[-1])
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)[..., :k]
    zero = diag == 0
    if k == 0:  # no pivots: argmax has nothing to look at
        return lu, pivots.astype(jnp.int32), perm, jnp.zeros(a.shape[:-2], jnp.int32)
    info = jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)
    return lu, (pivots + 1).astype(jnp.int32), perm, info


def _permutation(pivots, m):
    """The row permutation (P^T A = A[perm]) that 1-based LAPACK pivots describe."""
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _lu_solve(LU, perm, B, left=True, adjoint=False):
    """Solves A X = B (A^H X = B when adjoint; X A = B, X A^H = B when not left) with
    P^T A = L U, L unit lower and U upper stored in LU, perm the rows of P^T."""
    if not left:  # X A = B  <=>  A^H X^H = B^H
        return _mH(_lu_solve(LU, perm, _mH(B), True, not adjoint))
    LU, B = _broadcast_batch(LU, B)
    perm = jnp.broadcast_to(perm, B.shape[:-2] + perm.shape[-1:])
    if not adjoint:
        x = jnp.take_along_axis(B, perm[..., :, None], axis=-2)
        x = lax.linalg.triangular_solve(LU, x, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(LU, x, left_side=True, lower=False)
    # A^H = U^H L^H P^T: solve U^H y = B, then L^H z = y, then X = P z
    y = lax.linalg.triangular_solve(LU, B, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    z = lax.linalg.triangular_solve(LU, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True,
                                    unit_diagonal=True)
    inverse = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(z, inverse[..., :, None], axis=-2)


@lowers(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    lu, pivots, _, info = _lu(A)
    return lu, pivots, info


def _unpack(lu, perm, dtype):
    m, n = lu.shape[-2:]
    k = min(m, n)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=dtype)
    U = jnp.triu(lu[..., :k, :])
    # P with A = P L U: column i of P is e_{perm[i]}
    P = (perm[..., None, :] == jnp.arange(m)[:, None]).astype(dtype)
    return P, L, U


@lowers(aten.linalg_lu.default)
def linalg_lu(A, *, pivot=True):
    if not pivot:
        raise RuntimeError("linalg.lu: LU without pivoting is not implemented on the CPU")
    lu, _, perm, _ = _lu(A)
    return _unpack(lu, perm, A.dtype)


@lowers(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m = LU_data.shape[-2]
    empty = jnp.zeros((0,), LU_data.dtype)
    perm = _permutation(LU_pivots, m) if unpack_pivots else jnp.zeros(LU_data.shape[:-2] + (m,), jnp.int32)
    P, L, U = _unpack(LU_data, perm, LU_data.dtype)
    return (P if unpack_pivots else empty), (L if unpack_data else empty), (U if unpack_data else empty)


@lowers(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    return _lu_solve(LU, _permutation(pivots, LU.shape[-1]), B, left, adjoint)


@lowers(aten.lu_solve.default)
def lu_solve(self, LU_data, LU_pivots):
    return linalg_lu_solve(LU_data, LU_pivots, self)


# det and slogdet: PyTorch factors A^T instead of A when A is contiguous and real (LAPACK wants
# column-major input; A^T of a row-major A is column-major), and their backward formulas decide
# which factorization they were given from A.is_contiguous() again. A lowering sees values, not
# strides: both drivers pass `A_contiguous` from the input's layout (Lowering.contiguity). (_linalg_solve_ex returns the LU of A itself, whatever A's
# layout, as of PyTorch 2.13.)

def _factor_as_pytorch(A, A_contiguous):
    use_A_T = A_contiguous and not jnp.iscomplexobj(A)
    lu, pivots, perm, info = _lu(_mT(A) if use_A_T else A)
    return use_A_T, lu, pivots, perm, info


def _is_vector_rhs(A, B):
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


@lowers(aten._linalg_solve_ex.default)
def linalg_solve_ex(A, B, *, left=True, check_errors=False):
    lu, pivots, perm, info = _lu(A)
    vector = _is_vector_rhs(A, B)
    x = _lu_solve(lu, perm, B[..., None] if vector else B, left)
    return (x[..., 0] if vector else x), lu, pivots, info


@lowers(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, *, check_errors=False):
    lu, _, perm, info = _lu(A)
    return _lu_solve(lu, perm, _eye_like(A)), info


def _det_parts(lu, pivots):
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(lu.dtype)
    return diag, parity


@lowers(aten._linalg_det.default, contiguity=("A",))
def linalg_det(A, *, A_contiguous=True):
    _, lu, pivots, _, _ = _factor_as_pytorch(A, A_contiguous)
    diag, parity = _det_parts(lu, pivots)
    return parity * jnp.prod(diag, axis=-1), lu, pivots


@lowers(aten._linalg_slogdet.default, contiguity=("A",))
def linalg_slogdet(A, *, A_contiguous=True):
    _, lu, pivots, _, _ = _factor_as_pytorch(A, A_contiguous)
    diag, parity = _det_parts(lu, pivots)
    absdiag = jnp.abs(diag)
    logabsdet = jnp.sum(jnp.log(absdiag), axis=-1)
    if jnp.iscomplexobj(diag):
        sign = parity * jnp.prod(diag / absdiag.astype(diag.dtype), axis=-1)
    else:
        sign = parity * jnp.prod(jnp.sign(diag), axis=-1)
    sign = jnp.where(jnp.any(absdiag == 0, axis=-1), 0, sign).astype(A.dtype)
    return sign, logabsdet, lu, pivots


# ----- QR, SVD, eigh

@lowers(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), A.dtype), jnp.linalg.qr(A, mode="r")
    return tuple(jnp.linalg.qr(A, mode=mode))


@lowers(aten.geqrf.default)
def geqrf(self):
    h, tau = jnp.linalg.qr(self, mode="raw")  # LAPACK's geqrf, with its output transposed
    return _mT(h), tau


@lowers(aten.linalg_householder_product.default)
def linalg_householder_product(input, tau):
    return lax.linalg.householder_product(input, tau)


@lowers(aten.ormqr.default)
def ormqr(self, input2, input3, left=True, transpose=False):
    """op(Q) @ C (left) or C @ op(Q), Q from geqrf's reflectors `self` and factors `input2`."""
    return lax.linalg.ormqr(self, input2, input3, left=left, transpose=transpose)


@lowers(aten._linalg_svd.default)
def linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        empty = jnp.zeros((0,), A.dtype)
        return empty, lax.linalg.svd(A, full_matrices=False, compute_uv=False), empty
    U, S, Vh = lax.linalg.svd(A, full_matrices=full_matrices, compute_uv=True)
    return U, S, Vh


@lowers(aten._linalg_eigh.default)
def linalg_eigh(A, UPLO="L", compute_v=True):
    vectors, values = lax.linalg.eigh(A, lower=UPLO.upper() == "L", symmetrize_input=False)
    if not compute_v:
        return values, jnp.zeros((0,), A.dtype)
    return values, vectors


# ----- matrix functions

@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(self):
    # JAX's expm takes float32/64 and complex only: half types compute in float32 and round once
    acc = _acc_dtype(self.dtype)
    if acc is None:
        return jax.scipy.linalg.expm(self)  # batched
    return jax.scipy.linalg.expm(self.astype(acc)).astype(self.dtype)


@lowers(aten.linalg_cross.default)
def linalg_cross(self, other, *, dim=-1):
    shape = jnp.broadcast_shapes(self.shape, other.shape)
    a, b = jnp.broadcast_to(self, shape), jnp.broadcast_to(other, shape)
    return jnp.cross(a, b, axis=dim)


# ----- general eigenproblem
# XLA has no eigendecomposition of its own: JAX runs LAPACK's geev on CPU (and a GPU library on
# GPUs), so these compile only where such a kernel exists. On CPU the eigenvectors are LAPACK's:
# unit norm, largest component real, as PyTorch's.

@lowers(aten.linalg_eig.default)
def linalg_eig(self):
    values, vectors = lax.linalg.eig(self, compute_left_eigenvectors=False)
    return values, vectors


@lowers(aten._linalg_eigvals.default, aten.linalg_eigvals.default)
def linalg_eigvals(self):
    return lax.linalg.eig(self, compute_left_eigenvectors=False, compute_right_eigenvectors=False)[0]


@lowers(aten.linalg_lstsq.default, data_dependent=True)
def linalg_lstsq(self, b, rcond=None, *, driver=None):
    """Least squares with CPU's output conventions, which depend on the driver and on the data:
    residuals only for m > n, a driver other than gelsy and full-rank matrices; rank unless gels;
    singular values for gelsd/gelss. (Run outside jit: the residuals' size depends on the rank.)"""
    driver = driver or "gelsy"
    m, n = self.shape[-2:]
    vector = b.ndim == self.ndim - 1
    rhs = b[..., None] if vector else b
    s = jnp.linalg.svd(self, compute_uv=False)
    cutoff = (jnp.finfo(self.dtype).eps * max(m, n) if rcond is None or rcond < 0 else rcond)
    rank = jnp.sum(s > cutoff * s[..., :1], axis=-1).astype(jnp.int64)
    solution = jnp.linalg.pinv(self, rtol=cutoff) @ rhs
    full_rank = bool(jnp.all(rank == min(m, n)))
    if m > n and driver != "gelsy" and full_rank:
        residuals = jnp.sum(jnp.abs(self @ solution - rhs) ** 2, axis=-2)
    else:
        residuals = jnp.zeros((0,), s.dtype)  # real, as for complex inputs the residuals are
    return (solution[..., 0] if vector else solution, residuals,
            rank if driver != "gels" else jnp.zeros((0,), jnp.int64),
            s if driver in ("gelsd", "gelss") else jnp.zeros((0,), s.dtype))
