"""Higher-order ops in compiled graphs: FlexAttention lowered, every other one refused by name.

AOTAutograd hands FlexAttention over as `torch.ops.higher_order.flex_attention` (and
`flex_attention_backward` in the backward graph) whose score_mod and mask_mod are GraphModule
submodules (get_attr nodes): each becomes a JAX callable by running its nodes through the same
lowering table as the graph, and lowering/flex_attention.py computes the attention with them. A
higher-order op the backend does not know raises an error naming it, never a stray Python call.
"""
from __future__ import annotations

import operator

import jax.numpy as jnp
import torch
import torch.fx

from ..lowering import LOWERINGS, calling
from ..lowering import flex_attention as flex
from ..runtime import transfer
from ..runtime.dtypes import to_jax

higher_order = torch.ops.higher_order
FLEX_ATTENTION = higher_order.flex_attention
FLEX_ATTENTION_BACKWARD = higher_order.flex_attention_backward
# the ones the backend itself runs (activation checkpointing's RNG replay: backend.py)
_RUN_BY_BACKEND = (higher_order.run_and_save_rng_state, higher_order.run_with_rng_state)


class UnsupportedHigherOrderOp(NotImplementedError):
    """A higher-order op in a graph that torch.compile(backend="neuron") cannot run."""


def is_higher_order(target) -> bool:
    return isinstance(target, torch._ops.HigherOrderOperator)


def unsupported(gm: torch.fx.GraphModule) -> list[str]:
    """The ATen ops without lowerings inside the subgraphs of `gm`'s FlexAttention nodes (the graph
    then runs op by op on neuron); raises for a higher-order op the backend cannot run."""
    missing = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not is_higher_order(node.target) or node.target in _RUN_BY_BACKEND:
            continue
        if node.target not in (FLEX_ATTENTION, FLEX_ATTENTION_BACKWARD):
            raise UnsupportedHigherOrderOp(
                f"torch.ops.higher_order.{node.target.name()} is not supported by torch.compile(backend="
                f"'neuron'): neuron lowers flex_attention, flex_attention_backward, run_and_save_rng_state and "
                f"run_with_rng_state; run this code uncompiled, or compile it with backend='aot_eager'")
        # the score_mod and the mask_mod (the backward's joint graph is not used: jax.vjp differentiates)
        score_mod = node.args[3] if node.target is FLEX_ATTENTION else node.args[7]
        block = node.args[4] if node.target is FLEX_ATTENTION else node.args[9]
        for module in (score_mod, block[-1]):
            if isinstance(module, torch.fx.Node) and module.op == "get_attr":
                missing.update(_missing(getattr(gm, module.target)))
    return sorted(missing)


def _missing(sub) -> set[str]:
    if not isinstance(sub, torch.fx.GraphModule):
        return set()
    return {str(n.target) for n in sub.graph.nodes if n.op == "call_function"
            and isinstance(n.target, torch._ops.OpOverload) and n.target not in LOWERINGS}


def as_jax(sub: torch.fx.GraphModule):
    """A score_mod, mask_mod or other subgraph as a function of JAX values, each node through its
    lowering: what the graph returns (one value, or a list)."""

    def run(*inputs):
        env = {}
        placeholders = iter(inputs)
        for node in sub.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "get_attr":
                value = getattr(sub, node.target)
                env[node] = (jnp.asarray(transfer.cpu_numpy(value.cpu()))
                             if isinstance(value, torch.Tensor) else value)
            elif node.op == "call_function":
                env[node] = _call(node, env)
            elif node.op == "output":
                result = _values(node.args[0], env)
                return result[0] if isinstance(result, (list, tuple)) and len(result) == 1 else result
        raise ValueError(f"neuron: subgraph {sub} has no output")

    return run


def _values(a, env):
    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_values(x, env) for x in a)
    return a


def _call(node, env):
    args, kwargs, target = _values(node.args, env), _values(node.kwargs, env), node.target
    if target is operator.getitem:
        return args[0][args[1]]
    if not isinstance(target, torch._ops.OpOverload):
        return target(*args, **kwargs)
    lowering = LOWERINGS[target]
    meta_args, meta_kwargs = _metas(node.args), _metas(node.kwargs)
    meta = node.meta.get("val")
    compute = calling.compute_dtype(lowering, [a.name for a in target._schema.arguments], meta_args, meta_kwargs)
    flags = calling.static_flags(target, lowering, meta_args, meta_kwargs, meta)
    results = calling.invoke(target, lowering, list(args), dict(kwargs), compute, None, flags)
    metas = meta if len(target._schema.returns) > 1 else (meta,)
    cast = tuple(r.astype(to_jax(m.dtype)) if isinstance(m, torch.Tensor) and hasattr(r, "astype") else r
                 for r, m in zip(results, metas))
    return cast if len(target._schema.returns) > 1 else cast[0]


def _metas(a):
    if isinstance(a, torch.fx.Node):
        return a.meta.get("val")
    if isinstance(a, (list, tuple)):
        return type(a)(_metas(x) for x in a)
    if isinstance(a, dict):
        return {k: _metas(v) for k, v in a.items()}
    return a


def _block(block: tuple) -> tuple:
    """(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, Q_BLOCK_SIZE, KV_BLOCK_SIZE)
    and the mask_mod, from the op's flattened BlockMask (BlockMask.as_tuple())."""
    return (block[2], block[3], block[4], block[5], block[-3], block[-2]), as_jax(block[-1])


def run(node: torch.fx.Node, args: tuple, kwargs: dict):
    """The value of higher-order-op `node` (FlexAttention forward or backward) on JAX values `args`."""
    if node.target is FLEX_ATTENTION:
        query, key, value, score_mod, block, scale, _, score_buffers, mask_buffers = _with_defaults(args, kwargs, 9)
        block, mask_mod = _block(block)
        return flex.flex_attention(query, key, value, as_jax(score_mod), mask_mod, block, scale,
                                   tuple(score_buffers), tuple(mask_buffers))
    if node.target is FLEX_ATTENTION_BACKWARD:
        (query, key, value, out, lse, grad_out, grad_lse, score_mod, _, block, scale, _, score_buffers,
         mask_buffers) = _with_defaults(args, kwargs, 14)
        q_lists = tuple(block[6:10])  # the BlockMask's q_num_blocks, q_indices, full_q_num_blocks, full_q_indices
        block, mask_mod = _block(block)
        grad_q, grad_k, grad_v, grads = flex.flex_attention_backward(
            query, key, value, out, lse, grad_out, grad_lse, as_jax(score_mod), mask_mod, block, scale,
            tuple(score_buffers), tuple(mask_buffers), q_lists)
        meta = node.meta.get("val")
        wanted = meta[3] if meta is not None else grads
        grads = tuple(g if w is not None else None for g, w in zip(grads, wanted))
        return grad_q, grad_k, grad_v, grads
    raise UnsupportedHigherOrderOp(f"torch.ops.higher_order.{node.target.name()} has no lowering on neuron")


def _with_defaults(args: tuple, kwargs: dict, count: int) -> list:
    """The op's arguments by position: the trailing buffer tuples default to empty."""
    values = list(args) + [kwargs.get(n) for n in ("score_mod_other_buffers", "mask_mod_other_buffers")
                           if n in kwargs]
    return values + [()] * (count - len(values))
