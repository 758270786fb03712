"""Lowerings: fused scaled dot-product attention (PyTorch's "overrideable" SDPA backend).

F.scaled_dot_product_attention on neuron runs here when the device's backend choice
(`_fused_sdp_choice`, csrc/neuron_core.cpp) picks the overrideable backend: one computation
for the forward, one for the backward, instead of the math path's matmul, softmax and matmul
as separate ops. The composite has already turned a boolean mask into an additive one (0 where
attended, -inf where not). Keys and values may have fewer heads than queries (GQA, or one
broadcast head): query head h reads key/value head h // (q_heads // kv_heads), as the math
path's repeat_interleave does.

Half-precision inputs compute scores, softmax and the weighted sum in float32 and round once.
A row with every key masked out gives zeros (its output and its gradients), as CPU's math
path (a "safe" softmax) does.
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from . import aten, lowers, opmath_dtype


def _scale(query, scale):
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def _split_heads(x, kv_heads):
    """(B, Hq, ...) as (B, Hkv, Hq // Hkv, ...): the q heads grouped by the kv head they read."""
    return x.reshape((x.shape[0], kv_heads, x.shape[1] // kv_heads) + x.shape[2:])


def _scores(query, key, attn_bias, is_causal, scale):
    """Scaled scores in float32, masked, shaped (B, Hkv, G, L, S)."""
    kv_heads = key.shape[1]
    q = _split_heads(query, kv_heads)
    s = jnp.einsum("bhgld,bhsd->bhgls", q, key, preferred_element_type=jnp.float32) * scale
    if attn_bias is not None:
        bias = jnp.broadcast_to(attn_bias.astype(jnp.float32), query.shape[:2] + s.shape[-2:])
        s = s + _split_heads(bias, kv_heads)
    if is_causal:
        L, S = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((L, S), bool)), s, -jnp.inf)
    return s


def _weights(s, lse):
    """softmax(s) from its logsumexp; zero on rows with every key masked (lse = -inf)."""
    finite = jnp.isfinite(lse)[..., None]
    return jnp.where(finite, jnp.exp(s - jnp.where(finite, lse[..., None], 0.0)), 0.0)


@lowers(aten._scaled_dot_product_fused_attention_overrideable.default)
def sdpa_overrideable(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                      return_debug_mask=False, *, scale=None):
    if dropout_p > 0.0:  # _fused_sdp_choice sends dropout to the math path
        raise NotImplementedError("neuron: fused attention has no dropout; use the math path "
                                  "(torch.nn.attention.sdpa_kernel(SDPBackend.MATH))")
    s = _scores(query, key, attn_bias, is_causal, _scale(query, scale))
    m = jnp.max(s, axis=-1)
    safe_m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - safe_m[..., None])
    total = jnp.sum(e, axis=-1, keepdims=True)
    p = e / jnp.where(total > 0, total, 1.0)  # zeros where every key is masked
    lse = jnp.log(total[..., 0]) + safe_m  # -inf where every key is masked
    acc = opmath_dtype(value.dtype) or value.dtype
    out = jnp.einsum("bhgls,bhsd->bhgld", p.astype(acc), value.astype(acc))
    b, hq, L = query.shape[:3]
    out = out.reshape((b, hq, L, value.shape[-1])).astype(query.dtype)
    lse = lse.reshape((b, hq, L))
    zero = jnp.zeros((), jnp.int64)
    # cum_seq_q/k and the debug mask are undefined (dense inputs, no debug); max_q/k are the lengths
    return out, lse, None, None, L, key.shape[2], zero, zero, None


@lowers(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def sdpa_overrideable_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                               cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                               philox_offset, *, scale=None):
    scale = _scale(query, scale)
    kv_heads = key.shape[1]
    s = _scores(query, key, attn_bias, is_causal, scale)
    p = _weights(s, _split_heads(logsumexp, kv_heads))
    f32 = jnp.float32
    do = _split_heads(grad_out.astype(f32), kv_heads)
    o = _split_heads(out.astype(f32), kv_heads)
    grad_v = jnp.einsum("bhgls,bhgld->bhsd", p, do)
    dp = jnp.einsum("bhgld,bhsd->bhgls", do, value.astype(f32))
    ds = p * (dp - jnp.sum(do * o, axis=-1, keepdims=True))  # gradient of the masked, scaled scores
    grad_q = jnp.einsum("bhgls,bhsd->bhgld", ds, key.astype(f32)) * scale
    grad_k = jnp.einsum("bhgls,bhgld->bhsd", ds, _split_heads(query, kv_heads).astype(f32)) * scale
    grad_q = grad_q.reshape(query.shape).astype(query.dtype)
    grad_bias = None  # the meta kernel makes one whenever there is a bias: zeros where not asked for
    if attn_bias is not None:
        grad_bias = (sum_to(ds.reshape(query.shape[:2] + ds.shape[-2:]), attn_bias.shape) if grad_input_mask[3]
                     else jnp.zeros(attn_bias.shape)).astype(attn_bias.dtype)
    return grad_q, grad_k.astype(key.dtype), grad_v.astype(value.dtype), grad_bias


def sum_to(x, shape):
    """`x` summed over the axes broadcasting expanded from `shape`."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    return jnp.sum(x, axis=axes, keepdims=True).reshape(shape)
