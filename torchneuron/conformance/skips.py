"""The reviewed table of ops that are not compared value by value, with the reason.

'shape-only': the op's values are random or uninitialised, so neuron and CPU can only agree on
shape and dtype (and no gradients are compared). 'skip': the op cannot run on this backend by
design. Every other op is compared in full; an op whose CPU run fails is skipped as 'cpu-fails'
by the runner, not listed here.
"""
from __future__ import annotations

import fnmatch

import torch

SHAPE_ONLY = {
    # random: neuron draws from its own generator (a JAX PRNG), so values differ from CPU's
    "random": [
        "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
        "normal.*", "uniform", "rand_like", "randn", "randn_like", "randint", "randint_like",
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.rrelu", "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
        "svd_lowrank", "pca_lowrank",
    ],
    # uninitialised memory: only the geometry is defined
    "uninitialised": [
        "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
        "resize_", "resize_as_",
    ],
}

SKIP = {
    "sparse-layout": ["sparse.*", "to_sparse"],
    "cuda-only": ["jiterator_*", "torch._scaled_mm*", "torch.ops.aten._flash_attention_forward",
                  "torch.ops.aten._efficient_attention_forward", "bmm.triton_optimized"],
    # XLA has no complex32 type, so neuron tensors cannot hold it (UnsupportedDtypeError names the op)
    "no-complex32": ["chalf"],
}


# Samples that draw random numbers (dropout inside attention) in ops that are otherwise
# deterministic: they are left out rather than compared, since CPU and neuron draw differently.
RANDOM_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0) > 0,
    # multi_head_attention_forward(query, key, value, embed_dim, num_heads, in_proj_weight,
    #   in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, ...): args[9] is dropout_p
    "nn.functional.multi_head_attention_forward":
        lambda s: s.kwargs.get("training", True) and len(s.args) > 9 and s.args[9] > 0,
}


# Sample tensors that the OpInfo keeps on the host for every device (it builds them without `device=`),
# because the op requires them there: they stay on CPU in the neuron run too, as on CUDA.
HOST_TENSORS = {
    # tensor_split(input, tensor_indices_or_sections, dim): the indices must be a CPU tensor
    "tensor_split": lambda s: s.args[:1],
}


# Ops whose out= PyTorch fills in Python (resize_as_ + copy_), so out tensors on another device are
# accepted on every device: the errors variant does not expect a device error from them.
OUT_ANY_DEVICE = {
    "lu": "torch.lu copies its results into out= in Python (torch/functional.py)",
}


def host_tensors(name: str, sample) -> list:
    pick = HOST_TENSORS.get(name)
    return [t for t in pick(sample) if isinstance(t, torch.Tensor)] if pick else []


def random_sample(name: str, sample) -> bool:
    predicate = RANDOM_SAMPLES.get(name)
    return bool(predicate and predicate(sample))


def _match(name: str, table: dict[str, list[str]]) -> str | None:
    for reason, patterns in table.items():
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return reason
    return None


def lookup(name: str) -> tuple[str, str | None]:
    """('skip', reason), ('shape-only', reason) or ('full', None) for an OpInfo's full name."""
    reason = _match(name, SKIP)
    if reason:
        return "skip", reason
    reason = _match(name, SHAPE_ONLY)
    if reason:
        return "shape-only", reason
    return "full", None
