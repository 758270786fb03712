"""Lowerings: the fused optimizer steps torch.optim runs with fused=True (Adam, AdamW, SGD).

The Hugging Face Trainer's default optimizer is AdamW(fused=True). Each lowering is the
functional overload (`_fused_adamw` returns the new params, grads, moments); the driver writes
them back into the in-place `_fused_adamw_`'s lists. The math follows PyTorch's CPU kernels:
gradients are unscaled by `grad_scale` (and written back unscaled), a step with `found_inf` set
changes nothing, half-precision tensors compute in float32. `lr` and the other hyperparameters are
traced, so a learning-rate schedule never compiles a new program.
"""
from __future__ import annotations

import jax.numpy as jnp

from . import aten, functional_of, lowers, opmath

_HYPER = ("lr", "beta1", "beta2", "weight_decay", "eps", "momentum", "dampening")


def _unscaled(grads, grad_scale):
    if grad_scale is None:
        return list(grads)
    scale = grad_scale.reshape(())
    return [(opmath(g) / scale.astype(opmath(g).dtype)).astype(g.dtype) for g in grads]


def _unless_inf(found_inf, new_lists, old_lists):
    """A step whose gradients held an inf or NaN (GradScaler's found_inf) leaves every tensor as it was."""
    if found_inf is None:
        return new_lists
    skip = found_inf.reshape(()) == 1
    return [[jnp.where(skip, old, new) for new, old in zip(news, olds)] for news, olds in zip(new_lists, old_lists)]


def _adam(decoupled: bool):
    def step(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
             weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        grads_out = _unscaled(grads, grad_scale)
        params, avgs, avg_sqs, maxes = [], [], [], []
        for i, (param, grad, avg, avg_sq) in enumerate(zip(self, grads_out, exp_avgs, exp_avg_sqs)):
            p, g, m, v = opmath(param), opmath(grad), opmath(avg), opmath(avg_sq)
            compute = p.dtype
            step_count = state_steps[i].reshape(()).astype(jnp.float64)
            bias_correction1 = 1 - jnp.power(beta1, step_count)
            bias_correction2_sqrt = jnp.sqrt(1 - jnp.power(beta2, step_count))
            step_size = (lr / bias_correction1).astype(compute)
            c = {name: value.astype(compute) for name, value in
                 (("lr", lr), ("beta2", beta2), ("weight_decay", weight_decay), ("eps", eps))}
            g = -g if maximize else g
            decays = weight_decay != 0  # as the kernel's branch: a zero decay leaves inf params alone
            if decoupled:
                p = jnp.where(decays, p - c["lr"] * c["weight_decay"] * p, p)
            else:
                g = jnp.where(decays, g + p * c["weight_decay"], g)
            m = m + (1 - beta1).astype(compute) * (g - m)  # exp_avg.lerp_(grad, 1 - beta1)
            v = v * c["beta2"] + (1 - beta2).astype(compute) * g * g
            if amsgrad:
                top = jnp.maximum(opmath(max_exp_avg_sqs[i]), v)
                maxes.append(top.astype(max_exp_avg_sqs[i].dtype))
            else:
                top = v
            denom = jnp.sqrt(top) / bias_correction2_sqrt.astype(compute) + c["eps"]
            params.append((p - step_size * m / denom).astype(param.dtype))
            avgs.append(m.astype(avg.dtype))
            avg_sqs.append(v.astype(avg_sq.dtype))
        maxes = maxes if amsgrad else list(max_exp_avg_sqs)
        olds = [list(self), list(grads), list(exp_avgs), list(exp_avg_sqs), list(max_exp_avg_sqs)]
        return tuple(_unless_inf(found_inf, [params, grads_out, avgs, avg_sqs, maxes], olds))

    return step


lowers(aten._fused_adam.default, aten._fused_adam.tensor_lr, traced=_HYPER)(_adam(decoupled=False))
lowers(aten._fused_adamw.default, aten._fused_adamw.tensor_lr, traced=_HYPER)(_adam(decoupled=True))


def _sgd_meta(self, grads, momentum_buffer_list, **kwargs):
    return ([p.clone() for p in self], [g.clone() for g in grads], [b.clone() for b in momentum_buffer_list])


@lowers(aten._fused_sgd.default, aten._fused_sgd.tensor_lr, traced=_HYPER, meta=_sgd_meta)
def fused_sgd(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
              is_first_step, grad_scale=None, found_inf=None):
    grads_out = _unscaled(grads, grad_scale)
    params, buffers = [], []
    has_momentum = len(momentum_buffer_list) > 0
    for i, (param, grad) in enumerate(zip(self, grads_out)):
        p, g = opmath(param), opmath(grad)
        compute = p.dtype
        g = -g if maximize else g
        g = jnp.where(weight_decay != 0, g + p * weight_decay.astype(compute), g)
        if has_momentum:
            mu = momentum.astype(compute)
            if is_first_step:
                buf = g
            else:
                buf = mu * opmath(momentum_buffer_list[i]) + (1 - dampening).astype(compute) * g
            buffers.append(buf.astype(momentum_buffer_list[i].dtype))
            g = g + mu * buf if nesterov else buf
        params.append((p - lr.astype(compute) * g).astype(param.dtype))
    olds = [list(self), list(grads), list(momentum_buffer_list)]
    return tuple(_unless_inf(found_inf, [params, grads_out, buffers], olds))


# The fused optimizers write several tensor lists; their functionals return each list's new values.
for _name in ("adam", "adamw", "sgd"):
    for _overload in ("default", "tensor_lr"):
        functional_of(getattr(getattr(aten, f"_fused_{_name}_"), _overload),
                      getattr(getattr(aten, f"_fused_{_name}"), _overload))
