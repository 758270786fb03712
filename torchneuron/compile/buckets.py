"""Shape buckets for dynamic graphs: one executable per power-of-two size, not per size.

A graph traced with symbolic sizes (torch.compile(dynamic=True), mark_dynamic) runs with each
dynamic size s rounded up to its bucket B = max(MIN_BUCKET, next power of two >= s), MIN_BUCKET being
config.MIN_BUCKET (default 8; config.BUCKETS off keeps exact sizes): tensor inputs are zero-padded
to B along their padded axes, the graph runs at size B, and the outputs are sliced back to s. This
is only correct where a padded position can never change an unpadded one, so a graph is bucketed
only if every op that touches a padded axis has a padding rule (lowering/padding.py) that keeps it
exact: position-wise, safe once its operands are filled along the axis (softmax with -inf, sums and
matrix products with 0, padded targets with ignore_index, ...), or computed with the true sizes
(means, variances), which enter the executable as a traced vector, so they never recompile.

An axis may merge several sizes (a view of (b, t, c) as (b*t, c)): its layout, the factors it
merges in row-major order, is read from the graph's views, and a position of it is padded when any
factor's digit is. Anything without a rule or with an unknown layout (indexing or slicing along a
padded axis, sizes used as values, sizes other than products of symbols) leaves the graph on exact
shapes: one executable per distinct size, as before. See docs/COMPILE.md.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import sympy
import torch
import torch.fx

from .. import config
from ..lowering import padding
from ..lowering.padding import bucket

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)
# argument types a size may fill (SymInt, SymInt[]: schemas print them as int): they shape the op
_SHAPE_TYPES = {"int", "List[int]", "Optional[int]", "Optional[List[int]]"}


def _expr(size):
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)


def _shape(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return [_expr(d) for d in val.shape] if isinstance(val, torch.Tensor) else []


class Masking:
    """What one op of a bucketed graph needs: operands filled along padded axes, and for ops that
    need the true size, the rule's masked implementation with the validity of operand `counted`."""

    def __init__(self, fills, counted, rule):
        self.fills = fills  # [(operand name, axis, layout, value)]
        self.counted = counted  # [(axis, layout)] of rule.counted; empty: the op's own lowering runs
        self.rule = rule

    def fill(self, op, args, kwargs, sizes):
        args, kwargs = list(args), dict(kwargs)
        for name, axis, layout, value in self.fills:
            x = _get(op, name, args, kwargs)
            keep = sizes.valid(layout, axis, x.ndim)
            _set(op, name, args, kwargs, jnp.where(keep, x, jnp.asarray(value, x.dtype)))
        return args, kwargs

    def run(self, op, args, kwargs, sizes):
        call = padding.bind(op, args, kwargs)
        ndim = call[self.rule.counted].ndim
        valid = True
        for axis, layout in self.counted:
            valid = valid & sizes.valid(layout, axis, ndim)
        return self.rule.masked(call, valid)


def _index(op, name):
    for i, a in enumerate(op._schema.arguments):
        if a.name == name:
            return None if a.kwarg_only else i


def _get(op, name, args, kwargs):
    i = _index(op, name)
    return args[i] if i is not None and i < len(args) else kwargs[name]


def _set(op, name, args, kwargs, value):
    i = _index(op, name)
    if i is not None and i < len(args):
        args[i] = value
    else:
        kwargs[name] = value


class Sizes:
    """One call's sizes while the executable traces: true sizes (traced) and buckets (static)."""

    def __init__(self, true, buckets):
        self.true, self.buckets = true, buckets

    def valid(self, layout, axis, ndim):
        """Booleans broadcastable along `axis` of an `ndim` array: true at its unpadded positions."""
        sizes = [int(self.buckets.get(f, f)) for f in layout]
        position, keep, stride = jnp.arange(math.prod(sizes)), True, math.prod(sizes)
        for factor, size in zip(layout, sizes):
            stride //= size
            if factor in self.true:
                keep = keep & ((position // stride) % size < self.true[factor])
        return keep.reshape([-1 if d == axis else 1 for d in range(ndim)])


class Plan:
    """How to run one graph on buckets: which inputs to pad, which ops to mask, how to slice outputs."""

    def __init__(self, symbols: dict, derived: dict, layouts: dict, masks: dict):
        self.symbols = symbols  # sympy symbol -> index of its SymInt placeholder
        self.derived = derived  # index of a SymInt placeholder -> its expression (a product of symbols)
        self.layouts = layouts  # merged axis size -> its factors, outermost first
        self.masks = masks  # node -> Masking
        self.size_outputs = {}  # index of an output that is a size (saved for backward) -> its expression

    def sizes(self, inputs) -> tuple[dict, dict]:
        """True and bucketed values of each symbol."""
        true = {s: int(inputs[i]) for s, i in self.symbols.items()}
        return true, {s: bucket(v) for s, v in true.items()}

    def layout(self, expr) -> tuple:
        return (expr,) if expr in self.symbols else self.layouts.get(expr, ())

    def pad(self, x, shape, true: dict, buckets: dict):
        """Zero-pad jax array `x`, whose symbolic shape is `shape`, to its bucketed shape."""
        return _reshaped(x, [self.layout(e) for e in shape], true, buckets, pad=True)

    def unpad(self, x, shape, true: dict, buckets: dict):
        """Slice jax array `x`, whose symbolic shape is `shape`, back to the true sizes."""
        return _reshaped(x, [self.layout(e) for e in shape], true, buckets, pad=False)


def _reshaped(x, layouts, true, buckets, pad):
    """`x` with each padded axis's factors padded from true sizes to buckets (or sliced back)."""
    if not any(f in true for layout in layouts for f in layout):
        return x

    def sizes(of):
        return [[int(of.get(f, f)) for f in layout] if layout else [n] for layout, n in zip(layouts, x.shape)]

    starts, ends = sizes(true if pad else buckets), sizes(buckets if pad else true)
    x = x.reshape([n for axis in starts for n in axis])
    ends_flat = [n for axis in ends for n in axis]
    if pad:
        x = jnp.pad(x, [(0, end - n) for end, n in zip(ends_flat, x.shape)])
    else:
        x = x[tuple(slice(0, end) for end in ends_flat)]
    return x.reshape([math.prod(axis) for axis in ends])


def plan(gm: torch.fx.GraphModule) -> Plan | None:
    """A bucketing plan for `gm`, or None where padding cannot be shown safe."""
    if not config.BUCKETS:
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    symbols, derived = {}, {}
    for i, n in enumerate(placeholders):
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
            symbols[val.node.expr] = i
        elif isinstance(val, torch.SymInt):
            derived[i] = val.node.expr
        elif isinstance(val, _SYM):
            return None
    if not symbols or not all(_monomial(e, symbols) for e in derived.values()):
        return None
    layouts = _layouts(gm, symbols)
    if layouts is None:
        return None
    known = Plan(symbols, derived, layouts, {})
    shifts = _shifts(gm, known)
    for node in gm.graph.nodes:
        if node in shifts:
            if shifts[node] is not None:
                known.masks[node] = shifts[node]
            continue
        shapes = [_shape(a) for a in _tensor_args(node)] + [_shape(node)]
        if not all(_known(e, known) for shape in shapes for e in shape):
            return None
        if node.op == "output":
            for i, a in enumerate(node.args[0]):
                val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                if isinstance(val, _SYM) and not (isinstance(val, torch.SymInt) and _monomial(val.node.expr, symbols)):
                    return None  # a size the graph computes from bucketed sizes
                if isinstance(val, torch.SymInt):
                    known.size_outputs[i] = val.node.expr
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target is torch.ops.aten.sym_size.int:
            # size arithmetic, as operator.mul: a bucket while tracing, and its users (size outputs,
            # shapes) are checked as any size's are
            continue
        if not _sizes_only_as_shapes(node):
            return None
        if node.target in padding.REGROUPING or not any(_padded(e, symbols) for shape in shapes for e in shape):
            continue
        masking = _masking(node, known)
        if masking is None:
            return None
        if masking.fills or masking.counted:
            known.masks[node] = masking
    return known


def _padded(expr, symbols) -> bool:
    return bool(expr.free_symbols & symbols.keys())


def _monomial(expr, symbols) -> bool:
    """A product of symbols and an integer: a size padding can address."""
    return expr.free_symbols <= symbols.keys() and all(
        f.is_Integer or f in symbols for f in sympy.Mul.make_args(expr))


def _known(expr, plan) -> bool:
    return not expr.free_symbols or expr in plan.symbols or expr in plan.layouts


def _layouts(gm, symbols) -> dict | None:
    """The layout of each merged size, read from the graph's views; None where two views disagree
    or one regroups padded factors other than by merging and splitting them in order."""
    layouts = {}
    views = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in padding.REGROUPING]
    changed = True
    while changed:
        changed = False
        for node in views:
            for source, target in ((_shape(node.args[0]), _shape(node)), (_shape(node), _shape(node.args[0]))):
                factors = _factors(source, symbols, layouts)
                if factors is None:
                    continue
                groups = _regroup(factors, target)
                if groups is None:
                    return None
                for expr, group in zip(target, groups):
                    if not _padded(expr, symbols):
                        continue
                    if expr in symbols or expr in layouts:
                        if (expr,) != group and layouts.get(expr) != group:
                            return None
                    elif _monomial(expr, symbols):
                        layouts[expr] = group
                        changed = True
                    else:
                        return None
    return layouts


def _factors(shape, symbols, layouts) -> list | None:
    factors = []
    for e in shape:
        if e in symbols:
            factors.append(e)
        elif _padded(e, symbols):
            if e not in layouts:
                return None
            factors.extend(layouts[e])
        elif e != 1:
            factors.append(e)
    return factors


def _regroup(factors, shape) -> list | None:
    """The factors each axis of `shape` takes, consuming `factors` in order (static ones split)."""
    factors, groups = list(factors), []
    for need in shape:
        group = []
        while need != 1:
            if not factors:
                return None
            f = factors.pop(0)
            rest = need / f
            if sympy.fraction(rest)[1] == 1:
                group.append(f)
                need = rest
            elif f.is_Integer and need.is_Integer and f % need == 0:
                group.append(need)
                factors.insert(0, f // need)
                need = sympy.Integer(1)
            else:
                return None
        groups.append(tuple(group))
    return groups if all(f == 1 for f in factors) else None


def _whole_end(end) -> bool:
    return end is None or (type(end) is int and end >= 2**62)


def _shifts(gm, plan) -> dict:
    """Shifts left along a padded axis, written pad-then-slice (Hugging Face's causal LM loss shifts
    its labels so): y = constant_pad_nd(x, k after the axis's end, value v)[k:], so y[i] = x[i + k]
    where i + k < s, else v. Run at bucket B with x's padded positions set to v it gives the same
    y[i] for every i < s: x[i + k] where i + k < s, and v from the filled positions or the pad
    beyond B. The intermediate's size s + k is never padded or sliced back by the plan.

    Maps each such pad to its Masking and its slices to None (both skip the other checks)."""
    shifts = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.constant_pad_nd.default:
            continue
        shape, pad = _shape(node.args[0]), node.args[1]
        value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
        pairs = {len(shape) - 1 - j: (pad[2 * j], pad[2 * j + 1]) for j in range(len(pad) // 2)}
        moved = [(axis, after) for axis, (before, after) in pairs.items() if (before, after) != (0, 0)]
        if len(moved) != 1 or not all(type(p) is int for p in pad):
            continue
        axis, k = moved[0]
        if pairs[axis][0] != 0 or k < 0 or not _padded(shape[axis], plan.symbols) or not _known(shape[axis], plan):
            continue
        slices = _shift_slices(node, axis, k, len(shape))
        if slices is None:
            continue
        shifts[node] = Masking([("self", axis, plan.layout(shape[axis]), value)], [], None)
        shifts.update((u, None) for u in slices)
    return shifts


def _shift_slices(node, axis, k, ndim) -> list | None:
    """The slices that take `node` (padded by k after `axis`) back to its input's shape: on every
    path, whole slices along other axes (x[:, 2:] slices axis 0 whole first), then [k:] along `axis`."""
    found = []
    for u in node.users:
        if u.target is not torch.ops.aten.slice.Tensor or u.args[0] is not node or u.kwargs or len(u.args) < 3:
            return None
        dim, start = u.args[1] % ndim, u.args[2]
        end, step = (u.args[3] if len(u.args) > 3 else None), (u.args[4] if len(u.args) > 4 else 1)
        if step != 1 or not _whole_end(end):
            return None
        if dim == axis and start == k:
            found.append(u)
        elif dim != axis and start in (None, 0):
            rest = _shift_slices(u, axis, k, ndim)
            if rest is None:
                return None
            found += [u, *rest]
        else:
            return None
    return found or None


def _masking(node, plan) -> Masking | None:
    meta_args = [_meta(a) for a in node.args]
    meta_kwargs = {k: _meta(v) for k, v in node.kwargs.items()}
    rule = padding.padding_of(node.target, meta_args, meta_kwargs)
    if rule is None:
        return None
    call = padding.bind(node.target, node.args, node.kwargs)

    def padded_axes(name, axes):
        operands = call.get(name)
        operands = operands if isinstance(operands, (list, tuple)) else [operands]
        shapes = [_shape(a) for a in operands if isinstance(a, torch.fx.Node)]
        return [(shape, axis) for shape in shapes for axis in axes
                if axis < len(shape) and _padded(shape[axis], plan.symbols)]

    if any(padded_axes(name, axes) for name, axes in rule.exact):
        return None
    fills = []
    for f in rule.fills:
        for shape, axis in padded_axes(f.operand, f.axes):
            fills.append((f.operand, axis, plan.layout(shape[axis]), f.value))
    counted = []
    if rule.masked is not None:
        counted = [(axis, plan.layout(shape[axis])) for shape, axis in padded_axes(rule.counted, rule.counted_axes)]
    return Masking(fills, counted, rule)


def _meta(a):
    if isinstance(a, torch.fx.Node):
        return a.meta.get("val")
    if isinstance(a, (list, tuple)):
        return type(a)(_meta(x) for x in a)
    return a


def _sizes_only_as_shapes(node) -> bool:
    """Symbolic sizes may shape ops (they become bucket sizes) but never be values."""
    if node.target in (torch.ops.aten.arange.default, torch.ops.aten.arange.start):
        return True  # arange(s): its Scalars shape it, and arange(B)[:s] == arange(s)
    call = padding.bind(node.target, node.args, node.kwargs)
    for a in node.target._schema.arguments:
        if str(a.type) not in _SHAPE_TYPES and _is_size(call.get(a.name)):
            return False
    return True


def _is_size(a) -> bool:
    if isinstance(a, (list, tuple)):
        return any(_is_size(x) for x in a)
    return isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), _SYM)


def _tensor_args(node):
    def flat(a):
        if isinstance(a, (list, tuple)):
            return [x for v in a for x in flat(v)]
        return [a] if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) else []
    return flat(list(node.args) + list(node.kwargs.values()))


def shape_of(node):
    return _shape(node)
