"""FlexAttention on neuron (torch.nn.attention.flex_attention): score_mod, mask_mod and BlockMask,
eager (PyTorch's dense implementation as neuron ops) and compiled (the higher-order op lowered,
lowering/flex_attention.py), forward and backward against CPU's flex_attention."""
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.attention.flex_attention as fa
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from torchneuron.compile.higher_order import UnsupportedHigherOrderOp

LENGTH, BLOCK, WINDOW = 64, 16, 20


def causal(b, h, q, kv):
    return q >= kv


def sliding_window(b, h, q, kv):
    return (q >= kv) & (q - kv <= WINDOW)


def relative_bias(bias):
    def score_mod(score, b, h, q, kv):
        return score + (q - kv) * bias[h]
    return score_mod


def alibi(slopes):
    def score_mod(score, b, h, q, kv):
        return score - slopes[h] * (q - kv).abs()
    return score_mod


# name -> (score_mod factory, mask_mod, query heads, kv heads, the score_mod's buffer requires grad)
CASES = {
    "relative_bias_causal": (relative_bias, causal, 2, 2, True),
    "alibi_sliding_window_gqa": (alibi, sliding_window, 4, 2, False),
}


def _inputs(q_heads, kv_heads):
    g = torch.Generator().manual_seed(0)
    shapes = ((2, q_heads, LENGTH, 8), (2, kv_heads, LENGTH, 8), (2, kv_heads, LENGTH, 8))
    tensors = [torch.randn(s, generator=g) for s in shapes]
    return tensors, torch.rand(q_heads, generator=g) * 0.5


def _run(device, case, compiled=False):
    """Output and the gradients of q, k, v (and of the score_mod's buffer, where it takes one) for a
    non-uniform upstream gradient."""
    make_score_mod, mask_mod, q_heads, kv_heads, buffer_grad = CASES[case]
    tensors, buffer = _inputs(q_heads, kv_heads)
    q, k, v = (t.to(device).requires_grad_() for t in tensors)
    buffer = buffer.to(device).requires_grad_(buffer_grad)
    block_mask = create_block_mask(mask_mod, 1, 1, LENGTH, LENGTH, device=device, BLOCK_SIZE=BLOCK)

    def attend(q, k, v):
        return flex_attention(q, k, v, score_mod=make_score_mod(buffer), block_mask=block_mask,
                              enable_gqa=q_heads != kv_heads)

    out = (torch.compile(attend, backend="neuron", fullgraph=True) if compiled else attend)(q, k, v)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)
    (out * weights).sum().backward()
    grads = [q.grad, k.grad, v.grad] + ([buffer.grad] if buffer_grad else [])
    return [t.detach().cpu() for t in [out, *grads]]


def _cpu(case):
    # CPU's flex_attention refuses backward in its public checks only: its dense kernel has one
    with mock.patch.object(fa, "_validate_device", lambda *args: None):
        return _run("cpu", case)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_flex_attention_matches_cpu(case, compiled, no_fallback, fresh_dynamo):
    expected = _cpu(case)
    got = _run("neuron", case, compiled)
    for name, a, b in zip(["out", "grad_q", "grad_k", "grad_v", "grad_buffer"], got, expected):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{case} {name}: {m}")


def test_compiled_flex_attention_without_mods_matches_sdpa(fresh_dynamo):
    """No score_mod, no block mask: PyTorch's defaults (identity, every block) as subgraphs."""
    tensors, _ = _inputs(2, 2)
    q, k, v = (t.to("neuron") for t in tensors)
    got = torch.compile(flex_attention, backend="neuron")(q, k, v)
    torch.testing.assert_close(got.cpu(), torch.nn.functional.scaled_dot_product_attention(*tensors),
                               atol=1e-5, rtol=1e-5)


def test_compiled_flex_attention_is_one_executable(fresh_dynamo):
    from torchneuron.compile import compile_stats
    before = compile_stats().get("eager_graphs", 0)
    _run("neuron", "alibi_sliding_window_gqa", compiled=True)
    assert compile_stats().get("eager_graphs", 0) == before


def test_unsupported_higher_order_op_is_named(fresh_dynamo):
    x = torch.randn(4, device="neuron")
    branches = torch.compile(lambda x: torch.cond(x.sum() > 0, torch.sin, torch.cos, (x,)), backend="neuron")
    # (Dynamo wraps the backend's error, keeping its type's name and message)
    with pytest.raises(Exception, match=f"{UnsupportedHigherOrderOp.__name__}: torch.ops.higher_order.cond is not "
                                        "supported by torch.compile.backend='neuron'"):
        branches(x)


def test_varlen_flash_attention_names_neuron():
    q = torch.randn(8, 2, 16, device="neuron")
    offsets = torch.tensor([0, 3, 8], dtype=torch.int32, device="neuron")
    with pytest.raises(NotImplementedError, match="_flash_attention_forward is not supported on neuron"):
        torch.ops.aten._flash_attention_forward(q, q, q, offsets, offsets, 5, 5, 0.0, False, False)


@pytest.mark.parametrize("q_len, kv_len, per_batch", [(64, 64, False), (50, 70, True)])
def test_block_sparse_path_matches_dense(q_len, kv_len, per_batch):
    """The compiled forward's loop over listed blocks (lengths not a multiple of the block size, a
    mask per batch and head) against the dense computation of the same block mask."""
    import jax.numpy as jnp

    from torchneuron.lowering import flex_attention as lowering

    g = torch.Generator().manual_seed(1)
    q, k, v = (jnp.asarray(torch.randn(2, 4, n, 8, generator=g).numpy()) for n in (q_len, kv_len, kv_len))
    documents = torch.randint(0, 3, (2, max(q_len, kv_len)), generator=g).sort().values

    def same_document(b, h, i, j):
        return (documents[b, i] == documents[b, j]) & (i >= j - h)

    block_mask = create_block_mask(same_document, 2 if per_batch else 1, 4 if per_batch else 1, q_len, kv_len,
                                   device="cpu", BLOCK_SIZE=16)
    tensors = [None if t is None else jnp.asarray(t.numpy()) for t in block_mask.as_tuple()[2:10]]
    block, q_lists = (*tensors[:4], 16, 16), tensors[4:]
    jax_documents = jnp.asarray(documents.numpy())

    def mask_mod(b, h, i, j):
        return (jax_documents[b, i] == jax_documents[b, j]) & (i >= j - h)

    bias = jnp.asarray(torch.randn(4, generator=g).numpy())

    def score_mod(s, b, h, i, j, bias):
        return s + 0.1 * (i - j) * bias[h]

    assert lowering._block_sparse(q, k, block)
    dense = lowering._attend(q, k, v, score_mod, mask_mod, block, 0.3, (bias,), ())
    sparse = lowering._attend_blocks(q, k, v, score_mod, mask_mod, block, 0.3, (bias,), ())
    out, lse, _ = lowering.flex_attention(q, k, v, score_mod, mask_mod, block, 0.3, (bias,))
    grad_out = jnp.asarray(torch.randn(out.shape, generator=g).numpy())
    grad_lse = jnp.asarray(torch.randn(lse.shape, generator=g).numpy())
    backward = [lowering.flex_attention_backward(q, k, v, out, lse, grad_out, grad_lse, score_mod, mask_mod, block,
                                                 0.3, (bias,), (), lists) for lists in (None, q_lists)]
    for a, b in zip([*sparse, *backward[1][:3], *backward[1][3]], [*dense, *backward[0][:3], *backward[0][3]]):
        torch.testing.assert_close(torch.from_numpy(np.asarray(a)), torch.from_numpy(np.asarray(b)), atol=1e-5,
                                   rtol=1e-5)
