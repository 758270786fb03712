"""Result layouts for ops whose PyTorch meta kernel is missing or encodes a CUDA-only restriction.

The driver learns result shapes, dtypes and errors from PyTorch's meta kernels. A few of those
check what CUDA's kernel supports rather than what the op means; neuron behaves like CPU there.
Each override takes the meta arguments and returns the meta result.
"""
from __future__ import annotations

import torch

from ..runtime.dtypes import scalar_type_name

aten = torch.ops.aten


def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    # CUDA's kernel takes bfloat16 only; CPU's (and ours) any floating type.
    low = torch.bfloat16
    out = aten._grouped_mm.default(mat_a.to(low), mat_b.to(low), offs,
                                   None if bias is None else bias.to(low), None)
    return out.to(out_dtype or mat_a.dtype)


def _geqrf(A):
    # PyTorch has no meta kernel for geqrf; LAPACK's result is column-major, as on CPU.
    *batch, m, n = A.shape
    a = torch.empty((*batch, n, m), dtype=A.dtype, device="meta").mT
    return a, torch.empty((*batch, min(m, n)), dtype=A.dtype, device="meta")


def _eval_batch_norm(op, training_index):
    """In eval mode CPU returns empty saved mean/invstd; PyTorch's meta kernels give (C,) ones."""
    def meta(*args, **kwargs):
        out = op(*args, **kwargs)
        training = True if training_index is None else (
            args[training_index] if len(args) > training_index else kwargs["training"])
        if training_index is not None and training:
            return out
        return (out[0], out[1].new_empty((0,)), out[2].new_empty((0,)), *out[3:])
    return meta


def _batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out = aten._batch_norm_no_update.default(input, weight, bias, running_mean, running_var, momentum, eps)
    if running_mean is None:
        return out
    return (out[0], out[1].new_empty((0,)), out[2].new_empty((0,)), out[3])


def _with_parameters(meta):
    """PyTorch's decomposition of batch norm with update (torch 2.13) picks the backend from weight
    and bias, which must then be tensors: for an affine-free norm, ones and zeros stand in (they
    shape the same results)."""
    def override(input, weight, bias, *args, **kwargs):
        channels = (input.shape[1],)
        weight = input.new_ones(channels) if weight is None else weight
        bias = input.new_zeros(channels) if bias is None else bias
        return meta(input, weight, bias, *args, **kwargs)
    return override


def _cpu_statistics(meta):
    """Normalisations of a float16/bfloat16 input: CPU saves the mean and inverse std in the input's
    dtype unless a parameter (weight, running stats) is float32 ("mixed type"), then in float32.
    PyTorch's meta kernels follow CUDA instead (always float32; group norm: always the input's)."""
    def override(input, *args, **kwargs):
        out = meta(input, *args, **kwargs)
        if input.dtype not in (torch.float16, torch.bfloat16):
            return out
        mixed = any(isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in (*args, *kwargs.values()))
        dtype = torch.float32 if mixed else input.dtype
        return (out[0], out[1].to(dtype), out[2].to(dtype), *out[3:])
    return override


def _histogram(self, bins=100, *, range=None, weight=None, density=False):
    # PyTorch has no meta kernel for histogram: bins counts and bins + 1 edges in self's dtype
    n = bins if isinstance(bins, int) else bins.shape[0] - 1
    return (torch.empty((n,), dtype=self.dtype, device="meta"),
            torch.empty((n + 1,), dtype=self.dtype, device="meta"))


def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    # no meta kernels for histogramdd's parts: edges per dimension, counts of shape bins
    return [torch.empty((n + 1,), dtype=self.dtype, device="meta") for n in bins]


def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    return torch.empty(tuple(bins), dtype=self.dtype, device="meta")


def _histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    return torch.empty(tuple(b.shape[0] - 1 for b in bins), dtype=self.dtype, device="meta")


def _embedding_bag(op, forward_only):
    """CPU's auxiliary outputs (PyTorch's meta kernel gives CUDA's for any tensor not on CPU):
    offset2bag is empty when the summing fast path skips it, bag sizes and max indices are per bag
    (per offset for sums in the forward-only variant) and index-typed as indices and offsets together."""
    from ..lowering.embedding_bag import MAX, SUM, fast_select

    def meta(weight, indices, offsets, scale_grad_by_freq=False, mode=SUM, sparse=False, per_sample_weights=None,
             include_last_offset=False, padding_idx=-1):
        output = op(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                    include_last_offset, padding_idx)[0]
        index = torch.promote_types(indices.dtype, offsets.dtype)
        fast = mode == SUM and fast_select(str(weight.dtype).removeprefix("torch."), padding_idx,
                                           weight.is_contiguous())
        offset2bag = indices.new_empty((0 if fast else indices.shape[0],), dtype=index)
        bags = offsets.shape[0] if forward_only and mode == SUM else output.shape[0]
        bag_size = indices.new_empty((bags,), dtype=index)
        max_indices = indices.new_empty(output.shape if mode == MAX else (bags,), dtype=index)
        return output, offset2bag, bag_size, max_indices
    return meta


def _checked(op, check):
    """`op`'s own meta kernel after a check that CPU's kernel makes and PyTorch's meta kernel lacks."""
    def meta(*args, **kwargs):
        check(*args, **kwargs)
        return op(*args, **kwargs)
    return meta


def _heaviside_dtypes(self, values, *, out=None):
    if self.is_complex() or values.is_complex() or (out is not None and out.is_complex()):
        raise RuntimeError("heaviside is not yet implemented for complex tensors.")
    if self.dtype != values.dtype or (out is not None and out.dtype != self.dtype):
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")


def _clamp_bounds(self, min=None, max=None, *, out=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if out is not None and not isinstance(min, torch.Tensor) and not isinstance(max, torch.Tensor):
        # with Scalar bounds CPU's kernel is a unary op: the out's dtype must be the result's
        result = aten.clamp.default(self, min, max).dtype
        if out.dtype != result:
            raise RuntimeError(f"Found dtype {scalar_type_name(out.dtype)} but expected {scalar_type_name(result)}")


def _where_out_dtype(condition, self, other, *, out):
    result = aten.where.self(condition, self, other).dtype
    if out.dtype != result:
        raise RuntimeError(f"Expected out type to be {scalar_type_name(result)} but got {scalar_type_name(out.dtype)}")


def _nonzero_out(self, *, out):
    # a data-dependent op: only its arguments are checked (CPU's message lacks the space)
    if out.dtype != torch.long:
        raise RuntimeError(f"nonzero: Expected out tensor to have scalar type Long but got scalar "
                           f"type{scalar_type_name(out.dtype)}")


META_OVERRIDES = {
    aten.heaviside.default: _checked(aten.heaviside.default, _heaviside_dtypes),
    aten.heaviside_.default: _checked(aten.heaviside_.default, _heaviside_dtypes),
    aten.heaviside.out: _checked(aten.heaviside.out, _heaviside_dtypes),
    aten.clamp.default: _checked(aten.clamp.default, _clamp_bounds),
    aten.clamp_.default: _checked(aten.clamp_.default, _clamp_bounds),
    aten.clamp.out: _checked(aten.clamp.out, _clamp_bounds),
    aten.clamp.Tensor: _checked(aten.clamp.Tensor, _clamp_bounds),
    aten.clamp_.Tensor: _checked(aten.clamp_.Tensor, _clamp_bounds),
    aten.where.self_out: _checked(aten.where.self_out, _where_out_dtype),
    aten.nonzero.out: _nonzero_out,
    aten._embedding_bag.default: _embedding_bag(aten._embedding_bag.default, False),
    aten._embedding_bag_forward_only.default: _embedding_bag(aten._embedding_bag_forward_only.default, True),
    aten.histogram.bin_ct: _histogram,
    aten.histogram.bins_tensor: _histogram,
    aten._histogramdd_bin_edges.default: _histogramdd_bin_edges,
    aten._histogramdd_from_bin_cts.default: _histogramdd_from_bin_cts,
    aten._histogramdd_from_bin_tensors.default: _histogramdd_from_bin_tensors,
    aten._batch_norm_no_update.default: _cpu_statistics(_batch_norm_no_update),
    aten._native_batch_norm_legit_no_training.default: _cpu_statistics(_eval_batch_norm(
        aten._native_batch_norm_legit_no_training.default, None)),
    aten._native_batch_norm_legit_functional.default: _cpu_statistics(_eval_batch_norm(
        aten._native_batch_norm_legit_functional.default, 5)),
    aten._native_batch_norm_legit.default: _cpu_statistics(_eval_batch_norm(
        aten._native_batch_norm_legit.default, 5)),
    aten._native_batch_norm_legit.no_stats: _cpu_statistics(aten._native_batch_norm_legit.no_stats),
    aten._batch_norm_with_update.default: _cpu_statistics(_with_parameters(aten._batch_norm_with_update.default)),
    aten._batch_norm_with_update_functional.default: _cpu_statistics(_with_parameters(
        aten._batch_norm_with_update_functional.default)),
    aten.native_layer_norm.default: _cpu_statistics(aten.native_layer_norm.default),
    aten.native_group_norm.default: _cpu_statistics(aten.native_group_norm.default),
    aten._grouped_mm.default: _grouped_mm,
    aten.geqrf.default: _geqrf,
}
