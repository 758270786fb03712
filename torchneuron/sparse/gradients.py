"""Sparse gradients: EmbeddingBag(sparse=True)'s backward on neuron.

`_embedding_bag_backward` is lowered for dense gradients (lowering/embedding_bag.py); a lowering
returns arrays, never a sparse tensor. Its eager kernel is this redirect: sparse=True runs
PyTorch's composite `_embedding_bag_sparse_backward` (dense neuron ops, then a COO tensor of the
rows the bags touched), as CPU does; sparse=False runs the lowered `_embedding_bag_dense_backward`.
(Embedding(sparse=True)'s backward is composite already: `embedding_sparse_backward`.)
"""
from __future__ import annotations

import torch

from ..lowering import redirected

aten = torch.ops.aten


def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    if offset2bag.shape[0] != indices.shape[0]:  # the summing fast path left it empty: CPU recomputes it
        positions = torch.arange(indices.shape[0], device=indices.device, dtype=offsets.dtype)
        offset2bag = torch.searchsorted(offsets, positions, right=True) - 1
    if sparse:
        return aten._embedding_bag_sparse_backward(grad, indices, offsets, offset2bag, bag_size, num_weights,
                                                   scale_grad_by_freq, mode, per_sample_weights, padding_idx)
    return aten._embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                              scale_grad_by_freq, mode, per_sample_weights, padding_idx)


redirected(embedding_bag_backward, aten._embedding_bag_backward.default)
