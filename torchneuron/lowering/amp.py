"""Lowerings: the ops GradScaler needs on neuron: unscale-and-check gradients, update the scale.

Both mutate their arguments; the functional overloads lowered here return the new values
and the driver writes them back into the in-place variants' arguments.
"""
from __future__ import annotations

import jax.numpy as jnp

from . import aten, lowers


@lowers(aten._amp_foreach_non_finite_check_and_unscale.default)
def non_finite_check_and_unscale(self, found_inf, inv_scale):
    # found_inf becomes 1 if any gradient holds an inf or NaN (it may already be 1).
    bad = jnp.zeros((), bool)
    for g in self:
        bad = bad | ~jnp.all(jnp.isfinite(g))
    unscaled = [(g.astype(jnp.float32) * inv_scale.reshape(())).astype(g.dtype) for g in self]
    return unscaled, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lowers(aten._amp_update_scale.default)
def update_scale(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    # A step with infs backs off and restarts the count; growth_interval clean steps grow the scale.
    inf = found_inf.reshape(()) > 0
    tracker = growth_tracker + 1
    grow = tracker >= growth_interval
    grown = jnp.where(grow, self * scale_growth_factor, self)
    scale = jnp.where(inf, self * scale_backoff_factor, grown)
    tracker = jnp.where(inf | grow, jnp.zeros_like(growth_tracker), tracker)
    return scale.astype(self.dtype), tracker
