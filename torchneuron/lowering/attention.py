"""Lowerings: fused scaled dot-product attention (PyTorch's "overrideable" SDPA backend).

F.scaled_dot_product_attention on neuron runs here when the device's backend choice
(`_fused_sdp_choice`, csrc/neuron_core.cpp) picks the overrideable backend: one computation
for the forward, one for the backward, instead of the math path's matmul, softmax and matmul
as separate ops. The composite has already turned a boolean mask into an additive one (0 where
attended, -inf where not). Keys and values may have fewer heads than queries (GQA, or one
broadcast head): query head h reads key/value head h // (q_heads // kv_heads), as the math
path's repeat_interleave does; their gradients sum over the q heads that read them.

Dropout (dropout_p > 0) draws a keep mask over the attention weights from the device generator
(the op then takes a PRNG key: `random` below). The forward returns the key's two words as
`philox_seed` and `philox_offset`, so the backward draws the same mask again rather than keeping it.

Half-precision inputs compute scores, softmax and the weighted sum in float32 and round once.
A row with every key masked out gives zeros (its output and its gradients), as CPU's math
path (a "safe" softmax) does.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .. import config
from . import aten, lowers, opmath_dtype, sizes_from
from .padding import Fill, Padding, pads

# XLA:CPU runs attention faster one (batch, head) at a time in a loop than over the whole batch at
# once (the GPT's (4, 4, 128, 8): forward 1.45x, backward 1.15x): each step's scores stay in cache.
# On accelerators a loop would serialise what runs in parallel: there the whole batch is one step.
_LOOP_OVER_HEADS = config.PLATFORM == "cpu"
# Below this many scores (B * H * L * S) the loop gains nothing and costs compile time: a decode
# step's attention, (1, 4, 1, 32), compiles in 0.14 s without it and 0.24 s with it, and runs faster.
_LOOP_MIN_SCORES = 1 << 16


def _scale(query, scale):
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def _expand_heads(x, q_heads):
    """(B, Hkv, ...) keys or values as (B, Hq, ...): each kv head repeated for the q heads that read
    it. Everything then computes per q head in 4-D (XLA:CPU runs the 5-D grouped form's contractions
    over two axes 2.5x slower)."""
    kv_heads = x.shape[1]
    return x if kv_heads == q_heads else jnp.repeat(x, q_heads // kv_heads, axis=1)


def _reduce_heads(grad, kv_heads):
    """A gradient per q head, (B, Hq, ...), summed into its kv head's, (B, Hkv, ...)."""
    b, q_heads = grad.shape[:2]
    return grad if q_heads == kv_heads else grad.reshape((b, kv_heads, q_heads // kv_heads) + grad.shape[2:]).sum(2)


def _scores(query, keys, attn_bias, is_causal, scale):
    """Scaled scores in float32, masked, shaped (B, Hq, L, S); `keys` already expanded to Hq heads."""
    s = jnp.einsum("bhld,bhsd->bhls", query, keys, preferred_element_type=jnp.float32) * scale
    if attn_bias is not None:
        s = s + jnp.broadcast_to(attn_bias.astype(jnp.float32), s.shape)
    if is_causal:
        L, S = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((L, S), bool)), s, -jnp.inf)
    return s


def _weights(s, lse):
    """softmax(s) from its logsumexp; zero on rows with every key masked (lse = -inf)."""
    finite = jnp.isfinite(lse)[..., None]
    return jnp.where(finite, jnp.exp(s - jnp.where(finite, lse[..., None], 0.0)), 0.0)


def _per_head(fn, *arrays):
    """`fn` of 4-D (B, H, ...) arrays (None: absent; the first the queries or the gradient of the
    output, (B, H, L, ...), the third keys or values, (B, H, S, ...)), whose results are (B, H, ...) too,
    run one (batch, head) pair at a time on XLA:CPU (`_LOOP_OVER_HEADS`) for large problems, at
    once elsewhere."""
    b, h, length = arrays[0].shape[:3]
    if not _LOOP_OVER_HEADS or b * h * length * arrays[2].shape[2] < _LOOP_MIN_SCORES:
        return fn(*arrays)
    present = [i for i, a in enumerate(arrays) if a is not None]

    def one(slices):
        full = list(arrays)
        for i, x in zip(present, slices):
            full[i] = x
        return fn(*full)

    outs = jax.lax.map(one, tuple(arrays[i].reshape((b * h, 1, 1) + arrays[i].shape[2:]) for i in present))
    return tuple(o.reshape((b, h) + o.shape[3:]) for o in outs)


def _dropout_scale(s_shape, dropout_p, key_words):
    """The forward's dropout as a factor on the weights: kept / (1 - p), 0 where dropped; the key
    comes back from its two words (the forward's philox_seed and philox_offset)."""
    if dropout_p == 0.0:
        return None
    key = jax.random.wrap_key_data(jnp.stack(key_words).astype(jnp.uint32))
    keep = jax.random.bernoulli(key, 1.0 - dropout_p, s_shape)
    return jnp.where(keep, jnp.float32(1.0 / (1.0 - dropout_p)) if dropout_p < 1.0 else 0.0, 0.0)


def _draws(dropout_p=0.0, **_):
    return dropout_p > 0.0


@sizes_from(aten._scaled_dot_product_fused_attention_overrideable.default)
def sdpa_overrideable_sizes(query, key, value, *args, **kwargs) -> list | None:
    """The fused attention's results' sizes (as its meta kernel gives them): the output, the
    log-sum-exp, two absent tensors, the query's and the key's lengths, the 0-d seed and offset,
    no debug mask."""
    if query.dim() == 4:
        batch, heads, length, _ = query.shape
    elif query.dim() == 3:
        (heads, length, _), batch = query.shape, 1
    else:
        return None
    return [(*query.shape[:-1], value.shape[-1]), (batch, heads, length), None, None, length, key.shape[-2],
            (), (), None]


# (The op's second argument is named `key` in its schema; here that name is the PRNG key the driver
# passes to lowerings that draw, so the attention keys are `keys`: drivers pass them by position.)
@lowers(aten._scaled_dot_product_fused_attention_overrideable.default, random=_draws)
def sdpa_overrideable(query, keys, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                      return_debug_mask=False, *, scale=None, key=None):
    (b, q_heads, L, _), S = query.shape, keys.shape[2]
    scale = _scale(query, scale)
    acc = opmath_dtype(value.dtype) or value.dtype
    words = jnp.zeros((2,), jnp.int64)
    dropped = None
    if dropout_p > 0.0:
        words = jax.random.key_data(key).astype(jnp.int64)
        dropped = _dropout_scale((b, q_heads, L, S), dropout_p, words)
    bias = None if attn_bias is None else jnp.broadcast_to(attn_bias.astype(jnp.float32), (b, q_heads, L, S))

    def forward(query, keys, values, bias, dropped):
        s = _scores(query, keys, bias, is_causal, scale)
        m = jnp.max(s, axis=-1)
        safe_m = jnp.where(jnp.isfinite(m), m, 0.0)
        e = jnp.exp(s - safe_m[..., None])
        total = jnp.sum(e, axis=-1, keepdims=True)
        p = e / jnp.where(total > 0, total, 1.0)  # zeros where every key is masked
        lse = jnp.log(total[..., 0]) + safe_m  # -inf where every key is masked
        if dropped is not None:
            p = p * dropped
        return jnp.einsum("bhls,bhsd->bhld", p.astype(acc), values.astype(acc)), lse

    out, lse = _per_head(forward, query, _expand_heads(keys, q_heads), _expand_heads(value, q_heads), bias, dropped)
    # cum_seq_q/k and the debug mask are undefined (dense inputs, no debug); max_q/k are the lengths
    return out.astype(query.dtype), lse, None, None, L, S, words[0], words[1], None


@lowers(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def sdpa_overrideable_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                               cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                               philox_offset, *, scale=None):
    scale = _scale(query, scale)
    (b, q_heads, L, _), kv_heads, S = query.shape, key.shape[1], key.shape[2]
    f32 = jnp.float32
    dropped = _dropout_scale((b, q_heads, L, S), dropout_p, (philox_seed, philox_offset))
    bias = None if attn_bias is None else jnp.broadcast_to(attn_bias.astype(f32), (b, q_heads, L, S))
    with_bias_grad = attn_bias is not None and grad_input_mask[3]

    def backward(grad_out, query, keys, values, out, logsumexp, bias, dropped):
        p = _weights(_scores(query, keys, bias, is_causal, scale), logsumexp)
        do = grad_out.astype(f32)
        # with dropout the output is (p * dropped) @ v; the row sums of do * o stay the softmax's term
        grad_v = jnp.einsum("bhls,bhld->bhsd", p if dropped is None else p * dropped, do)
        dp = jnp.einsum("bhld,bhsd->bhls", do, values)
        if dropped is not None:
            dp = dp * dropped
        ds = p * (dp - jnp.sum(do * out.astype(f32), axis=-1, keepdims=True))  # of the masked, scaled scores
        grad_q = jnp.einsum("bhls,bhsd->bhld", ds, keys) * scale
        grad_k = jnp.einsum("bhls,bhld->bhsd", ds, query.astype(f32)) * scale
        return (grad_q, grad_k, grad_v) + ((ds,) if with_bias_grad else ())

    grads = _per_head(backward, grad_out, query, _expand_heads(key, q_heads).astype(f32),
                      _expand_heads(value, q_heads).astype(f32), out, logsumexp, bias, dropped)
    grad_q, grad_k, grad_v = grads[:3]
    grad_bias = None  # the meta kernel makes one whenever there is a bias: zeros where not asked for
    if attn_bias is not None:
        grad_bias = (sum_to(grads[3], attn_bias.shape) if with_bias_grad
                     else jnp.zeros(attn_bias.shape)).astype(attn_bias.dtype)
    return (grad_q.astype(query.dtype), _reduce_heads(grad_k, kv_heads).astype(key.dtype),
            _reduce_heads(grad_v, kv_heads).astype(value.dtype), grad_bias)


def sum_to(x, shape):
    """`x` summed over the axes broadcasting expanded from `shape`."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    return jnp.sum(x, axis=axes, keepdims=True).reshape(shape)


# ------------------------------------------------------------------ padding rules
# How each op stays exact on operands padded along a growing axis (padding.py).
# Keys padded along their length (axis 2) get -inf scores: a padded key takes no weight, so every
# true query row is exact; padded query rows only make padded outputs. Padded values, queries and
# (in the backward) incoming gradients, outputs and logsumexps are zeroed first, so a padded row
# holding inf or NaN meets only zero weights and zero gradients (0 * inf would leak NaN).
def _key_padding_bias(key, valid, attn_bias):
    keep = jnp.broadcast_to(valid, key.shape)[:, :1, :, 0]  # (B, 1, S): the true keys
    bias = jnp.where(keep[:, :, None, :], 0.0, -jnp.inf)  # (B, 1, 1, S)
    return bias if attn_bias is None else attn_bias.astype(jnp.float32) + bias


# Never padded: the head counts (query heads are a multiple of key/value heads) and the head
# dimension (contracted; it sets the default scale).
_ATTENTION_EXACT = (("query", (1, 3)), ("key", (1, 3)), ("value", (1,)))


@pads(aten._scaled_dot_product_fused_attention_overrideable.default)
def _attention_padding(call):
    if call.get("dropout_p", 0.0) > 0.0:
        return None

    def masked(c, valid):
        bias = _key_padding_bias(c["key"], valid, c.get("attn_bias"))
        return sdpa_overrideable(c["query"], c["key"], c["value"], bias, 0.0, c["is_causal"],
                                 c["return_debug_mask"], scale=c.get("scale"))

    return Padding(fills=(Fill("value", (2,), 0), Fill("key", (2,), 0)), masked=masked, counted="key",
                   counted_axes=(2,), exact=_ATTENTION_EXACT)


@pads(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def _attention_backward_padding(call):
    if call.get("dropout_p", 0.0) > 0.0:
        return None

    def masked(c, valid):
        bias = _key_padding_bias(c["key"], valid, c.get("attn_bias"))
        grad_q, grad_k, grad_v, grad_bias = sdpa_overrideable_backward(
            c["grad_out"], c["query"], c["key"], c["value"], bias, c["grad_input_mask"], c["out"],
            c["logsumexp"], c["cum_seq_q"], c["cum_seq_k"], c["max_q"], c["max_k"], 0.0, c["is_causal"],
            c["philox_seed"], c["philox_offset"], scale=c.get("scale"))
        if c.get("attn_bias") is None:
            return grad_q, grad_k, grad_v, None
        # the gradient of the caller's bias, not of the one padding widened (-inf there: no weight)
        return grad_q, grad_k, grad_v, sum_to(grad_bias, c["attn_bias"].shape).astype(c["attn_bias"].dtype)

    fills = (Fill("grad_out", (2,), 0), Fill("query", (2,), 0), Fill("key", (2,), 0), Fill("value", (2,), 0),
             Fill("out", (2,), 0), Fill("logsumexp", (2,), 0))
    return Padding(fills=fills, masked=masked, counted="key", counted_axes=(2,), exact=_ATTENTION_EXACT)
