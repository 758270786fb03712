"""Hugging Face generate on neuron with the default (dynamic) KV cache: every step meets a new
sequence length. 64 greedy tokens equal to CPU's, and memory bounded by the executable cache
(issue 14). Eager bucketing keeps the compiles per op to one per bucket of the growing length."""
from __future__ import annotations

import pytest
import torch

import torchneuron
from torchneuron.eager import buckets

transformers = pytest.importorskip("transformers")


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        return transformers.LlamaForCausalLM(config).eval()
    config = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_generate_64_tokens_with_the_default_cache_equals_cpu(kind, monkeypatch):
    monkeypatch.setattr(buckets, "ENABLED", True)  # (whatever TORCHNEURON_EAGER_BUCKETS says)
    model = _model(kind)
    compiles = torchneuron.cache_stats()["misses"]
    prompt = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompt)
    with torch.no_grad():
        expected = model.generate(prompt, attention_mask=mask, max_new_tokens=64, min_new_tokens=64,
                                  do_sample=False, pad_token_id=0)
        model = model.to("neuron")
        got = model.generate(prompt.to("neuron"), attention_mask=mask.to("neuron"), max_new_tokens=64,
                             min_new_tokens=64, do_sample=False, pad_token_id=0)
    assert got.shape == (2, 70)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    stats = torchneuron.cache_stats()
    assert stats["bytes"] <= stats["limit"]
    # eager bucketing: the growing cache's ops compile once per bucket (at exact sizes, GPT-2 took
    # 448 executables; the ops on `ids[:, -1:]` of the batch of 2 still compile per length)
    assert stats["misses"] - compiles <= 400
