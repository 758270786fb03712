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
    # 2 * 4 * 64 * 128 scores: XLA:CPU runs this one (batch, head) pair at a time (attention._per_head)
    "large_gqa_causal": ({"kv_heads": 2, "q_len": 64, "kv_len": 128}, {"is_causal": True, "enable_gqa": True}),
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
    assert torch._fused_sdp_choice(q, k, v, dropout_p=0.1) == int(SDPBackend.OVERRIDEABLE)
    # not covered: integer inputs, 3-D inputs
    assert torch._fused_sdp_choice(q[0], k[0], v[0]) == int(SDPBackend.MATH)
    with sdpa_kernel(SDPBackend.MATH):
        assert torch._fused_sdp_choice(q, k, v) == int(SDPBackend.MATH)


def test_math_path_stays_available():
    tensors = _inputs()
    with sdpa_kernel(SDPBackend.MATH), OpsSeen() as seen:
        got = _run("neuron", tensors, is_causal=True)
    assert FUSED not in seen.ops
    torch.testing.assert_close(got[0], _run("cpu", tensors, is_causal=True)[0])


def _dropout_case():
    """q, k and an identity v (head dim = key count): the output is the dropped-out weights themselves."""
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 3, 5, 7, generator=g), torch.randn(2, 3, 7, 7, generator=g)
    return q, k, torch.eye(7).expand(2, 3, 7, 7).contiguous()


def _check_dropout(attention, p=0.3):
    """`attention(q, k, v)` on neuron against CPU's attention with the keep mask the output shows:
    output and gradients equal, about 1 - p of the weights kept."""
    q, k, v = _dropout_case()
    qn, kn, vn = (t.to("neuron").requires_grad_() for t in (q, k, v))
    with OpsSeen() as seen:
        out = attention(qn, kn, vn)
        weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        (out * weights.to("neuron")).sum().backward()
    got = out.detach().cpu()
    keep = got != 0  # (softmax weights are positive: a zero is a dropped weight)
    assert 0.5 < keep.float().mean().item() < 0.9
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    expected = (torch.softmax(qc @ kc.transpose(-1, -2) / 7 ** 0.5, -1) * keep / (1 - p)) @ vc
    (expected * weights).sum().backward()
    torch.testing.assert_close(got, expected.detach())
    for mine, cpu in ((qn, qc), (kn, kc), (vn, vc)):
        torch.testing.assert_close(mine.grad.cpu(), cpu.grad, rtol=1e-4, atol=1e-5)
    return got, seen


def test_dropout_runs_fused_and_its_backward_drops_the_same_weights(no_fallback):
    _, seen = _check_dropout(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3))
    assert FUSED in seen.ops and FUSED_BACKWARD in seen.ops


def test_dropout_follows_the_generator():
    q, k, v = (t.to("neuron") for t in _dropout_case())

    def draw():
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu()

    torch.neuron.manual_seed(7)
    first, second = draw(), draw()
    torch.neuron.manual_seed(7)
    assert torch.equal(draw(), first) and not torch.equal(second, first)
    # without dropout the op draws nothing: the generator's stream is the math path's
    state = torch.neuron.get_rng_state()
    F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(torch.neuron.get_rng_state(), state)


def test_dropout_under_compile(no_fallback):
    torch._dynamo.reset()
    attention = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3),
                              backend="neuron")
    first, _ = _check_dropout(attention)
    second, _ = _check_dropout(attention)
    assert not torch.equal(first, second)  # a new mask every call


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


def test_hf_llama_sdpa_generate_matches_cpu():
    transformers = pytest.importorskip("transformers")
    cpu_model = _llama(transformers).eval()
    model = _llama(transformers).to("neuron").eval()
    model.load_state_dict(cpu_model.state_dict())
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(5))
    settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    expected = cpu_model.generate(ids, **settings)
    with OpsSeen() as seen:
        got = model.generate(ids.to("neuron"), **settings)
    assert FUSED in seen.ops
    assert torch.equal(got.cpu(), expected)


def test_hf_vit_sdpa_matches_cpu():
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, image_size=16, patch_size=4, num_labels=3,
                                    attn_implementation="sdpa")
    torch.manual_seed(0)
    cpu_model = transformers.ViTForImageClassification(config)
    model = transformers.ViTForImageClassification(config).to("neuron")
    model.load_state_dict(cpu_model.state_dict())
    g = torch.Generator().manual_seed(6)
    pixels, labels = torch.randn(2, 3, 16, 16, generator=g), torch.tensor([0, 2])
    cpu_loss = cpu_model(pixel_values=pixels, labels=labels).loss
    cpu_loss.backward()
    with OpsSeen() as seen:
        loss = model(pixel_values=pixels.to("neuron"), labels=labels.to("neuron")).loss
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


def test_an_additive_mask_gets_its_gradient(no_fallback):
    q, k, v = _inputs(kv_heads=2)
    mask = torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(8))

    def run(device):
        tensors = [t.detach().to(device).requires_grad_() for t in (q, k, v, mask)]
        out = F.scaled_dot_product_attention(*tensors[:3], attn_mask=tensors[3], enable_gqa=True)
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)).sum().backward()
        return [out.detach().cpu()] + [t.grad.cpu() for t in tensors]

    with sdpa_kernel(SDPBackend.MATH):
        expected = run("cpu")
    with OpsSeen() as seen:
        got = run("neuron")
    assert FUSED_BACKWARD in seen.ops
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)
