"""Lowerings: FlexAttention (`torch.nn.attention.flex_attention`), its forward and backward.

PyTorch's `flex_attention` is a higher-order op: besides query, key and value it takes a
`score_mod(score, b, h, q_idx, kv_idx, *buffers)` that rewrites each score and a block mask whose
`mask_mod(b, h, q_idx, kv_idx, *buffers)` says which scores count. Here both are JAX callables of
0-d values (the compile driver builds them from the op's subgraphs through this same table); they
are vectorised over (b, h, q, kv) with nested `jax.vmap`, as PyTorch's dense implementation does
with `torch.vmap`, so any op the table lowers may appear in them.

The block mask: its (partial) blocks are attended where `mask_mod` says so, its full blocks
entirely, every other block not at all, as the fused kernels read it. Where the mask has more than
one block per row, forward and backward visit only the listed blocks: a `lax.while_loop` whose trip
count is the row's (or, for the key and value gradients, the column's) block count, one row or
column at a time (`lax.map`), so a block the mask leaves empty costs nothing. Otherwise (PyTorch's
mask for "no block mask", one block over everything) the scores are computed whole and masked.

The results follow the higher-order op: the output, the log-sum-exp and the row maxima of the
modified scores in base 2 (`flex_attention` converts them back), computed in float32 (float64
for float64 inputs); a row with every score masked gives a zero output and a log-sum-exp of -inf.
The backward is PyTorch's formula: the weights again from the scores and the forward's
log-sum-exp, the score_mod's gradient (scores and floating-point buffers) by `jax.vjp` per tile.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from . import aten, refused

_LN2 = math.log(2)

# Varlen attention (torch.nn.attention.varlen): its CPU kernel is FlashAttention's, CUDA-only.
refused("neuron has no FlashAttention kernel (varlen attention over packed sequences); use "
        "torch.nn.attention.flex_attention.flex_attention with a document mask (create_block_mask(..., "
        "device='neuron')) or torch.nn.functional.scaled_dot_product_attention per sequence",
        aten._flash_attention_forward, aten._flash_attention_backward)


def _vmap_bhqkv(fn: Callable, scores: bool, n_buffers: int) -> Callable:
    """`fn` over 0-d (score,) b, h, q, kv, vectorised to (B, H, L, S) by four nested vmaps; its
    buffers are passed whole."""
    lead = (0,) if scores else ()
    buffers = (None,) * n_buffers
    # innermost kv, then q, h, b (PyTorch's _vmap_for_bhqkv); scores carry every axis
    for axes in ((None, None, None, 0), (None, None, 0, None), (None, 0, None, None), (0, None, None, None)):
        fn = jax.vmap(fn, in_axes=lead + axes + buffers)
    return fn


def block_mask_dense(kv_num_blocks, kv_indices, q_len: int, kv_len: int, q_block: int, kv_block: int):
    """(B, H, L, S) booleans: whether the blocks listed (the first `kv_num_blocks` of each row of
    `kv_indices`) cover each (q, kv) position; B and H as the block mask has them (1 broadcasts)."""
    if kv_num_blocks is None:
        return None
    n_kv_blocks = -(-kv_len // kv_block)
    listed = jnp.arange(kv_indices.shape[-1]) < kv_num_blocks[..., None]
    index = jnp.where(listed & (kv_indices < n_kv_blocks), kv_indices, n_kv_blocks)
    live = jax.nn.one_hot(index, n_kv_blocks + 1, dtype=jnp.bool_).any(axis=-2)[..., :n_kv_blocks]
    rows = jnp.arange(q_len) // q_block
    cols = jnp.arange(kv_len) // kv_block
    rows = jnp.minimum(rows, live.shape[-2] - 1)
    return live[..., rows, :][..., cols]


def _expand(x, batch: int, heads: int):
    """Keys or values (Bkv, Hkv, S, D) as (B, Hq, S, D): each kv head repeated for the query heads
    that read it (GQA), a single batch broadcast."""
    x = jnp.repeat(x, heads // x.shape[1], axis=1) if x.shape[1] != heads else x
    return jnp.broadcast_to(x, (batch,) + x.shape[1:])


def _allowed(mask_mod, block, idx, mask_buffers):
    """(B, H, L, S) booleans (B, H possibly 1): the scores that count, by the mask_mod in the block
    mask's partial blocks, all of its full blocks, none elsewhere."""
    allowed = _vmap_bhqkv(mask_mod, False, len(mask_buffers))(*idx, *mask_buffers)
    kv_num, kv_indices, full_num, full_indices, q_block, kv_block = block
    q_len, kv_len = len(idx[2]), len(idx[3])
    partial = block_mask_dense(kv_num, kv_indices, q_len, kv_len, q_block, kv_block)
    if partial is not None:
        full = block_mask_dense(full_num, full_indices, q_len, kv_len, q_block, kv_block)
        allowed = allowed & partial
        if full is not None:
            allowed = allowed | full
    return allowed


def _attend(query, key, value, score_mod, mask_mod, block, scale, score_buffers, mask_buffers):
    """(out, natural log-sum-exp, row maxima) of FlexAttention; `block` = (kv_num_blocks,
    kv_indices, full_kv_num_blocks, full_kv_indices, Q_BLOCK_SIZE, KV_BLOCK_SIZE)."""
    batch, heads, q_len, _ = query.shape
    key, value = _expand(key, batch, heads), _expand(value, batch, heads)
    kv_len = key.shape[2]
    work = jnp.float64 if query.dtype == jnp.float64 else jnp.float32
    s = jnp.einsum("bhld,bhsd->bhls", query.astype(work), key.astype(work)) * scale
    idx = [jnp.arange(n, dtype=jnp.int32) for n in (batch, heads, q_len, kv_len)]
    s = _vmap_bhqkv(score_mod, True, len(score_buffers))(s, *idx, *score_buffers).astype(work)
    s = jnp.where(jnp.broadcast_to(_allowed(mask_mod, block, idx, mask_buffers), s.shape), s, -jnp.inf)
    m = jnp.max(s, axis=-1)
    safe_m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - safe_m[..., None])
    total = jnp.sum(e, axis=-1)
    some = total > 0
    p = e / jnp.where(some, total, 1.0)[..., None]  # zeros on a row with every score masked
    lse = jnp.where(some, jnp.log(jnp.where(some, total, 1.0)) + safe_m, -jnp.inf)
    out = jnp.einsum("bhls,bhsd->bhld", p.astype(query.dtype), value.astype(query.dtype))
    return out, lse, m


def flex_attention(query, key, value, score_mod: Callable, mask_mod: Callable, block: Sequence, scale: float,
                   score_buffers: Sequence = (), mask_buffers: Sequence = ()):
    """The higher-order op `flex_attention`'s results: (out, log-sum-exp / ln 2, max / ln 2).

        out, lse, _ = flex_attention(q, k, v, lambda s, b, h, i, j: s, lambda b, h, i, j: i >= j,
                                     (None,) * 4 + (128, 128), 0.125)
    """
    attend = _attend_blocks if _block_sparse(query, key, block) else _attend
    out, lse, m = attend(query, key, value, score_mod, mask_mod, block, scale, score_buffers, mask_buffers)
    return out, (lse / _LN2).astype(jnp.float32), (m / _LN2).astype(jnp.float32)


def _block_sparse(query, key, block) -> bool:
    """Whether the block mask lists more than one block per row to choose from (PyTorch's mask for
    "no block mask" is one block covering everything) and fits the query's batch and heads."""
    kv_num, kv_indices, _, _, q_block, kv_block = block
    if kv_num is None or kv_num.ndim != 3:
        return False
    fits = all(m in (1, n) for m, n in zip(kv_num.shape[:2], query.shape[:2]))
    return fits and -(-key.shape[2] // kv_block) > 1 and kv_indices.shape[2] == -(-query.shape[2] // q_block)


def _attend_blocks(query, key, value, score_mod, mask_mod, block, scale, score_buffers, mask_buffers):
    """`_attend` visiting only the blocks the block mask lists: one row of query blocks at a time
    (`lax.map`), and in each a loop over its listed key/value blocks whose trip count is the row's
    block count (`lax.while_loop`), with an online softmax; an empty block costs nothing."""
    kv_num, kv_indices, full_num, full_indices, q_block, kv_block = block
    batch, heads, q_len, _ = query.shape
    key, value = _expand(key, batch, heads), _expand(value, batch, heads)
    kv_len, v_dim = key.shape[2], value.shape[3]
    work = jnp.float64 if query.dtype == jnp.float64 else jnp.float32
    n_q, n_kv = -(-q_len // q_block), -(-kv_len // kv_block)
    mask_batch, mask_heads = kv_num.shape[:2]
    group_b, group_h = batch // mask_batch, heads // mask_heads

    def blocked(x, n, size):  # (B, H, n * size, D) as (Bm, Bg, Hm, Hg, n, size, D), zero padded
        x = jnp.pad(x, ((0, 0), (0, 0), (0, n * size - x.shape[2]), (0, 0)))
        return x.reshape(mask_batch, group_b, mask_heads, group_h, n, size, x.shape[-1])

    qs, ks, vs = blocked(query.astype(work), n_q, q_block), blocked(key.astype(work), n_kv, kv_block), \
        blocked(value.astype(work), n_kv, kv_block)
    if full_num is None:
        full_num, full_indices = jnp.zeros_like(kv_num), jnp.zeros_like(kv_indices)
    score_mod = _vmap_bhqkv(score_mod, True, len(score_buffers))
    mask_mod = _vmap_bhqkv(mask_mod, False, len(mask_buffers))

    def row(where):
        bm, hm, qb = where
        q = qs[bm, :, hm, :, qb]  # (Bg, Hg, QB, D)
        b_idx = bm * group_b + jnp.arange(group_b, dtype=jnp.int32)
        h_idx = hm * group_h + jnp.arange(group_h, dtype=jnp.int32)
        q_idx = qb * q_block + jnp.arange(q_block, dtype=jnp.int32)
        partial, full = kv_num[bm, hm, qb], full_num[bm, hm, qb]

        def step(carry):
            j, m, total, acc = carry
            is_partial = j < partial
            kb = jnp.where(is_partial, kv_indices[bm, hm, qb, jnp.minimum(j, kv_indices.shape[-1] - 1)],
                           full_indices[bm, hm, qb, jnp.clip(j - partial, 0, full_indices.shape[-1] - 1)])
            kv_idx = kb * kv_block + jnp.arange(kv_block, dtype=jnp.int32)
            s = jnp.einsum("bhld,bhsd->bhls", q, ks[bm, :, hm, :, kb]) * scale
            s = score_mod(s, b_idx, h_idx, q_idx, kv_idx, *score_buffers).astype(work)
            allowed = jnp.where(is_partial, mask_mod(b_idx, h_idx, q_idx, kv_idx, *mask_buffers), True)
            s = jnp.where(allowed & (kv_idx < kv_len), s, -jnp.inf)
            new_m = jnp.maximum(m, jnp.max(s, axis=-1))
            safe = jnp.where(jnp.isfinite(new_m), new_m, 0.0)
            p = jnp.exp(s - safe[..., None])
            correction = jnp.exp(m - safe)
            acc = acc * correction[..., None] + jnp.einsum("bhls,bhsd->bhld", p, vs[bm, :, hm, :, kb])
            return j + 1, new_m, total * correction + jnp.sum(p, axis=-1), acc

        rows = (group_b, group_h, q_block)
        start = (jnp.int32(0), jnp.full(rows, -jnp.inf, work), jnp.zeros(rows, work), jnp.zeros(rows + (v_dim,), work))
        _, m, total, acc = jax.lax.while_loop(lambda c: c[0] < partial + full, step, start)
        some = total > 0
        out = acc / jnp.where(some, total, 1.0)[..., None]
        lse = jnp.where(some, jnp.log(jnp.where(some, total, 1.0)) + jnp.where(jnp.isfinite(m), m, 0.0), -jnp.inf)
        return out, lse, m

    grid = jnp.meshgrid(*(jnp.arange(n, dtype=jnp.int32) for n in (mask_batch, mask_heads, n_q)), indexing="ij")
    outs = jax.lax.map(row, tuple(g.reshape(-1) for g in grid))

    def unblocked(x):  # (Bm * Hm * nQ, Bg, Hg, QB, ...) as (B, H, L, ...)
        x = x.reshape((mask_batch, mask_heads, n_q, group_b, group_h, q_block) + x.shape[4:])
        x = jnp.moveaxis(x, (3, 4), (1, 3)).reshape((batch, heads, n_q * q_block) + x.shape[6:])
        return x[:, :, :q_len]

    out, lse, m = (unblocked(x) for x in outs)
    return out.astype(query.dtype), lse, m


def flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, score_mod: Callable,
                            mask_mod: Callable, block: Sequence, scale: float, score_buffers: Sequence = (),
                            mask_buffers: Sequence = (), q_lists: Sequence | None = None):
    """The higher-order op `flex_attention_backward`'s results: gradients of query, key, value and of
    each score_mod buffer (None for one that is not floating point), from the forward's output and
    base-2 `logsumexp`; `grad_logsumexp` is of that log-sum-exp (None: zero). As PyTorch's dense
    backward: the weights again from the scores and the log-sum-exp, the score_mod's own gradient
    by `jax.vjp`. With `q_lists` (the BlockMask's q_num_blocks, q_indices, full_q_num_blocks,
    full_q_indices) only the listed blocks are visited (`_backward_blocks`)."""
    if (q_lists is not None and q_lists[0] is not None and _block_sparse(query, key, block)
            and q_lists[1].shape[2] == -(-key.shape[2] // block[5])):
        return _backward_blocks(query, key, value, out, logsumexp, grad_out, grad_logsumexp, score_mod, mask_mod,
                                block, q_lists, scale, score_buffers, mask_buffers)
    batch, heads, q_len, _ = query.shape
    kv_batch, kv_heads = key.shape[:2]
    work = jnp.float64 if query.dtype == jnp.float64 else jnp.float32
    q = query.astype(work)
    k, v = _expand(key, batch, heads).astype(work), _expand(value, batch, heads).astype(work)
    idx = [jnp.arange(n, dtype=jnp.int32) for n in (batch, heads, q_len, k.shape[2])]
    differentiable = [i for i, b in enumerate(score_buffers) if jnp.issubdtype(b.dtype, jnp.floating)]

    def modified(raw, float_buffers):
        buffers = list(score_buffers)
        for i, b in zip(differentiable, float_buffers):
            buffers[i] = b
        return _vmap_bhqkv(score_mod, True, len(buffers))(raw, *idx, *buffers).astype(work)

    raw = jnp.einsum("bhld,bhsd->bhls", q, k) * scale
    scores, score_vjp = jax.vjp(modified, raw, [score_buffers[i] for i in differentiable])
    allowed = jnp.broadcast_to(_allowed(mask_mod, block, idx, mask_buffers), scores.shape)
    lse = logsumexp.astype(work) * _LN2
    finite = jnp.isfinite(lse)
    p = jnp.where(allowed & finite[..., None], jnp.exp(scores - jnp.where(finite, lse, 0.0)[..., None]), 0.0)
    do = grad_out.astype(work)
    grad_v = jnp.einsum("bhls,bhld->bhsd", p, do)
    dp = jnp.einsum("bhld,bhsd->bhls", do, v)
    row = jnp.sum(do * out.astype(work), axis=-1)
    if grad_logsumexp is not None:  # of lse / ln 2
        row = row - jnp.where(finite, grad_logsumexp.astype(work) / _LN2, 0.0)
    grad_scores, grad_buffers = score_vjp(jnp.where(allowed, p * (dp - row[..., None]), 0.0))
    grad_q = jnp.einsum("bhls,bhsd->bhld", grad_scores, k) * scale
    grad_k = jnp.einsum("bhls,bhld->bhsd", grad_scores, q) * scale

    def to_kv(g):  # per query head and batch -> per kv head (GQA) and kv batch (broadcast)
        g = g.reshape((batch, kv_heads, heads // kv_heads) + g.shape[2:]).sum(2)
        return g.sum(0, keepdims=True) if kv_batch != batch else g

    grads: list = [None] * len(score_buffers)
    for i, g in zip(differentiable, grad_buffers):
        grads[i] = g.astype(score_buffers[i].dtype)
    return (grad_q.astype(query.dtype), to_kv(grad_k).astype(key.dtype), to_kv(grad_v).astype(value.dtype),
            tuple(grads))


def _backward_blocks(query, key, value, out, logsumexp, grad_out, grad_logsumexp, score_mod, mask_mod, block,
                     q_lists, scale, score_buffers, mask_buffers):
    """`flex_attention_backward` visiting only the listed blocks, as the forward does: the query
    gradient (and the score_mod buffers') one row of query blocks at a time over its listed key/value
    blocks, the key and value gradients one column of key/value blocks at a time over the query blocks
    the BlockMask lists for it (its q_indices): two loops, each tile's scores computed in both."""
    kv_num, kv_indices, full_num, full_indices, q_block, kv_block = block
    q_num, q_indices, full_q_num, full_q_indices = q_lists
    batch, heads, q_len, _ = query.shape
    kv_batch, kv_heads = key.shape[:2]
    key_, value_ = _expand(key, batch, heads), _expand(value, batch, heads)
    kv_len = key_.shape[2]
    work = jnp.float64 if query.dtype == jnp.float64 else jnp.float32
    n_q, n_kv = -(-q_len // q_block), -(-kv_len // kv_block)
    mask_batch, mask_heads = kv_num.shape[:2]
    group_b, group_h = batch // mask_batch, heads // mask_heads

    def blocked(x, n, size):  # (B, H, n * size, ...) as (Bm, Bg, Hm, Hg, n, size, ...), zero padded
        x = jnp.pad(x, ((0, 0), (0, 0), (0, n * size - x.shape[2])) + ((0, 0),) * (x.ndim - 3))
        return x.reshape((mask_batch, group_b, mask_heads, group_h, n, size) + x.shape[3:])

    lse = jnp.where(jnp.isfinite(logsumexp), logsumexp.astype(work) * _LN2, -jnp.inf)
    do = grad_out.astype(work)
    delta = jnp.sum(do * out.astype(work), axis=-1)
    if grad_logsumexp is not None:  # of lse / ln 2
        delta = delta - jnp.where(jnp.isfinite(lse), grad_logsumexp.astype(work) / _LN2, 0.0)
    qs, dos = blocked(query.astype(work), n_q, q_block), blocked(do, n_q, q_block)
    lses = blocked(jnp.pad(lse, ((0, 0), (0, 0), (0, n_q * q_block - q_len)), constant_values=-jnp.inf), n_q, q_block)
    deltas = blocked(delta, n_q, q_block)
    ks, vs = blocked(key_.astype(work), n_kv, kv_block), blocked(value_.astype(work), n_kv, kv_block)
    differentiable = [i for i, b in enumerate(score_buffers) if jnp.issubdtype(b.dtype, jnp.floating)]
    float_buffers = [score_buffers[i] for i in differentiable]
    vmapped_score = _vmap_bhqkv(score_mod, True, len(score_buffers))
    vmapped_mask = _vmap_bhqkv(mask_mod, False, len(mask_buffers))

    def tile(bm, hm, qb, kb, is_partial):
        """Weights, and gradients of the raw scores and of the float buffers, of one (q, kv) block."""
        b_idx = bm * group_b + jnp.arange(group_b, dtype=jnp.int32)
        h_idx = hm * group_h + jnp.arange(group_h, dtype=jnp.int32)
        q_idx = qb * q_block + jnp.arange(q_block, dtype=jnp.int32)
        kv_idx = kb * kv_block + jnp.arange(kv_block, dtype=jnp.int32)
        q, k, v = qs[bm, :, hm, :, qb], ks[bm, :, hm, :, kb], vs[bm, :, hm, :, kb]

        def modified(raw, floats):
            buffers = list(score_buffers)
            for i, f in zip(differentiable, floats):
                buffers[i] = f
            return vmapped_score(raw, b_idx, h_idx, q_idx, kv_idx, *buffers).astype(work)

        scores, score_vjp = jax.vjp(modified, jnp.einsum("bhld,bhsd->bhls", q, k) * scale, float_buffers)
        allowed = jnp.where(is_partial, vmapped_mask(b_idx, h_idx, q_idx, kv_idx, *mask_buffers), True)
        row_lse = lses[bm, :, hm, :, qb]
        finite = jnp.isfinite(row_lse)[..., None]
        allowed = allowed & (kv_idx < kv_len) & finite
        p = jnp.where(allowed, jnp.exp(scores - jnp.where(finite, row_lse[..., None], 0.0)), 0.0)
        dp = jnp.einsum("bhld,bhsd->bhls", dos[bm, :, hm, :, qb], v)
        grad_raw, grad_floats = score_vjp(jnp.where(allowed, p * (dp - deltas[bm, :, hm, :, qb][..., None]), 0.0))
        return p, grad_raw, grad_floats

    def listed(count, indices, full_count, full_indices, j):
        """The j-th listed block of a row or column: its partial ones first, then its full ones."""
        is_partial = j < count
        partial_at = indices[jnp.minimum(j, indices.shape[-1] - 1)]
        full_at = full_indices[jnp.clip(j - count, 0, full_indices.shape[-1] - 1)]
        return jnp.where(is_partial, partial_at, full_at), is_partial

    zero_full = (jnp.zeros_like(kv_num), jnp.zeros_like(kv_indices)) if full_num is None else (full_num, full_indices)
    zero_full_q = (jnp.zeros_like(q_num), jnp.zeros_like(q_indices)) if full_q_num is None else (
        full_q_num, full_q_indices)

    def row(where):  # grad of one row of query blocks, and its part of the buffers' grads
        bm, hm, qb = where
        count, full = kv_num[bm, hm, qb], zero_full[0][bm, hm, qb]

        def step(carry):
            j, grad_q, grad_floats = carry
            kb, is_partial = listed(count, kv_indices[bm, hm, qb], full, zero_full[1][bm, hm, qb], j)
            _, grad_raw, floats = tile(bm, hm, qb, kb, is_partial)
            grad_q = grad_q + jnp.einsum("bhls,bhsd->bhld", grad_raw, ks[bm, :, hm, :, kb]) * scale
            return j + 1, grad_q, [a + b for a, b in zip(grad_floats, floats)]

        start = (jnp.int32(0), jnp.zeros(qs.shape[1:2] + qs.shape[3:4] + qs.shape[5:], work),
                 [jnp.zeros(f.shape, work) for f in float_buffers])
        _, grad_q, grad_floats = jax.lax.while_loop(lambda c: c[0] < count + full, step, start)
        return grad_q, grad_floats

    def column(where):  # grads of one column of key/value blocks
        bm, hm, kb = where
        count, full = q_num[bm, hm, kb], zero_full_q[0][bm, hm, kb]

        def step(carry):
            j, grad_k, grad_v = carry
            qb, is_partial = listed(count, q_indices[bm, hm, kb], full, zero_full_q[1][bm, hm, kb], j)
            p, grad_raw, _ = tile(bm, hm, qb, kb, is_partial)
            grad_v = grad_v + jnp.einsum("bhls,bhld->bhsd", p, dos[bm, :, hm, :, qb])
            grad_k = grad_k + jnp.einsum("bhls,bhld->bhsd", grad_raw, qs[bm, :, hm, :, qb]) * scale
            return j + 1, grad_k, grad_v

        shape = ks.shape[1:2] + ks.shape[3:4] + ks.shape[5:]
        start = (jnp.int32(0), jnp.zeros(shape, work), jnp.zeros(shape[:-1] + vs.shape[-1:], work))
        _, grad_k, grad_v = jax.lax.while_loop(lambda c: c[0] < count + full, step, start)
        return grad_k, grad_v

    def grid(n):
        axes = jnp.meshgrid(*(jnp.arange(m, dtype=jnp.int32) for m in (mask_batch, mask_heads, n)), indexing="ij")
        return tuple(a.reshape(-1) for a in axes)

    grad_q, grad_floats = jax.lax.map(row, grid(n_q))
    grad_k, grad_v = jax.lax.map(column, grid(n_kv))

    def unblocked(x, n, size, length):  # (Bm * Hm * n, Bg, Hg, size, D) as (B, H, length, D)
        x = x.reshape((mask_batch, mask_heads, n, group_b, group_h, size) + x.shape[4:])
        x = jnp.moveaxis(x, (3, 4), (1, 3)).reshape((batch, heads, n * size) + x.shape[6:])
        return x[:, :, :length]

    def to_kv(g):  # per query head and batch -> per kv head (GQA) and kv batch (broadcast)
        g = g.reshape((batch, kv_heads, heads // kv_heads) + g.shape[2:]).sum(2)
        return g.sum(0, keepdims=True) if kv_batch != batch else g

    grads: list = [None] * len(score_buffers)
    for i, g in zip(differentiable, grad_floats):
        grads[i] = g.sum(0).astype(score_buffers[i].dtype)
    return (unblocked(grad_q, n_q, q_block, q_len).astype(query.dtype),
            to_kv(unblocked(grad_k, n_kv, kv_block, kv_len)).astype(key.dtype),
            to_kv(unblocked(grad_v, n_kv, kv_block, kv_len)).astype(value.dtype), tuple(grads))
