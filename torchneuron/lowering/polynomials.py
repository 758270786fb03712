"""The orthogonal polynomials of torch.special: P_n(x) by their three-term recurrences.

n is a tensor (truncated to an integer, as PyTorch does; negative n gives 0), so the recurrence
runs in one `lax.while_loop` up to the largest n, keeping each element's P_n as it passes.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from . import INT_TO_FLOAT, aten, lowers


def _evaluate(x, n, first, step):
    """P_n(x) from P_0 = 1, P_1 = first(x) and P_{k+1} = step(x, k, P_k, P_{k-1})."""
    dtype = jnp.result_type(x.dtype, jnp.float32) if not jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
    x = jnp.asarray(x, dtype)
    n = jnp.trunc(jnp.asarray(n)).astype(jnp.int64)
    x, n = jnp.broadcast_arrays(x, n)
    p0, p1 = jnp.ones_like(x), first(x)
    out = jnp.where(n == 0, p0, jnp.where(n == 1, p1, jnp.zeros_like(x)))

    def cond(carry):
        return carry[0] < jnp.max(n, initial=0)

    def body(carry):
        k, prev, cur, out = carry
        nxt = step(x, k.astype(dtype), cur, prev)
        return k + 1, cur, nxt, jnp.where(n == k + 1, nxt, out)

    return lax.while_loop(cond, body, (jnp.int64(1), p0, p1, out))[3]


def _chebyshev(first):
    return first, lambda x, k, cur, prev: 2 * x * cur - prev


_CHEBYSHEV_T = _chebyshev(lambda x: x)
_CHEBYSHEV_U = _chebyshev(lambda x: 2 * x)
_CHEBYSHEV_V = _chebyshev(lambda x: 2 * x - 1)
_CHEBYSHEV_W = _chebyshev(lambda x: 2 * x + 1)


def _register(ops, first, step, shift=False):
    """Lower `ops` (a polynomial's Tensor, x_scalar and n_scalar overloads); `shift` evaluates
    at 2x - 1 (T*_n(x) = T_n(2x - 1), and so on)."""
    @lowers(*ops, promote=INT_TO_FLOAT, promote_args=("x",))
    def polynomial(x, n):
        return _evaluate(2 * x - 1 if shift else x, n, first, step)


_register((aten.special_chebyshev_polynomial_t.default, aten.special_chebyshev_polynomial_t.x_scalar,
           aten.special_chebyshev_polynomial_t.n_scalar), *_CHEBYSHEV_T)
_register((aten.special_chebyshev_polynomial_u.default, aten.special_chebyshev_polynomial_u.x_scalar,
           aten.special_chebyshev_polynomial_u.n_scalar), *_CHEBYSHEV_U)
_register((aten.special_chebyshev_polynomial_v.default, aten.special_chebyshev_polynomial_v.x_scalar,
           aten.special_chebyshev_polynomial_v.n_scalar), *_CHEBYSHEV_V)
_register((aten.special_chebyshev_polynomial_w.default, aten.special_chebyshev_polynomial_w.x_scalar,
           aten.special_chebyshev_polynomial_w.n_scalar), *_CHEBYSHEV_W)
_register((aten.special_shifted_chebyshev_polynomial_t.default,
           aten.special_shifted_chebyshev_polynomial_t.x_scalar,
           aten.special_shifted_chebyshev_polynomial_t.n_scalar), *_CHEBYSHEV_T, shift=True)
_register((aten.special_shifted_chebyshev_polynomial_u.default,
           aten.special_shifted_chebyshev_polynomial_u.x_scalar,
           aten.special_shifted_chebyshev_polynomial_u.n_scalar), *_CHEBYSHEV_U, shift=True)
_register((aten.special_shifted_chebyshev_polynomial_v.default,
           aten.special_shifted_chebyshev_polynomial_v.x_scalar,
           aten.special_shifted_chebyshev_polynomial_v.n_scalar), *_CHEBYSHEV_V, shift=True)
_register((aten.special_shifted_chebyshev_polynomial_w.default,
           aten.special_shifted_chebyshev_polynomial_w.x_scalar,
           aten.special_shifted_chebyshev_polynomial_w.n_scalar), *_CHEBYSHEV_W, shift=True)
_register((aten.special_hermite_polynomial_h.default, aten.special_hermite_polynomial_h.x_scalar,
           aten.special_hermite_polynomial_h.n_scalar),
          lambda x: 2 * x, lambda x, k, cur, prev: 2 * x * cur - 2 * k * prev)
_register((aten.special_hermite_polynomial_he.default, aten.special_hermite_polynomial_he.x_scalar,
           aten.special_hermite_polynomial_he.n_scalar),
          lambda x: x, lambda x, k, cur, prev: x * cur - k * prev)
_register((aten.special_laguerre_polynomial_l.default, aten.special_laguerre_polynomial_l.x_scalar,
           aten.special_laguerre_polynomial_l.n_scalar),
          lambda x: 1 - x, lambda x, k, cur, prev: ((2 * k + 1 - x) * cur - k * prev) / (k + 1))
_register((aten.special_legendre_polynomial_p.default, aten.special_legendre_polynomial_p.x_scalar,
           aten.special_legendre_polynomial_p.n_scalar),
          lambda x: x, lambda x, k, cur, prev: ((2 * k + 1) * x * cur - k * prev) / (k + 1))
