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


_FAMILIES = {
    "chebyshev_polynomial_t": _chebyshev(lambda x: x),
    "chebyshev_polynomial_u": _chebyshev(lambda x: 2 * x),
    "chebyshev_polynomial_v": _chebyshev(lambda x: 2 * x - 1),
    "chebyshev_polynomial_w": _chebyshev(lambda x: 2 * x + 1),
    "hermite_polynomial_h": (lambda x: 2 * x, lambda x, k, cur, prev: 2 * x * cur - 2 * k * prev),
    "hermite_polynomial_he": (lambda x: x, lambda x, k, cur, prev: x * cur - k * prev),
    "laguerre_polynomial_l": (lambda x: 1 - x, lambda x, k, cur, prev: ((2 * k + 1 - x) * cur - k * prev) / (k + 1)),
    "legendre_polynomial_p": (lambda x: x, lambda x, k, cur, prev: ((2 * k + 1) * x * cur - k * prev) / (k + 1)),
}


def _register(name, first, step, shift=False):
    packet = getattr(aten, f"special_{name}")
    ops = [packet.default, packet.x_scalar, packet.n_scalar]

    @lowers(*ops, promote=INT_TO_FLOAT, promote_args=("x",))
    def polynomial(x, n):
        return _evaluate(2 * x - 1 if shift else x, n, first, step)


for _name, (_first, _step) in _FAMILIES.items():
    _register(_name, _first, _step)
    if _name.startswith("chebyshev"):  # T*_n(x) = T_n(2x - 1), and so on
        _register("shifted_" + _name, _first, _step, shift=True)
