"""JAX (and Pallas) functions as PyTorch custom ops: `jax_op`.

    @torchneuron.jax_op("mylib::rms_norm")
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * weight

defines `torch.ops.mylib.rms_norm` (and returns its `CustomOpDef`, as `torch.library.custom_op` does):
- on neuron, an entry of the lowering table whose function is the JAX function: the eager driver
  runs it (one plan and executable per call signature, non-tensor arguments static) and
  torch.compile lowers it into the graph's executable like any ATen op;
- its Meta/fake kernel from `jax.eval_shape` (torch.compile traces it as one node);
- its CPU kernel: the JAX function on JAX's CPU device (tests compare against it);
- its backward: `jax.vjp` of the function, as a second op `<name>_vjp` (so it too runs on neuron
  and in graphs), until `register_autograd` replaces it.
- its forward-mode AD: `jax.jvp` of the function, as a third op `<name>_jvp`, through an autograd
  kernel of ours (torch.library's has no forward-mode formula): dual tensors and torch.func.jvp.

JAX functions do not mutate their arguments: `mutates_args` must be empty (return the new value).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .eager import kernels
from .lowering import lowers
from .runtime.dtypes import to_jax, to_torch

__all__ = ["jax_op"]


def jax_op(name: str, fn: Callable | None = None, /, *, mutates_args: Iterable[str] = (),
           schema: str | None = None):
    """Define the PyTorch custom op `name` ("namespace::op") computed by the JAX function `fn`,
    typed like a `torch.library.custom_op` function (or described by `schema`). Returns the op's
    `CustomOpDef`: call it like the function, or `register_autograd(backward, setup_context=...)`
    to replace the default backward (jax.vjp). A Pallas kernel (`pl.pallas_call`) is a JAX function
    too: run it with `interpret=True` where the arrays live on the CPU.

        @torchneuron.jax_op("mylib::scale")
        def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
            return x * factor

        scale(torch.ones(3, device="neuron"), 2.0)  # neuron: a cached executable of `x * factor`
    """
    if isinstance(mutates_args, str) or list(mutates_args):
        raise ValueError(f"jax_op {name}: JAX functions cannot mutate their arguments "
                         f"(mutates_args={mutates_args!r}); return the new value and assign it instead")

    def define(fn: Callable):
        text = schema if schema is not None else torch.library.infer_schema(fn, mutates_args=())
        op_def = _define(name, fn, text)
        _register_default_backward(op_def, fn)
        return op_def

    return define if fn is None else define(fn)


def _define(name: str, fn: Callable, schema: str):
    """The custom op `name` with its CPU, fake and neuron kernels, all computed by `fn`."""
    returns = torch._C.parse_schema(name + schema).returns
    for ret in returns:
        if str(ret.type) != "Tensor":
            raise ValueError(f"jax_op {name}: returns must be Tensors, the schema declares {ret.type}")
    n_returns = len(returns)
    namespace, opname = name.split("::")
    cpu_kernel = _cpu_kernel(name, fn, n_returns)
    op_def = _JaxOpDef(namespace, opname, schema, cpu_kernel)
    op = op_def._opoverload
    written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if written:
        raise ValueError(f"jax_op {name}: the schema declares {written} mutated; JAX functions cannot mutate "
                         f"their arguments (return the new value and assign it instead)")
    op_def.register_kernel("cpu")(cpu_kernel)
    op_def.register_fake(_fake_kernel(name, fn, n_returns))
    lowers(op, user_code=True)(_checked(name, fn, n_returns))
    kernels.register_kernel(op)
    return op_def


class _JaxOpDef(torch._library.custom_ops.CustomOpDef):
    """A `CustomOpDef` whose autograd kernel also has a forward-mode formula (`jax.jvp` of the
    function, the op `<name>_jvp`): torch.library's own autograd kernel has backward only."""

    _jvp_op = None  # set by _register_default_backward

    def _register_autograd_dispatcher_impl(self) -> None:
        self._lib.impl(self._name, _autograd_kernel(self), "Autograd", with_keyset=True)


def _autograd_kernel(op_def: _JaxOpDef) -> Callable:
    """What torch.library's autograd kernel does (the op through an autograd.Function calling the
    registered setup_context and backward), with the Function's `jvp` added, so dual tensors
    (torch.autograd.forward_ad, torch.func.jvp) get tangents."""
    op = op_def._opoverload
    function = _autograd_function(op_def)

    def kernel(keyset, *args, **keywords):
        if _differentiable_call(args, forward_ad=op_def._jvp_op is not None):
            # Under torch.func the call arrives here already at its transform's level: apply the
            # Function as plain autograd there, not through functorch's custom_function_call again.
            return _plain_apply(function, keyset, keywords, *args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **keywords)

    return kernel


def _autograd_function(op_def: _JaxOpDef) -> type[torch.autograd.Function]:
    """The op as an autograd.Function: forward redispatches below autograd, setup_context and
    backward are the registered ones, jvp the op's forward-mode formula."""
    op = op_def._opoverload
    schema = op._schema
    keyword_only = torch._library.utils.has_kwarg_only_args(schema)
    tensor_positions = [i for i, a in enumerate(a for a in schema.arguments if not a.kwarg_only)
                        if str(a.type) == "Tensor"]

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(keyset, keywords, *args):
            with torch._C._AutoDispatchBelowAutograd():
                return op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **keywords)

        @staticmethod
        def setup_context(ctx, inputs, output):
            _, keywords, *args = inputs
            ctx.jvp_call = ([None if i in tensor_positions else x for i, x in enumerate(args)], keywords)
            ctx.save_for_forward(*(args[i] for i in tensor_positions))
            if op_def._setup_context_fn is not None:
                args, keywords = torch._library.utils.fill_defaults(schema, args, keywords)
                extra = {"keyword_only_inputs": keywords} if keyword_only else {}
                op_def._setup_context_fn(ctx=ctx, inputs=args, output=output, **extra)

        @staticmethod
        def backward(ctx, *grads):
            if op_def._backward_fn is None:
                raise RuntimeError(f"Trying to backward through {op} but no autograd formula was registered; "
                                   f"use register_autograd to add one")
            needs = ctx.needs_input_grad
            ctx.needs_input_grad = needs[2:]
            try:
                result = op_def._backward_fn(ctx, *grads)
            finally:
                ctx.needs_input_grad = needs
            return (None, None, *(result if isinstance(result, tuple) else (result,)))

        @staticmethod
        def jvp(ctx, _keyset, _keywords, *tangents):
            if op_def._jvp_op is None:
                raise RuntimeError(f"{op}: no forward-mode formula (jax_op gives one to ops with Tensor arguments)")
            args, keywords = ctx.jvp_call
            args = list(args)
            for i, t in zip(tensor_positions, ctx.saved_tensors):
                args[i] = t
            tangents = [tangents[i] if tangents[i] is not None else torch.zeros_like(args[i])
                        for i in tensor_positions]
            with torch.no_grad():  # tangents are not differentiated again
                return op_def._jvp_op(*tangents, *args, **keywords)

    return Function


def _plain_apply(function, *args):
    """`function.apply` as autograd.Function does it when no torch.func transform is active."""
    args = torch._functorch.utils.unwrap_dead_wrappers(args)
    with torch._functorch.autograd_function.enable_single_level_autograd_function():
        return super(torch.autograd.Function, function).apply(*args)


def _differentiable_call(args, forward_ad: bool) -> bool:
    """Whether the call records autograd: an argument requires grad, or (for an op with a
    forward-mode formula) carries a tangent. The generated _vjp and _jvp ops have none: their
    arguments' tangents (saved dual tensors reaching a backward) are not propagated."""
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
        return True
    if not forward_ad or torch.autograd.forward_ad._current_level < 0:
        return False
    unpack = torch.autograd.forward_ad.unpack_dual
    return any(isinstance(a, torch.Tensor) and unpack(a).tangent is not None for a in args)


def _bind(fn: Callable, args, kwargs, is_tensor: Callable) -> tuple[Callable, list]:
    """(`fn` as a function of the call's tensors alone, the tensors): everything else is static."""
    leaves, tree = jax.tree_util.tree_flatten((list(args), kwargs), is_leaf=is_tensor)
    where = [i for i, x in enumerate(leaves) if is_tensor(x)]

    def call(*tensors):
        full = list(leaves)
        for i, t in zip(where, tensors):
            full[i] = t
        a, k = jax.tree_util.tree_unflatten(tree, full)
        return fn(*a, **k)

    return call, [leaves[i] for i in where]


def _is_torch_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _results(name: str, out, n_returns: int) -> list:
    """`out` as a list of arrays, or the error of a result that is not the declared one."""
    many = isinstance(out, (tuple, list))
    got = list(out) if many else [out]
    if many != (n_returns > 1) or len(got) != n_returns:
        declared = "one Tensor" if n_returns == 1 else f"a tuple of {n_returns} Tensors"
        found = f"a {type(out).__name__} of {len(got)}" if many else f"one {type(out).__name__}"
        raise RuntimeError(f"{name}: the schema declares {declared}, the JAX function returned {found}; "
                           f"make the function's return match its annotation (or schema=)")
    for i, r in enumerate(got):
        if not (hasattr(r, "shape") and hasattr(r, "dtype")):
            raise RuntimeError(f"{name}: result {i} is a {type(r).__name__}, not an array")
        try:
            to_torch(r.dtype)
        except KeyError:
            raise RuntimeError(f"{name}: result {i} has dtype {r.dtype}, which PyTorch has no dtype for") from None
    return got


def _checked(name: str, fn: Callable, n_returns: int) -> Callable:
    """The lowering: `fn` on the call's arrays, its result checked against the schema."""
    @functools.wraps(fn)
    def lowering(*args, **kwargs):
        got = _results(name, fn(*args, **kwargs), n_returns)
        return tuple(got) if n_returns > 1 else got[0]
    return lowering


def _fake_kernel(name: str, fn: Callable, n_returns: int) -> Callable:
    def fake(*args, **kwargs):
        call, tensors = _bind(fn, args, kwargs, _is_torch_tensor)
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise RuntimeError(f"{name}: expected all tensors on one device, found {sorted(map(str, devices))}; "
                               f"move them with .to(device) first")
        structs = [jax.ShapeDtypeStruct(tuple(t.shape), to_jax(t.dtype)) for t in tensors]
        got = _results(name, jax.eval_shape(call, *structs), n_returns)
        like = tensors[0] if tensors else torch.empty(0)
        made = [like.new_empty(tuple(r.shape), dtype=to_torch(r.dtype)) for r in got]
        return tuple(made) if n_returns > 1 else made[0]
    return fake


def _to_host_array(t: torch.Tensor):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: through its bits
        return t.view(torch.int16).numpy().view(jnp.bfloat16)
    return t.numpy()


def _from_host_array(a) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype == jnp.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _cpu_kernel(name: str, fn: Callable, n_returns: int) -> Callable:
    def cpu(*args, **kwargs):
        call, tensors = _bind(fn, args, kwargs, _is_torch_tensor)
        host = jax.local_devices(backend="cpu")[0]
        with jax.default_device(host):
            out = call(*[jax.device_put(_to_host_array(t), host) for t in tensors])
        made = [_from_host_array(r) for r in _results(name, out, n_returns)]
        return tuple(made) if n_returns > 1 else made[0]
    return cpu


def _register_default_backward(op_def, fn: Callable) -> None:
    """Autograd through `jax.vjp` of `fn`, computed by a second op `<name>_vjp` taking the output
    gradients, then the forward's arguments, and returning a gradient per plain Tensor argument."""
    op = op_def._opoverload
    name = op._schema.name
    arguments = op._schema.arguments
    n_out = len(op._schema.returns)
    positional = [a for a in arguments if not a.kwarg_only]
    diff = [i for i, a in enumerate(positional) if str(a.type) == "Tensor"]
    if not diff:
        return
    taken = {a.name for a in arguments}
    grad_names = [next(f"{prefix}{k}" for prefix in ("grad_", "grad_out_", "_grad_")
                       if f"{prefix}{k}" not in taken) for k in range(n_out)]
    declared = [f"Tensor {g}" for g in grad_names] + _argument_texts(op._schema)
    returns = "Tensor" if len(diff) == 1 else f"({', '.join(['Tensor'] * len(diff))})"
    vjp_op = _define(f"{name}_vjp", _vjp_of(fn, n_out, diff), f"({', '.join(declared)}) -> {returns}")
    tangent_names = [next(f"{prefix}{positional[i].name}" for prefix in ("tangent_", "_tangent_", "__tangent_")
                          if f"{prefix}{positional[i].name}" not in taken) for i in diff]
    declared = [f"Tensor {t}" for t in tangent_names] + _argument_texts(op._schema)
    op_returns = "Tensor" if n_out == 1 else f"({', '.join(['Tensor'] * n_out)})"
    op_def._jvp_op = _define(f"{name}_jvp", _jvp_of(fn, n_out, diff), f"({', '.join(declared)}) -> {op_returns}")

    def setup_context(ctx, inputs, output, keyword_only_inputs=None):
        ctx.save_for_backward(*(inputs[i] for i in diff))
        ctx.rest = ([None if i in diff else x for i, x in enumerate(inputs)], keyword_only_inputs or {})

    def backward(ctx, *grads):
        inputs, keywords = ctx.rest
        inputs = list(inputs)
        for i, t in zip(diff, ctx.saved_tensors):
            inputs[i] = t
        needs = ctx.needs_input_grad
        undifferentiated = [positional[i].name for i, need in enumerate(needs) if need and i not in diff]
        if undifferentiated:
            raise NotImplementedError(f"{name}: the default backward (jax.vjp) differentiates plain Tensor "
                                      f"arguments, not {undifferentiated}; register_autograd your own")
        got = vjp_op(*grads, *inputs, **keywords)
        got = got if isinstance(got, tuple) else (got,)
        result = [None] * len(inputs)
        for i, g in zip(diff, got):
            result[i] = g if needs[i] else None
        return tuple(result)

    op_def.register_autograd(backward, setup_context=setup_context)


def _argument_texts(schema) -> list[str]:
    """The schema's arguments as schema text ("Tensor x", "float eps=1e-06", "*"), split at the
    top-level commas of its parameter list."""
    text = str(schema)
    inner = text[text.index("(") + 1:text.rindex(") ->")]
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    return [*parts, inner[start:].strip()] if inner.strip() else parts


def _of_floats(fn: Callable, primals: list, diff: list[int], kwargs: dict) -> tuple[Callable, list, list]:
    """`fn` as a function of its floating `diff` arguments alone (integer ones held constant): the
    function, those arguments, and per `diff` argument whether it is one of them."""
    xs = [primals[i] for i in diff]
    inexact = [jnp.issubdtype(x.dtype, jnp.inexact) for x in xs]

    def forward(*floats):
        it = iter(floats)
        full = list(primals)
        for i, x, ok in zip(diff, xs, inexact):
            full[i] = next(it) if ok else x
        return fn(*full, **kwargs)

    return forward, [x for x, ok in zip(xs, inexact) if ok], inexact


def _jvp_of(fn: Callable, n_out: int, diff: list[int]) -> Callable:
    """The JAX function (tangents of the `diff` arguments, forward arguments) -> the tangents of the
    results (jax.jvp); integer arguments are held constant, integer results get zero tangents."""
    def jvp(*args, **kwargs):
        tangents, primals = args[:len(diff)], list(args[len(diff):])
        forward, floats, inexact = _of_floats(fn, primals, diff, kwargs)
        float_tangents = [t.astype(x.dtype) for t, x in
                          zip((t for t, ok in zip(tangents, inexact) if ok), floats)]
        out, out_tangents = jax.jvp(forward, tuple(floats), tuple(float_tangents))
        result = [t if t.dtype != jax.dtypes.float0 else jnp.zeros(o.shape, o.dtype)
                  for o, t in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(out_tangents))]
        return tuple(result) if n_out > 1 else result[0]
    return jvp


def _vjp_of(fn: Callable, n_out: int, diff: list[int]) -> Callable:
    """The JAX function (output gradients, forward arguments) -> gradients of the `diff` arguments;
    integer arrays among them are held constant and get zeros."""
    def vjp(*args, **kwargs):
        grads, primals = args[:n_out], list(args[n_out:])
        xs = [primals[i] for i in diff]
        forward, floats, inexact = _of_floats(fn, primals, diff, kwargs)
        out, pullback = jax.vjp(forward, *floats)
        leaves, tree = jax.tree_util.tree_flatten(out)
        cotangents = jax.tree_util.tree_unflatten(tree, [g.astype(o.dtype) for g, o in zip(grads, leaves)])
        got = iter(pullback(cotangents))
        result = [next(got) if ok else jnp.zeros_like(x) for x, ok in zip(xs, inexact)]
        return tuple(result) if len(result) > 1 else result[0]
    return vjp
