"""F.scaled_dot_product_attention on neuron: the fused (overrideable) backend, lowered in
lowering/attention.py, against CPU's math path, forward and backward."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
FUSED = aten._scaled_dot_product_fused_attention_overrideable.default
FUSED_BACKWARD = aten._scaled_dot_product_fused_attention_overrideable_backward.default


class OpsSeen(TorchDispatchMode):
    """Records the ATen ops that reach the backends (below autograd and the composites)."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def _inputs(q_heads=4, kv_heads=4, q_len=5, kv_len=7, dim=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    shapes = ((2, q_heads, q_len, dim), (2, kv_heads, kv_len, dim), (2, kv_heads, kv_len, dim))
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


def _run(device, tensors, mask=None, **kwargs):
    """Output and the gradients of q, k, v for a non-uniform upstream gradient."""
    q, k, v = (t.detach().to(device).requires_grad_() for t in tensors)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(device), **kwargs)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape).to(device)
    (out * weights).sum().backward()
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]


def _bool_mask(q_len=5, kv_len=7):
    mask = torch.rand(q_len, kv_len, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[2] = False  # a row with every key masked: CPU's math path gives zeros
    return mask


CASES = {
    "plain": ({}, {}),
    "causal": ({}, {"is_causal": True}),
    "bool_mask": ({}, {"mask": _bool_mask()}),
    "float_mask": ({}, {"mask": torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(2))}),
    "gqa": ({"kv_heads": 2}, {"enable_gqa": True}),
    "one_kv_head": ({"kv_heads": 1}, {}),
    "scale": ({}, {"scale": 0.3}),
    "same_len_causal": ({"q_len": 6, "kv_len": 6}, {"is_causal": True}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_fused_matches_cpu_math(case, dtype, no_fallback):
    shape, kwargs = CASES[case]
    tensors = _inputs(dtype=dtype, **shape)
    kwargs = dict(kwargs)
    mask = kwargs.pop("mask", None)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    with sdpa_kernel(SDPBackend.MATH):
        expected = _run("cpu", tensors, mask, **kwargs)
    with OpsSeen() as seen:
        got = _run("neuron", tensors, mask, **kwargs)
    assert FUSED in seen.ops and FUSED_BACKWARD in seen.ops
    assert aten.bmm.default not in seen.ops
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, **tol)


def test_choice():
    q, k, v = (t.to("neuron") for t in _inputs())
    assert torch._fused_sdp_choice(q, k, v) == int(SDPBackend.OVERRIDEABLE)
    # not covered: dropout (the backward needs the forward's mask), integer inputs, 3-D inputs
    assert torch._fused_sdp_choice(q, k, v, dropout_p=0.1) == int(SDPBackend.MATH)
    assert torch._fused_sdp_choice(q[0], k[0], v[0]) == int(SDPBackend.MATH)
    with sdpa_kernel(SDPBackend.MATH):
        assert torch._fused_sdp_choice(q, k, v) == int(SDPBackend.MATH)


def test_math_path_stays_available():
    tensors = _inputs()
    with sdpa_kernel(SDPBackend.MATH), OpsSeen() as seen:
        got = _run("neuron", tensors, is_causal=True)
    assert FUSED not in seen.ops
    torch.testing.assert_close(got[0], _run("cpu", tensors, is_causal=True)[0])


def test_dropout_runs_the_math_path():
    q, k, v = (t.to("neuron") for t in _inputs())
    with OpsSeen() as seen:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert FUSED not in seen.ops and out.shape == q.shape


def test_autocast_runs_fused_in_bfloat16():
    q, k, v = (t.to("neuron") for t in _inputs())
    with torch.autocast("neuron", dtype=torch.bfloat16), OpsSeen() as seen:
        out = F.scaled_dot_product_attention(q, k, v)
    assert FUSED in seen.ops and out.dtype == torch.bfloat16


def _llama(transformers):
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      loss_type="ForCausalLM", attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def test_hf_llama_sdpa_matches_cpu():
    transformers = pytest.importorskip("transformers")
    cpu_model = _llama(transformers)
    model = _llama(transformers).to("neuron")
    model.load_state_dict(cpu_model.state_dict())
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    # left padding: the padded query rows see no keys at all
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :3] = 0
    cpu_loss = cpu_model(input_ids=ids, attention_mask=attention_mask, labels=ids).loss
    cpu_loss.backward()
    with OpsSeen() as seen:
        loss = model(input_ids=ids.to("neuron"), attention_mask=attention_mask.to("neuron"),
                     labels=ids.to("neuron")).loss
        loss.backward()
    assert FUSED in seen.ops and FUSED_BACKWARD in seen.ops
    torch.testing.assert_close(loss.item(), cpu_loss.item(), rtol=1e-5, atol=1e-5)
    for (name, p_cpu), p in zip(cpu_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_graph_uses_the_lowering(monkeypatch):
    from torchneuron.compile import backend, compile_stats
    seen = []
    compile_graph = backend.compile_graph

    def recording(gm, example_inputs, name="graph"):
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return compile_graph(gm, example_inputs, name)

    monkeypatch.setattr(backend, "compile_graph", recording)
    torch._dynamo.reset()
    tensors = _inputs()
    expected = _run("cpu", tensors, is_causal=True)
    q, k, v = (t.to("neuron").requires_grad_() for t in tensors)
    before = compile_stats().get("eager_graphs", 0)
    out = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                        backend="neuron")(q, k, v)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to("neuron")
    (out * weights).sum().backward()
    # PyTorch keeps the fused op whole in the graph: the forward and backward are the lowerings
    assert FUSED in seen and FUSED_BACKWARD in seen and aten.bmm.default not in seen
    assert compile_stats().get("eager_graphs", 0) == before
    for e, g in zip(expected, (out, q.grad, k.grad, v.grad)):
        torch.testing.assert_close(g.detach().cpu(), e)


def test_forward_mode_ad_through_attention_takes_the_math_path():
    # PyTorch has no forward derivative for the fused op (nor on CPU or CUDA): dual inputs go to math
    import torch.autograd.forward_ad as fwAD

    def run(device):
        g = torch.Generator().manual_seed(3)
        q, k, v, t = (torch.randn(1, 2, 5, 4, generator=g).to(device) for _ in range(4))
        with fwAD.dual_level():
            out = F.scaled_dot_product_attention(fwAD.make_dual(q, t), k, v, is_causal=True)
            primal, tangent = fwAD.unpack_dual(out)
            return primal.cpu(), tangent.cpu()

    with sdpa_kernel(SDPBackend.MATH):
        expected = run("cpu")
    for got, want in zip(run("neuron"), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
