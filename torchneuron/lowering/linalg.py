"""Lowerings: matrix products, decompositions and solvers (torch.linalg).

float32/float64 products run at full precision (JAX's default matmul precision here is
"highest"); float16/bfloat16 products accumulate in float32 and round once, as PyTorch's CPU
kernels do.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import aten, lowers, opmath_dtype
from .padding import Fill, Padding, pads

# Below this many multiply-adds a product runs as an elementwise multiply and a sum, which XLA
# fuses into one loop: XLA:CPU's dot kernel costs about a microsecond more than such work (8x8 mm).
SMALL_PRODUCT = 4096


def _is_small_product(a, b) -> bool:
    if a.ndim != b.ndim or a.ndim not in (2, 3) or a.dtype == jnp.bool_:
        return False
    return math.prod(a.shape) * b.shape[-1] <= SMALL_PRODUCT


def matmul(a, b, out_dtype=None):
    """a @ b, accumulated in float32 for half types, returned in out_dtype (default a's dtype)."""
    out_dtype = out_dtype or a.dtype
    acc = opmath_dtype(a.dtype)
    if _is_small_product(a, b):
        wide = acc or a.dtype
        return (a[..., :, :, None].astype(wide) * b[..., None, :, :].astype(wide)).sum(-2).astype(out_dtype)
    return jnp.matmul(a, b, preferred_element_type=acc).astype(out_dtype)


def _scaled_sum(self, product, beta, alpha):
    """beta * self + alpha * product; beta == 0 ignores self entirely (NaN/inf included)."""
    dtype = product.dtype
    acc = opmath_dtype(dtype) or dtype
    scaled = product.astype(acc) * jnp.asarray(alpha).astype(acc)
    base = jnp.where(beta == 0, jnp.zeros((), acc), self.astype(acc) * jnp.asarray(beta).astype(acc))
    return (base + scaled).astype(dtype)


def _keep_acc(a, b):
    """The product in the accumulation dtype (for addmm-like ops that round once at the end)."""
    acc = opmath_dtype(a.dtype)
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


def _grouped_mm_meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    # CUDA's kernel takes bfloat16 only; CPU's (and ours) any floating type.
    low = torch.bfloat16
    out = aten._grouped_mm.default(mat_a.to(low), mat_b.to(low), offs,
                                   None if bias is None else bias.to(low), None)
    return out.to(out_dtype or mat_a.dtype)


@lowers(aten._grouped_mm.default, meta=_grouped_mm_meta)
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """Matrix products over groups: `offs` (int32 cumulative ends) splits the 2-D operand's rows
    (2-D x 3-D), its columns (3-D x 2-D) or the shared inner dimension (2-D x 2-D)."""
    dtype = jnp.promote_types(self.dtype, jnp.float32)
    a, b = self.astype(dtype), mat2.astype(dtype)
    if a.ndim == 3 and b.ndim == 3:
        out = jnp.matmul(a, b)
    elif a.ndim == 2 and b.ndim == 3:
        out = jnp.einsum("mk,gkn,gm->mn", a, b, _groups(offs, a.shape[0]))
    elif a.ndim == 3:
        out = jnp.einsum("gmk,kn,gn->mn", a, b, _groups(offs, b.shape[1]))
    else:
        out = jnp.einsum("mk,kn,gk->gmn", a, b, _groups(offs, a.shape[1]))
    if bias is not None:
        out = out + bias.astype(dtype)
    return out


def grouped_rows_mm(input, weight, offs):
    """transformers' `grouped_mm_fallback` (its MoE experts without `_grouped_mm`): rows of `input`
    (sorted by expert) times their expert's (in, out) weight; rows past the last offset are zero.
    Registered when transformers defines the op (integrations/huggingface.py)."""
    return grouped_mm(input, weight, offs).astype(input.dtype)


def grouped_rows_mm_backward(input, weight, offs, grad_output):
    """The gradients of `grouped_rows_mm` for its input and weight (transformers'
    `grouped_mm_fallback_backward`): each expert's rows only."""
    dtype = jnp.promote_types(input.dtype, jnp.float32)
    groups = _groups(offs, input.shape[0])
    grad = grad_output.astype(dtype)
    grad_input = jnp.einsum("mn,gkn,gm->mk", grad, weight.astype(dtype), groups)
    grad_weight = jnp.einsum("mk,mn,gm->gkn", input.astype(dtype), grad, groups)
    return grad_input.astype(input.dtype), grad_weight.astype(weight.dtype)


def _groups(offs, n):
    """One-hot (groups, n): which group each of n positions belongs to; positions past the last
    offset belong to none (their results are zero)."""
    position = jnp.arange(n)
    starts = jnp.concatenate([jnp.zeros(1, offs.dtype), offs[:-1]])
    return ((position[None, :] >= starts[:, None]) & (position[None, :] < offs[:, None])).astype(jnp.float32)


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


# ----- LDL^T (Bunch-Kaufman)
# CPU runs LAPACK's sytrf (hetrf for complex Hermitian) on the lower triangle and sytrs (hetrs) to
# solve. The factor is not unique (it depends on the pivots), so these follow the unblocked LAPACK
# algorithm (sytf2/hetf2, lower) step by step: the same pivot tests with alpha = (1 + sqrt(17)) / 8
# and |re| + |im| as the size of a complex entry, the same interchanges (only inside the trailing
# submatrix; earlier columns of L are not permuted) and the same storage: D's 1x1 and 2x2 blocks on
# the diagonal and subdiagonal, L's multipliers below, 1-based pivots, negative for both columns of
# a 2x2 block. Blocked sytrf makes the same choices in exact arithmetic. The working matrix is kept
# whole (symmetric, or Hermitian with a real diagonal), so an interchange is a permutation of it.

def _bunch_kaufman_alpha(dtype):
    """(1 + sqrt(17)) / 8 computed in the working (real) precision, as LAPACK does."""
    one, seventeen = np.asarray(1, dtype), np.asarray(17, dtype)
    return (one + np.sqrt(seventeen)) / np.asarray(8, dtype)


class _Symmetry:
    """What separates the symmetric (sytf2) and the Hermitian (hetf2) algorithms."""

    def __init__(self, dtype, hermitian):
        self.complex = jnp.issubdtype(dtype, jnp.complexfloating)
        self.hermitian = hermitian and self.complex

    def conj(self, x):
        return jnp.conj(x) if self.hermitian else x

    def size(self, x):
        """LAPACK's magnitude for pivot tests (cabs1 for complex)."""
        return jnp.abs(x.real) + jnp.abs(x.imag) if self.complex else jnp.abs(x)

    def diagonal_size(self, x):
        return jnp.abs(x.real) if self.hermitian else self.size(x)

    def diagonal(self, x):
        """A diagonal entry as the algorithm reads it (hetf2 drops its imaginary part)."""
        return x.real if self.hermitian else x

    def whole(self, x, rows):
        """The symmetric (Hermitian, with a real diagonal) matrix whose lower triangle is x's."""
        diagonal = x.real.astype(x.dtype) if self.hermitian else x
        full = jnp.where(rows[:, None] > rows[None, :], x, self.conj(x.T))
        return jnp.where(rows[:, None] == rows[None, :], diagonal, full)


def _swap_trailing(work, k, a, b, rows):
    """Interchanges rows and columns a and b (both >= k) of the trailing submatrix work[k:, k:]."""
    perm = jnp.where(rows == a, b, jnp.where(rows == b, a, rows))
    trailing = (rows[:, None] >= k) & (rows[None, :] >= k)
    return jnp.where(trailing, work[perm][:, perm], work)


def _ldl_choose_pivot(work, k, rows, sym, alpha):
    """(kp, kstep, singular): LAPACK's pivot tests on column k of the trailing submatrix."""
    absakk = sym.diagonal_size(work[k, k])
    below = jnp.where(rows > k, sym.size(work[:, k]), -1)
    imax = jnp.argmax(below)
    colmax = jnp.maximum(below[imax], 0)
    # the largest off-diagonal size in row (= column) imax of the trailing submatrix
    rowmax = jnp.max(jnp.where((rows >= k) & (rows != imax), sym.size(work[imax]), -1))
    no_swap = (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / rowmax))
    one_by_one = no_swap | (sym.diagonal_size(work[imax, imax]) >= alpha * rowmax)
    singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
    kp = jnp.where(singular | no_swap, k, imax)
    kstep = jnp.where(singular | one_by_one, 1, 2)
    return kp, kstep, singular


def _ldl_update(work, k, first, updated, columns, rows, sym):
    """work with its trailing part from `first` on replaced by `updated` (made whole again) and
    columns k.. of L below it by `columns`."""
    after = rows >= first
    work = jnp.where(after[:, None] & after[None, :], sym.whole(updated, rows), work)
    for j, column in enumerate(columns):
        work = work.at[:, k + j].set(jnp.where(after, column, work[:, k + j]))
    return work


def _ldl_one_by_one(work, k, rows, sym):
    """Rank-1 update of work[k+1:, k+1:] by column k and d = work[k, k]."""
    r = 1 / sym.diagonal(work[k, k])
    x = work[:, k]
    updated = work - x[:, None] * (r * sym.conj(x))[None, :]
    return _ldl_update(work, k, k + 1, updated, [x * r], rows, sym)


def _ldl_two_by_two(work, k, rows, sym):
    """Rank-2 update of work[k+2:, k+2:] by columns k, k+1 and the 2x2 block D at (k, k)."""
    col_k, col_k1 = work[:, k], work[:, k + 1]
    if sym.hermitian:
        d = jnp.abs(work[k + 1, k])
        d11 = work[k + 1, k + 1].real / d
        d22 = work[k, k].real / d
        d21 = work[k + 1, k] / d
        d = (1 / (d11 * d22 - 1)) / d
        wk = d * (d11 * col_k - d21 * col_k1)
        wkp1 = d * (d22 * col_k1 - jnp.conj(d21) * col_k)
    else:
        d21 = work[k + 1, k]
        d11 = work[k + 1, k + 1] / d21
        d22 = work[k, k] / d21
        d21 = (1 / (d11 * d22 - 1)) / d21
        wk = d21 * (d11 * col_k - col_k1)
        wkp1 = d21 * (d22 * col_k1 - col_k)
    updated = work - col_k[:, None] * sym.conj(wk)[None, :] - col_k1[:, None] * sym.conj(wkp1)[None, :]
    return _ldl_update(work, k, k + 2, updated, [wk, wkp1], rows, sym)


def _ldl_factor_lower(a, sym):
    """sytf2/hetf2 (lower) on one matrix, its lower triangle read: (LD, pivots, info)."""
    n = a.shape[-1]
    rows = jnp.arange(n)
    alpha = _bunch_kaufman_alpha(jnp.finfo(a.dtype).dtype)

    def step(state):
        k, work, pivots, info = state
        kp, kstep, singular = _ldl_choose_pivot(work, k, rows, sym, alpha)
        work = _swap_trailing(work, k, k + kstep - 1, kp, rows)
        work = jnp.where(singular, work, jnp.where(kstep == 1, _ldl_one_by_one(work, k, rows, sym),
                                                   _ldl_two_by_two(work, jnp.minimum(k, n - 2), rows, sym)))
        code = jnp.where(kstep == 1, kp + 1, -(kp + 1)).astype(jnp.int32)
        pivots = jnp.where((rows == k) | ((rows == k + 1) & (kstep == 2)), code, pivots)
        info = jnp.where((info == 0) & singular, k + 1, info).astype(jnp.int32)
        return k + kstep, work, pivots, info

    state = (jnp.int32(0), sym.whole(a, rows), jnp.zeros(n, jnp.int32), jnp.int32(0))
    _, work, pivots, info = lax.while_loop(lambda s: s[0] < n, step, state)
    return jnp.tril(work), pivots, info


def _swap_rows(b, i, j):
    bi, bj = b[i], b[j]
    return b.at[i].set(bj).at[j].set(bi)


def _ldl_solve_lower(ld, pivots, b, sym):
    """sytrs/hetrs (lower): solves A X = B given the factor LD and pivots of one matrix."""
    n = ld.shape[-1]
    rows = jnp.arange(n)

    def forward(state):  # L D Y = P B, a block at a time
        k, b = state
        p = pivots[k]
        two = p < 0
        second = jnp.minimum(k + 1, n - 1)
        b = jnp.where(two, _swap_rows(b, second, -p - 1), _swap_rows(b, k, p - 1))
        b = b - jnp.where((rows > k + two)[:, None], ld[:, k][:, None] * b[k][None, :], 0)
        b = b - jnp.where(two & (rows > k + 1)[:, None], ld[:, second][:, None] * b[second][None, :], 0)
        single = b.at[k].multiply(1 / sym.diagonal(ld[k, k]))
        akm1k = ld[second, k]
        akm1 = ld[k, k] / sym.conj(akm1k)
        ak = ld[second, second] / akm1k
        denom = akm1 * ak - 1
        bkm1, bk = b[k] / sym.conj(akm1k), b[second] / akm1k
        block = b.at[k].set((ak * bkm1 - bk) / denom).at[second].set((akm1 * bk - bkm1) / denom)
        return k + jnp.where(two, 2, 1), jnp.where(two, block, single)

    def backward(state):  # L^T P^T X = Y (L^H for Hermitian), from the last block up
        k, b = state
        p = pivots[k]
        two = p < 0
        first = jnp.maximum(k - 1, 0)
        after = (rows > k)[:, None]

        def column_dot(j):
            return jnp.sum(jnp.where(after, b * sym.conj(ld[:, j])[:, None], 0), axis=0)

        b = b.at[k].add(-column_dot(k))
        b = jnp.where(two, b.at[first].add(-column_dot(first)), b)
        b = _swap_rows(b, k, jnp.where(two, -p, p) - 1)
        return k - jnp.where(two, 2, 1), b

    b = lax.while_loop(lambda s: s[0] < n, forward, (jnp.int32(0), b))[1]
    return lax.while_loop(lambda s: s[0] >= 0, backward, (jnp.int32(n - 1), b))[1]


@lowers(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(self, *, hermitian=False, check_errors=False):
    n = self.shape[-1]
    batch = self.shape[:-2]
    if n == 0 or self.size == 0:
        return jnp.zeros(self.shape, self.dtype), jnp.zeros(batch + (n,), jnp.int32), jnp.zeros(batch, jnp.int32)
    sym = _Symmetry(self.dtype, hermitian)
    LD, pivots, info = jax.vmap(lambda a: _ldl_factor_lower(a, sym))(self.reshape(-1, n, n))
    return LD.reshape(self.shape), pivots.reshape(batch + (n,)), info.reshape(batch)


@lowers(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
    LD, B = _broadcast_batch(LD, B)
    n, k = B.shape[-2:]
    if n == 0 or B.size == 0:
        return B
    sym = _Symmetry(LD.dtype, hermitian)
    pivots = jnp.broadcast_to(pivots, LD.shape[:-1])
    X = jax.vmap(lambda ld, p, b: _ldl_solve_lower(ld, p, b, sym))(
        LD.reshape(-1, n, n), pivots.reshape(-1, n), B.reshape(-1, n, k))
    return X.reshape(B.shape)


# ----- QR, SVD, eigh

@lowers(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), A.dtype), jnp.linalg.qr(A, mode="r")
    return tuple(jnp.linalg.qr(A, mode=mode))


def _geqrf_meta(A):
    # PyTorch has no meta kernel for geqrf; LAPACK's result is column-major, as on CPU.
    *batch, m, n = A.shape
    a = torch.empty((*batch, n, m), dtype=A.dtype, device="meta").mT
    return a, torch.empty((*batch, min(m, n)), dtype=A.dtype, device="meta")


@lowers(aten.geqrf.default, meta=_geqrf_meta)
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

# matrix_exp follows CPU's algorithm step by step (Bader, Blanes and Casas, "Computing the Matrix
# Exponential with an Optimized Taylor Polynomial Approximation", 2019): Taylor polynomials of degree
# 1, 2, 4, 8, 12 or 18 evaluated with few products, picked by the 1-norm, and scaling and squaring
# beyond; float32 results then agree with CPU's to rounding, where a Pade scheme (scipy's expm)
# differs by ~1e-3 after the squarings.
_EXPM_THETAS = {  # the largest 1-norm each degree is accurate for, per working precision
    jnp.float32: (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                  5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00),
    jnp.float64: (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
                  4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00),
}
# Degree 12 and 18: B_i = sum_j c[i][j] * P_j over the powers P = (I, A, A^2, A^3[, A^6]).
_EXPM_T12 = (
    (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
    (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989),
    (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230),
    (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359),
)
_EXPM_T18 = (
    (0., -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.),
    (0., 3.97849749499645077844e-01, 1.36783778460411720168e+00, 4.98289622525382669416e-01,
     -6.37898194594723280150e-04),
    (-1.09676396052962061844e+01, 1.68015813878906206114e+00, 5.71779846478865511061e-02,
     -6.98210122488052056106e-03, 3.34975017086070470649e-05),
    (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
     2.95552570429315521194e-02, -1.39180257516060693404e-05),
    (0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05),
)


def _combine(powers, coefficients, real):
    """sum_j c_j * P_j in order, with the coefficients rounded to the working precision."""
    total = powers[0] * np.asarray(coefficients[0], real)
    for p, c in zip(powers[1:], coefficients[1:]):
        total = total + p * np.asarray(c, real)
    return total


def _expm_powers(a, count):
    """(I, A, A^2, A^3, A^6)[:count]."""
    powers = [jnp.broadcast_to(_eye_like(a), a.shape), a]
    if count > 2:
        powers.append(a @ a)
    if count > 3:
        powers.append(a @ powers[2])
    if count > 4:
        powers.append(powers[3] @ powers[3])
    return powers


def _expm_taylor(degree, a, real):
    if degree == 1:
        return sum(_expm_powers(a, 2))
    if degree == 2:
        eye, a1, a2 = _expm_powers(a, 3)
        return eye + a1 + a2 / np.asarray(2.0, real)
    if degree == 4:
        p = _expm_powers(a, 3)
        p.append(p[2] @ _combine(p, (1 / 2.0, 1 / 6.0, 1 / 24.0), real))
        return _combine(p, (1.0, 1.0, 0.0, 1.0), real)
    if degree == 8:
        # CPU rounds sqrt(177) and 2/3 to the working precision, then forms the rest in double
        r = float(np.asarray(0.1330413469565007072504e+2, real))
        x3 = float(np.asarray(2.0 / 3.0, real))
        x1, x2 = x3 * ((1.0 + r) / 88.0), x3 * ((1.0 + r) / 352.0)
        x4, x5 = (-271.0 + 29.0 * r) / (315.0 * x3), (-11.0 + 11.0 * r) / (1260.0 * x3)
        x6, x7 = (-99.0 + 11.0 * r) / (5040.0 * x3), (89.0 - r) / (5040.0 * x3)
        y2 = (857.0 - 58.0 * r) / 630.0
        p = _expm_powers(a, 3)
        p.append(p[2] @ _combine(p[1:3], (x1, x2), real))
        p.append(_combine(p[2:4], (x3, 1.0), real) @ _combine(p[0:4], (x4, x5, x6, x7), real))
        return _combine(p, (1.0, 1.0, y2, 0.0, 1.0), real)
    if degree == 12:
        p = _expm_powers(a, 4)
        b = [_combine(p, row, real) for row in _EXPM_T12]
        a6 = b[2] + b[3] @ b[3]
        return b[0] + (b[1] + a6) @ a6
    p = _expm_powers(a, 5)
    b = [_combine(p, row, real) for row in _EXPM_T18]
    a9 = b[3] + b[0] @ b[4]
    return b[1] + (b[2] + a9) @ a9


def _expm_scale_square(a, norm, theta, real):
    """Degree 18 on A / 2^s, squared s times, s = max(0, ceil(log2(|A|_1 / theta))) per matrix."""
    s = jnp.clip(jnp.ceil(jnp.log2(norm / np.asarray(theta, real))), 0)
    scaled = a * jnp.exp2(-s)[:, None, None].astype(a.dtype)
    squarings = jnp.nan_to_num(s, nan=0).astype(jnp.int32)

    def square(state):
        i, x = state
        return i + 1, jnp.where((i < squarings)[:, None, None], x @ x, x)

    return lax.while_loop(lambda state: state[0] < jnp.max(squarings), square,
                          (jnp.int32(0), _expm_taylor(18, scaled, real)))[1]


@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(self):
    acc = opmath_dtype(self.dtype)
    if acc is not None:  # half types: CPU's scheme in float32, rounded once
        return linalg_matrix_exp(self.astype(acc)).astype(self.dtype)
    n = self.shape[-1]
    if n == 0 or self.size == 0:
        return self
    if n == 1:
        return jnp.exp(self)
    a = self.reshape(-1, n, n)
    real = jnp.finfo(a.dtype).dtype
    thetas = _EXPM_THETAS[jnp.float32 if real == jnp.float32 else jnp.float64]
    norm = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)
    if a.shape[0] > 1:  # CPU takes degree 18 with scaling for every matrix of a batch
        return _expm_scale_square(a, norm, thetas[5], real).reshape(self.shape)
    # One matrix: the lowest degree whose bound holds (a NaN norm gives NaN, as on CPU).
    nrm = norm[0]
    branch = jnp.where(jnp.isnan(nrm), 6, jnp.where(nrm >= thetas[4], 5, jnp.searchsorted(
        jnp.asarray(thetas[:5], real), nrm, side="left")))
    branches = [lambda x, d=d: _expm_taylor(d, x, real) for d in (1, 2, 4, 8, 12)]
    branches += [lambda x: _expm_scale_square(x, norm, thetas[5], real),
                 lambda x: jnp.full_like(x, jnp.nan)]
    return lax.switch(branch, branches, a).reshape(self.shape)


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


# ------------------------------------------------------------------ padding rules
# How each op stays exact on operands padded along a growing axis (padding.py).
# (operand, contracted axis) of each matrix product: padded entries of both become 0
def _contraction(*operands):
    return lambda call: Padding(fills=tuple(Fill(name, (axis,), 0) for name, axis in operands))


pads(aten.mm.default)(_contraction(("self", 1), ("mat2", 0)))
pads(aten.addmm.default)(_contraction(("mat1", 1), ("mat2", 0)))
pads(aten.bmm.default)(_contraction(("self", 2), ("mat2", 1)))
