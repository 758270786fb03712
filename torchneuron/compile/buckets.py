"""Shape buckets for dynamic graphs: one executable per power-of-two size, not per size.

A graph traced with symbolic sizes (torch.compile(dynamic=True), mark_dynamic) runs with each
dynamic size s rounded up to its bucket B = max(MIN_BUCKET, next power of two >= s), MIN_BUCKET being
config.MIN_BUCKET (default 8; config.BUCKETS off keeps exact sizes): tensor inputs are zero-padded
to B along the axes of size s, the graph runs at size B, and the outputs are sliced back to s. This
is only correct where a padded position can never change an unpadded one, so a graph is bucketed
only if every op that touches a padded axis is one of:

- position-wise along it: pointwise ops, views, embedding lookups, factories (arange, full),
  tril/triu, matrix products and layer norms that do not contract or normalise over it;
- a reduction over it that the compiler masks with the true size (passed as a traced value, so
  it never recompiles): softmax (padded entries -> -inf) and matrix products contracting over it
  (padded entries of both operands -> 0, which also removes NaN/inf computed from padding).

Anything else touching a padded axis (sums, means, norms over it, indexing or slicing along it,
sizes used as values, input mutations, outputs whose padded axis merges several sizes) leaves the
graph on exact shapes: one executable per distinct size, as before. See docs/COMPILE.md.
"""
from __future__ import annotations

import jax.numpy as jnp
import sympy
import torch
import torch.fx

from .. import config

aten = torch.ops.aten

_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.transpose.int, aten.t.default,
          aten.permute.default, aten.expand.default, aten.clone.default, aten.split.Tensor,
          aten.split_with_sizes.default, aten.unsqueeze.default, aten.squeeze.dim, aten.alias.default,
          aten.detach.default, aten._to_copy.default}
_ARANGE = {aten.arange.default, aten.arange.start}
_POSITIONAL = _ARANGE | {aten.embedding.default, aten.full.default,
               aten.scalar_tensor.default, aten.tril.default, aten.triu.default}
_SOFTMAX = {aten._safe_softmax.default, aten._softmax.default}
# (operand index, contracted axis) of each matrix product
_CONTRACTIONS = {aten.mm.default: ((0, 1), (1, 0)), aten.addmm.default: ((1, 1), (2, 0)),
                 aten.bmm.default: ((0, 2), (1, 1))}


def bucket(size: int) -> int:
    return max(config.MIN_BUCKET, 1 << max(size - 1, 0).bit_length())


def _expr(size):
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)


def _shape(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return [_expr(d) for d in val.shape] if isinstance(val, torch.Tensor) else []


class Plan:
    """How to run one graph on buckets: which inputs to pad, which ops to mask, how to slice outputs."""

    def __init__(self, symbols: dict, masks: dict):
        self.symbols = symbols  # sympy symbol -> index of its SymInt placeholder
        self.masks = masks  # node -> [(operand index, axis, symbol, fill)]

    def sizes(self, inputs) -> tuple[dict, dict]:
        """True and bucketed values of each symbol."""
        true = {s: int(inputs[i]) for s, i in self.symbols.items()}
        return true, {s: bucket(v) for s, v in true.items()}


def plan(gm: torch.fx.GraphModule) -> Plan | None:
    """A bucketing plan for `gm`, or None where padding cannot be shown safe."""
    if not config.BUCKETS:
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    symbols = {}
    for i, n in enumerate(placeholders):
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt):
            if not isinstance(val.node.expr, sympy.Symbol):
                return None
            symbols[val.node.expr] = i
    if not symbols:
        return None
    masks = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder" and not all(_plain(e, symbols) for e in _shape(node)):
            return None
        if node.op == "output" and not _outputs_safe(node, symbols):
            return None
        if node.op != "call_function":
            continue
        if not _sizes_only_as_shapes(node, symbols):
            return None
        verdict = _classify(node, symbols)
        if verdict is None:
            return None
        if verdict:
            masks[node] = verdict
    return Plan(symbols, masks)


def _padded(expr, symbols) -> bool:
    return bool(expr.free_symbols & symbols.keys())


def _plain(expr, symbols) -> bool:
    """A size that is static or exactly one symbol (what padding and slicing address)."""
    return not _padded(expr, symbols) or expr in symbols


def _outputs_safe(node, symbols) -> bool:
    for a in node.args[0]:
        if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.SymInt):
            return False  # a size computed from bucketed sizes
        if isinstance(a, torch.fx.Node) and not all(_plain(e, symbols) for e in _shape(a)):
            return False
    return True


def _sizes_only_as_shapes(node, symbols) -> bool:
    """Symbolic sizes may shape ops (they become bucket sizes) but never be values."""
    if not isinstance(node.target, torch._ops.OpOverload) or node.target in _ARANGE:
        return True  # arange(s): its Scalars shape it, and arange(B)[:s] == arange(s)
    from ..lowering.calling import Kind, kind_of
    schema = node.target._schema.arguments
    for i, a in enumerate(node.args):
        if i < len(schema) and kind_of(schema[i]) in (Kind.SCALAR, Kind.SCALARS) and _is_size(a):
            return False
    return not any(_is_size(v) for k, v in node.kwargs.items() if k in ("value", "other", "alpha"))


def _is_size(a) -> bool:
    return isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.SymInt)


def _classify(node, symbols):
    """[] if position-wise, a list of masks if safe once masked, None if unsafe."""
    target = node.target
    touched = [s for a in _tensor_args(node) for s in _shape(a)] + [s for s in _shape(node)]
    if not any(_padded(e, symbols) for e in touched) or not isinstance(target, torch._ops.OpOverload):
        return []
    if target in _VIEWS or target in _POSITIONAL or torch.Tag.pointwise in target.tags:
        return []
    if target is aten.native_layer_norm.default:
        axes = _shape(node.args[0])[-len(node.args[1]):]
        return [] if not any(_padded(e, symbols) for e in axes) else None
    if target in _SOFTMAX:
        return _mask_axes(node, [(0, node.args[1])], symbols, -jnp.inf)
    if target in _CONTRACTIONS:
        return _mask_axes(node, _CONTRACTIONS[target], symbols, 0)
    return None


def _mask_axes(node, operand_axes, symbols, fill):
    masks = []
    for index, axis in operand_axes:
        shape = _shape(node.args[index])
        expr = shape[axis % len(shape)]
        if not _padded(expr, symbols):
            continue
        if expr not in symbols:
            return None
        masks.append((index, axis % len(shape), expr, fill))
    return masks


def _tensor_args(node):
    def flat(a):
        if isinstance(a, (list, tuple)):
            return [x for v in a for x in flat(v)]
        return [a] if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) else []
    return flat(list(node.args) + list(node.kwargs.values()))


def apply_masks(masks, args, true_sizes, order):
    """The operands of a masked op with positions at or past the true size replaced by `fill`."""
    args = list(args)
    for index, axis, symbol, fill in masks:
        x = args[index]
        position = jnp.arange(x.shape[axis]).reshape([-1 if d == axis else 1 for d in range(x.ndim)])
        keep = position < true_sizes[order.index(symbol)]
        args[index] = jnp.where(keep, x, jnp.asarray(fill, x.dtype))
    return args


def pad(x, shape, true: dict, buckets: dict):
    """Zero-pad jax array `x`, whose symbolic shape is `shape`, to its bucketed shape."""
    widths = [(0, buckets[e] - true[e]) if e in true else (0, 0) for e in shape]
    return jnp.pad(x, widths) if any(w for _, w in widths) else x


def unpad(x, shape, true: dict):
    """Slice jax array `x`, whose symbolic shape is `shape`, back to the true sizes."""
    if not any(e in true for e in shape):
        return x
    return x[tuple(slice(0, true[e]) if e in true else slice(None) for e in shape)]


def shape_of(node):
    return _shape(node)
