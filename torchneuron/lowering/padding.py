"""Which ops may run on operands padded along an axis, and what they need to stay exact.

An axis is padded when its size runs rounded up (a shape bucket) and only its first `true` positions
hold data. A rule is a function of one op call's arguments, bound by name (tensors as real or fake
tensors: only ndim and dtype are read), that returns a `Padding` saying how the call stays exact on
padded operands, or None where it cannot. Axes a rule does not name are position-wise: a padded
position there only ever changes the same position of the result. The compile driver consults
`padding_of` for the ops of an FX graph (compile/buckets.py); rules speak of a call's arguments, not
of graph nodes, so that the eager driver can consult the same ones for single calls.

    >>> call = bind(aten.sum.dim_IntList, (torch.ones(4, 3), [0]), {})
    >>> rule_for(aten.sum.dim_IntList)(call).fills
    (Fill(operand='self', axes=(0,), value=0),)
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax.numpy as jnp
import torch

from .. import config
from ..runtime.dtypes import to_jax
from . import attention
from .records import RECORDS, record

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Fill:
    """Padded positions of `operand` along `axes` (those of them that are padded) become `value`."""

    operand: str
    axes: tuple[int, ...]
    value: float | int | bool


@dataclasses.dataclass(frozen=True)
class Padding:
    """How one call stays exact on padded operands.

    fills: operands masked before the op runs. exact: (operand, axes) that must not be padded.
    masked: where the op needs the true size, an implementation `masked(call, valid)` over the bound
    arguments (arrays) and `valid`, a boolean array broadcastable to operand `counted`, true at the
    unpadded positions of its `counted_axes`.
    """

    fills: tuple[Fill, ...] = ()
    exact: tuple[tuple[str, tuple[int, ...]], ...] = ()
    masked: Callable | None = None
    counted: str = "self"
    counted_axes: tuple[int, ...] = ()


POSITION_WISE = Padding()


def bucket(size: int) -> int:
    """The padded size a dynamic size runs at: the next power of two, at least config.MIN_BUCKET
    (compiled graphs and eager ops alike)."""
    return max(config.MIN_BUCKET, 1 << max(size - 1, 0).bit_length())

# Ops that only regroup a tensor's elements into new axes (view/reshape): position-wise per
# element, but an axis they merge or split is padded as its factors are (the caller tracks that).
REGROUPING = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})


def pads(*ops):
    """Register `rule(call) -> Padding | None` as the padding rule of each of `ops` (on its record)."""
    def register(rule):
        for op in ops:
            record(op).padding = rule
        return rule
    return register


def rule_for(op) -> Callable | None:
    """The padding rule of `op`: registered, or position-wise for pointwise ops; None if unknown."""
    found = RECORDS.get(op)
    rule = found.padding if found is not None else None
    if rule is None and isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags:
        return _position_wise
    return rule


def bind(op, args, kwargs) -> dict:
    """The call's arguments by name, defaults filled in."""
    call = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            call[a.name] = args[i]
        elif a.name in kwargs:
            call[a.name] = kwargs[a.name]
        elif a.has_default_value():
            call[a.name] = a.default_value
    return call


def _dims(call, name="dim") -> tuple[int, ...]:
    """The axes a reduction reduces: its `dim` argument, every axis when it is None or empty."""
    ndim = call["self"].ndim
    dims = call.get(name)
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return tuple(range(ndim))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(d % max(ndim, 1) for d in dims)


def _all(t) -> tuple[int, ...]:
    return tuple(range(t.ndim))


def _lowest(dtype):
    if dtype.is_floating_point:
        return -math.inf
    return False if dtype is torch.bool else torch.iinfo(dtype).min


def _highest(dtype):
    if dtype.is_floating_point:
        return math.inf
    return True if dtype is torch.bool else torch.iinfo(dtype).max


def _position_wise(call):
    return POSITION_WISE


pads(aten.transpose.int, aten.t.default, aten.permute.default, aten.expand.default, aten.clone.default,
     aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.alias.default,
     aten.detach.default, aten._to_copy.default, torch.ops.prims.convert_element_type.default,
     aten.full.default, aten.full_like.default,
     aten.zeros_like.default, aten.ones_like.default, aten.scalar_tensor.default,
     aten.tril.default, aten.triu.default,
     # uninitialised memory: the table allocates zeros, whose value at a position ignores the size
     aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default,
     aten.new_empty_strided.default,
     aten.fill.Scalar, aten.fill.Tensor, aten.zero.default,
     # arange(B)[:s] == arange(s)
     aten.arange.default, aten.arange.start)(_position_wise)


@pads(aten.isin.Tensor_Tensor)
def _isin(call):
    # position-wise in the elements; a padded test element could match one of them
    return Padding(exact=(("test_elements", _all(call["test_elements"])),))


@pads(aten.split.Tensor, aten.split_with_sizes.default)
def _split(call):
    return Padding(exact=(("self", (call["dim"] % call["self"].ndim,)),))


@pads(aten.select.int)
def _select(call):
    return Padding(exact=(("self", (call["dim"] % call["self"].ndim,)),))


def _whole(call, size) -> bool:
    """The slice start:end:step takes every position of an axis of `size`: x[:], x[0:n] of n."""
    end = call["end"]
    if isinstance(end, torch.SymInt) and isinstance(size, torch.SymInt):
        # the same size (a bucketed graph runs both as the bucket), compared without a guard
        ends = end.node.expr == size.node.expr
    else:
        ends = end is None or (type(end) is int and (end >= 2**62 or type(size) is int and end >= size))
    return call["start"] in (None, 0) and ends and call["step"] == 1


@pads(aten.slice.Tensor)
def _slice(call):
    if _whole(call, call["self"].shape[call["dim"] % call["self"].ndim]):  # every position stays put
        return POSITION_WISE
    return Padding(exact=(("self", (call["dim"] % call["self"].ndim,)),))


@pads(aten.slice_scatter.default)
def _slice_scatter(call):
    # x[:, :] = src writes every position of src where it was; a partial slice along a padded axis
    # would move or drop positions (src's padding lands inside x's true region)
    dim = call["dim"] % call["self"].ndim
    if _whole(call, call["self"].shape[dim]):
        return POSITION_WISE
    return Padding(exact=(("self", (dim,)), ("src", (dim,))))


def _legacy_empty(t) -> bool:
    """A 1-D tensor of size 0, which cat skips whatever the other operands' shapes."""
    return t.ndim == 1 and type(t.shape[0]) is int and t.shape[0] == 0


@pads(aten.cat.default)
def _cat(call):
    # cat([torch.tensor([]), x]) is x (an empty cache grown by its first update): positions stay put
    if sum(not _legacy_empty(t) for t in call["tensors"]) == 1:
        return POSITION_WISE
    return Padding(exact=(("tensors", (call["dim"] % call["tensors"][0].ndim,)),))


@pads(aten.embedding.default)
def _embedding(call):
    # padded indices read row 0, never past the table (device asserts check the bounds)
    return Padding(fills=(Fill("indices", _all(call["indices"]), 0),))


@pads(aten.embedding_dense_backward.default)
def _embedding_backward(call):
    if call["scale_grad_by_freq"]:
        return None  # counts the padded indices
    grad, indices = call["grad_output"], call["indices"]
    return Padding(fills=(Fill("grad_output", tuple(range(grad.ndim - 1)), 0), Fill("indices", _all(indices), 0)))


@pads(aten.native_layer_norm.default)
def _layer_norm(call):
    x = call["input"]
    return Padding(exact=(("input", tuple(range(x.ndim - len(call["normalized_shape"]), x.ndim))),))


@pads(aten.native_layer_norm_backward.default)
def _layer_norm_backward(call):
    # the weight and bias gradients sum over the leading axes: zero every factor there (also
    # turning NaN/inf computed from padding into 0)
    x = call["input"]
    leading = tuple(range(x.ndim - len(call["normalized_shape"])))
    normalized = tuple(range(len(leading), x.ndim))
    return Padding(fills=tuple(Fill(name, leading, 0) for name in ("grad_out", "input", "mean", "rstd")),
                   exact=(("input", normalized),))


# (operand, contracted axis) of each matrix product: padded entries of both become 0
_CONTRACTIONS = {aten.mm.default: (("self", 1), ("mat2", 0)), aten.addmm.default: (("mat1", 1), ("mat2", 0)),
                 aten.bmm.default: (("self", 2), ("mat2", 1))}


def _contraction(operands):
    return lambda call: Padding(fills=tuple(Fill(name, (axis,), 0) for name, axis in operands))


for _op, _operands in _CONTRACTIONS.items():
    pads(_op)(_contraction(_operands))


@pads(aten._softmax.default, aten._safe_softmax.default, aten._log_softmax.default, aten.logsumexp.default)
def _softmax(call):
    """exp(-inf) = 0: a padded position adds nothing to the normaliser."""
    if not call["self"].dtype.is_floating_point:
        return None
    return Padding(fills=(Fill("self", _dims(call), -math.inf),))


@pads(aten._softmax_backward_data.default)
def _softmax_backward(call):
    dim = call["dim"] % call["output"].ndim
    return Padding(fills=(Fill("grad_output", (dim,), 0), Fill("output", (dim,), 0)))


@pads(aten._log_softmax_backward_data.default)
def _log_softmax_backward(call):
    dim = call["dim"] % call["output"].ndim
    return Padding(fills=(Fill("grad_output", (dim,), 0), Fill("output", (dim,), -math.inf)))


@pads(aten.sum.dim_IntList, aten.sum.default)
def _sum(call):
    return Padding(fills=(Fill("self", _dims(call), False if call["self"].dtype is torch.bool else 0),))


@pads(aten.prod.dim_int, aten.prod.default)
def _prod(call):
    return Padding(fills=(Fill("self", _dims(call), True if call["self"].dtype is torch.bool else 1),))


@pads(aten.amax.default, aten.max.dim, aten.max.default)
def _max(call):
    return Padding(fills=(Fill("self", _dims(call), _lowest(call["self"].dtype)),))


@pads(aten.amin.default, aten.min.dim, aten.min.default)
def _min(call):
    return Padding(fills=(Fill("self", _dims(call), _highest(call["self"].dtype)),))


def _flat_index(call):
    """argmax/argmin without a dim index the flattened tensor: padding moves every row after the first."""
    return call["dim"] is None and call["self"].ndim > 1


@pads(aten.argmax.default)
def _argmax(call):
    return None if _flat_index(call) else _max(call)


@pads(aten.argmin.default)
def _argmin(call):
    return None if _flat_index(call) else _min(call)


@pads(aten.linalg_vector_norm.default)
def _vector_norm(call):
    if call["ord"] < 0:
        return None  # 0 ** negative order is inf
    return Padding(fills=(Fill("self", _dims(call), 0),))


def _wide(x):
    """Low-precision floats count in float32, as the reductions' lowerings do."""
    return x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize < 4 else x


def _masked_moments(x, valid, dims, correction):
    """(mean, variance with `correction`) of `x` over `dims`, counting only `valid` positions."""
    valid = jnp.broadcast_to(valid, x.shape)
    count = jnp.sum(valid, axis=dims, keepdims=True)
    mean = jnp.sum(jnp.where(valid, x, 0), axis=dims, keepdims=True) / count
    if correction is None:
        return mean, None
    centred = jnp.where(valid, x - mean, 0)
    # degrees of freedom clamped at 0, as PyTorch does (inf, or nan for a zero sum)
    return mean, jnp.sum(centred * jnp.conj(centred), axis=dims, keepdims=True).real / jnp.maximum(count - correction, 0)


def _reduced(value, dims, keepdim):
    return value if keepdim else jnp.squeeze(value, axis=dims)


@pads(aten.mean.dim, aten.mean.default)
def _mean(call):
    dims = _dims(call)

    def masked(c, valid):
        x = _wide(c["self"] if c.get("dtype") is None else c["self"].astype(to_jax(c["dtype"])))
        return _reduced(_masked_moments(x, valid, dims, None)[0], dims, c.get("keepdim", False))

    return Padding(masked=masked, counted_axes=dims)


def _correction(c):
    return 1 if c["correction"] is None else c["correction"]


def _moments(finish):
    """The rule of var/std/var_mean: `finish(mean, variance)` of the true positions."""
    def rule(call):
        dims = _dims(call)

        def masked(c, valid):
            mean, variance = _masked_moments(_wide(c["self"]), valid, dims, _correction(c))
            return finish(_reduced(mean, dims, c["keepdim"]), _reduced(variance, dims, c["keepdim"]))

        return Padding(masked=masked, counted_axes=dims)
    return rule


pads(aten.var.correction)(_moments(lambda mean, variance: variance))
pads(aten.std.correction)(_moments(lambda mean, variance: jnp.sqrt(variance)))
pads(aten.var_mean.correction)(_moments(lambda mean, variance: (variance, mean)))


@pads(aten.mse_loss.default)
def _mse_loss(call):
    axes = _all(call["self"])
    if call["reduction"] == 0:  # none
        return POSITION_WISE
    if call["reduction"] == 2:  # sum
        return Padding(fills=(Fill("self", axes, 0), Fill("target", axes, 0)))

    def masked(c, valid):
        error = jnp.where(valid, _wide(c["self"]) - _wide(c["target"]), 0)
        return jnp.sum(error * error) / jnp.sum(jnp.broadcast_to(valid, error.shape))

    return Padding(masked=masked, counted_axes=axes)


@pads(aten.mse_loss_backward.default)
def _mse_loss_backward(call):
    axes = _all(call["self"])

    def masked(c, valid):
        scale = 2.0 / (jnp.sum(jnp.broadcast_to(valid, c["self"].shape)) if c["reduction"] == 1 else 1)
        grad = scale * (_wide(c["self"]) - _wide(c["target"])) * _wide(c["grad_output"])
        return jnp.where(valid, grad, 0)

    return Padding(masked=masked, counted_axes=axes)


@pads(aten.nll_loss_forward.default, aten.nll_loss_backward.default, aten.nll_loss2d_forward.default,
      aten.nll_loss2d_backward.default)
def _nll_loss(call):
    # padded targets are ignored: they add nothing to the loss, its gradient or total_weight
    return Padding(fills=(Fill("target", _all(call["target"]), call["ignore_index"]),))


def padding_of(op, args, kwargs) -> Padding | None:
    """How the call `op(*args, **kwargs)` stays exact on padded operands; None where unknown or unsafe."""
    rule = rule_for(op)
    if rule is None:
        return None
    return rule(bind(op, args, kwargs))


# ------------------------------------------------------------------ fused attention
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
def _attention(call):
    if call.get("dropout_p", 0.0) > 0.0:
        return None

    def masked(c, valid):
        bias = _key_padding_bias(c["key"], valid, c.get("attn_bias"))
        return attention.sdpa_overrideable(c["query"], c["key"], c["value"], bias, 0.0, c["is_causal"],
                                           c["return_debug_mask"], scale=c.get("scale"))

    return Padding(fills=(Fill("value", (2,), 0), Fill("key", (2,), 0)), masked=masked, counted="key",
                   counted_axes=(2,), exact=_ATTENTION_EXACT)


@pads(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def _attention_backward(call):
    if call.get("dropout_p", 0.0) > 0.0:
        return None

    def masked(c, valid):
        bias = _key_padding_bias(c["key"], valid, c.get("attn_bias"))
        grad_q, grad_k, grad_v, grad_bias = attention.sdpa_overrideable_backward(
            c["grad_out"], c["query"], c["key"], c["value"], bias, c["grad_input_mask"], c["out"],
            c["logsumexp"], c["cum_seq_q"], c["cum_seq_k"], c["max_q"], c["max_k"], 0.0, c["is_causal"],
            c["philox_seed"], c["philox_offset"], scale=c.get("scale"))
        if c.get("attn_bias") is None:
            return grad_q, grad_k, grad_v, None
        # the gradient of the caller's bias, not of the one padding widened (-inf there: no weight)
        return grad_q, grad_k, grad_v, attention.sum_to(grad_bias, c["attn_bias"].shape).astype(c["attn_bias"].dtype)

    fills = (Fill("grad_out", (2,), 0), Fill("query", (2,), 0), Fill("key", (2,), 0), Fill("value", (2,), 0),
             Fill("out", (2,), 0), Fill("logsumexp", (2,), 0))
    return Padding(fills=fills, masked=masked, counted="key", counted_axes=(2,), exact=_ATTENTION_EXACT)
