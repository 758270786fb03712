"""Hugging Face causal LMs (tiny configs) trained under torch.compile(backend="neuron", dynamic=True)
over six lengths: the loss and every gradient match CPU at each length, and where the graphs bucket
(compile/buckets.py), each runs at most one executable per bucket."""
import copy

import pytest
import torch

from torchneuron.compile import compile_stats

transformers = pytest.importorskip("transformers")

from tests.compile.test_compile_hf import VOCAB, _config

pytestmark = pytest.mark.usefixtures("fresh_dynamo", "no_fallback")

LENGTHS = (5, 9, 12, 17, 24, 33)  # buckets 8, 16, 32 and 64 (MIN_BUCKET 8)


def _train_over_lengths(kind):
    torch.manual_seed(0)
    cpu_model = transformers.AutoModelForCausalLM.from_config(_config(kind))
    # GPT2Config drops loss_type, and the warning HF logs then breaks the graph before the loss
    cpu_model.loss_type = "ForCausalLM"
    model = copy.deepcopy(cpu_model).to("neuron")
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    g = torch.Generator().manual_seed(0)
    for t in LENGTHS:
        ids = torch.randint(0, VOCAB, (2, t), generator=g)
        cpu_model.zero_grad()
        model.zero_grad()
        expected = cpu_model(input_ids=ids, labels=ids).loss
        expected.backward()
        loss = compiled(input_ids=ids.to("neuron"), labels=ids.to("neuron")).loss
        loss.backward()
        torch.testing.assert_close(loss.cpu(), expected, rtol=1e-4, atol=1e-5, msg=f"length {t}")
        for (name, p_cpu), p in zip(cpu_model.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=f"{name}, length {t}")


# gpt2 in the default tier; llama (65 s here) with TORCHNEURON_SLOW_TESTS=1
@pytest.mark.parametrize("kind", [pytest.param("llama", marks=pytest.mark.slow), "gpt2"])
def test_training_over_six_lengths_matches_cpu_with_one_executable_per_bucket(kind):
    before = compile_stats()
    _train_over_lengths(kind)
    after = compile_stats()
    graphs = after["graphs"] - before.get("graphs", 0)
    assert after.get("eager_graphs", 0) == before.get("eager_graphs", 0)
    assert graphs == 2  # the forward and the backward, each bucketed
    assert after["compiles"] - before.get("compiles", 0) <= 4 * graphs  # buckets 8, 16, 32, 64
