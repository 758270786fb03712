"""transformers' MoE experts on neuron: `transformers::grouped_mm_fallback` and its backward op are
lowered (integrations/huggingface.py registers them when transformers defines them), so a compiled
MoE model is whole XLA programs and eager runs them as one executable each (issue 17)."""
from __future__ import annotations

import pytest
import torch

import torchneuron
from torchneuron.compile import compile_stats

transformers = pytest.importorskip("transformers")
moe = pytest.importorskip("transformers.integrations.moe")

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_grouped_mm_fallback_and_its_backward_equal_cpu(no_fallback):
    op = torch.ops.transformers.grouped_mm_fallback
    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    w = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(1), requires_grad=True)
    offs = torch.tensor([2, 2, 6])  # an expert with no rows, and a row past the last offset
    grad = torch.randn(7, 5, generator=torch.Generator().manual_seed(2))
    y = op(x, w, offs)
    y.backward(grad)
    xn, wn = (t.detach().to("neuron").requires_grad_() for t in (x, w))
    yn = op(xn, wn, offs.to("neuron"))
    yn.backward(grad.to("neuron"))
    torch.testing.assert_close(yn.cpu(), y)
    torch.testing.assert_close(xn.grad.cpu(), x.grad)
    torch.testing.assert_close(wn.grad.cpu(), w.grad)


def test_a_compiled_moe_model_is_whole_programs_equal_to_cpu():
    config = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(3))
    loss = model(ids, labels=ids).loss
    loss.backward()
    on_neuron = transformers.Qwen3MoeForCausalLM(config)
    on_neuron.load_state_dict(model.state_dict())
    on_neuron = on_neuron.to("neuron")
    before = compile_stats().get("eager_graphs", 0)
    compiled = torch.compile(on_neuron, backend="neuron")
    got = compiled(ids.to("neuron"), labels=ids.to("neuron")).loss
    got.backward()
    assert compile_stats().get("eager_graphs", 0) == before  # no graph ran op by op
    torch.testing.assert_close(got.cpu(), loss, rtol=1e-5, atol=1e-5)
    expected = dict(model.named_parameters())
    experts = [name for name in expected if "experts" in name]
    assert experts
    for name, param in on_neuron.named_parameters():
        if expected[name].grad is not None:
            torch.testing.assert_close(param.grad.cpu(), expected[name].grad, rtol=1e-4, atol=1e-5, msg=name)
    assert torchneuron.fallback_stats() == {} or all("grouped_mm" not in op for op in torchneuron.fallback_stats())
