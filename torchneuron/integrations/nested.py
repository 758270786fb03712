"""Jagged nested tensors' attention on neuron: padded, through the fused SDPA lowering.

`F.scaled_dot_product_attention` on jagged q/k/v (B, H, j, D) (`torch.nested`, `layout=torch.jagged`)
reaches `torch.nested._internal.sdpa.jagged_scaled_dot_product_attention`, which picks among CUDA's
varlen kernels (flash, efficient, cuDNN) and a math path that rebuilds each input as a strided nested
tensor, one component per sequence, after a host read of the lengths. CUDA takes the varlen kernels;
neuron, like CPU, could only take the math path: it needs the strided layout (csrc/nested.cpp), refuses
inputs that are not contiguous after `transpose(1, 2)` (what a compiled graph's outputs may be) and
breaks a `torch.compile` graph. On neuron we pad instead: q, k and v become dense (B, H, max_len, D)
(`to_padded_tensor`, lowering/nested.py), keys past each sequence's length are masked out, the dense
SDPA runs (the fused lowering, lowering/attention.py), and the result is packed back with the query's
offsets. Every step is an op with a lowering and a derivative, so backward and compiled graphs work.
Calls this does not cover (a mask, `is_causal`, the non-ragged special case) keep PyTorch's own route
and its answers.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

MODULE = "torch.nested._internal.ops"


def _covers(query, key, value, attn_mask, is_causal) -> bool:
    return (query.device.type == "neuron" and attn_mask is None and not is_causal
            and all(t.dim() == 4 and t._ragged_idx == 2 for t in (query, key, value)))


def _padded(t, length=None):
    """(B, H, j, D) jagged -> (B, H, L, D) dense, zeros past each sequence's end. L is `length`, else
    the maximum length where known, else the total length (PyTorch's bound: reading the maximum would
    wait for the device)."""
    size = None if length is None else (t.shape[0], length, t.shape[1], t.shape[3])
    return torch.nested.to_padded_tensor(t.transpose(1, 2), 0.0, size).transpose(1, 2)


def padded_sdpa(query, key, value, dropout_p=0.0, scale=None, enable_gqa=False):
    """Attention of jagged (B, H, j, D) tensors as dense attention over their padded forms."""
    from torch.nested._internal.nested_tensor import nested_from_padded

    # keys and values share their lengths; where only one knows its maximum, both pad to the total
    unknown = (key._maybe_max_seqlen is None, value._maybe_max_seqlen is None)
    kv_length = None if unknown[0] == unknown[1] else key._values.shape[1]
    q, k, v = _padded(query), _padded(key, kv_length), _padded(value, kv_length)
    lengths = key.offsets().diff()
    mask = torch.arange(k.shape[2], device=k.device)[None, :] < lengths[:, None]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], dropout_p=dropout_p,
                                         scale=scale, enable_gqa=enable_gqa)
    return nested_from_padded(out.transpose(1, 2), query.offsets(), min_seqlen=query._maybe_min_seqlen,
                              max_seqlen=query._maybe_max_seqlen,
                              sum_S=query._values.shape[1]).transpose(1, 2)


def route_sdpa(module) -> None:
    """Wrap `module.jagged_scaled_dot_product_attention` (torch.nested's jagged op table calls it by
    that name) so neuron's covered calls run `padded_sdpa` (once)."""
    sdpa = getattr(module, "jagged_scaled_dot_product_attention", None)
    if sdpa is None or hasattr(sdpa, "torchneuron_wraps"):
        return

    @functools.wraps(sdpa)
    def jagged_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
        if not _covers(query, key, value, attn_mask, is_causal):
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        from torch.nested._internal.sdpa import _autocast, _validate_sdpa_input

        query, key, value, attn_mask = _autocast(query, key, value, attn_mask)
        _validate_sdpa_input(query, key, value, attn_mask, dropout_p, is_causal, scale)
        return padded_sdpa(query, key, value, dropout_p, scale, enable_gqa)

    jagged_sdpa.torchneuron_wraps = sdpa
    module.jagged_scaled_dot_product_attention = jagged_sdpa
