"""A JAX attention kernel in a Hugging Face model through transformers' attention-function registry
(docs/KERNELS.md), against the same model with PyTorch's SDPA on CPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

import torchneuron

transformers = pytest.importorskip("transformers")


@torchneuron.jax_op("test_jax_op_hf::causal_attention")
def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    scores = jnp.einsum("bhld,bhsd->bhls", query, key) * scale
    q_len, kv_len = scores.shape[-2:]
    # bottom-right aligned: with a KV cache the new queries are the last rows
    scores = jnp.where(jnp.tril(jnp.ones((q_len, kv_len), bool), kv_len - q_len), scores, -jnp.inf)
    return jnp.einsum("bhls,bhsd->bhld", jax.nn.softmax(scores, axis=-1), value)


def jax_causal_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function interface around the op: (B, H, L, D) in, (B, L, H, D) out."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return causal_attention(query, key, value, scale).transpose(1, 2).contiguous(), None


transformers.AttentionInterface.register("jax_causal", jax_causal_attention)


def _llama(attn_implementation):
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      loss_type="ForCausalLM")
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


def test_a_jax_attention_kernel_runs_a_llama_as_sdpa_does_on_cpu(no_fallback):
    cpu_model = _llama("sdpa")
    model = _llama("jax_causal").to("neuron")
    model.load_state_dict(cpu_model.state_dict())
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    cpu_loss = cpu_model(input_ids=ids, labels=ids).loss
    cpu_loss.backward()
    with torch.profiler.profile() as prof:
        loss = model(input_ids=ids.to("neuron"), labels=ids.to("neuron")).loss
        loss.backward()
    names = {e.name for e in prof.events()}
    assert "test_jax_op_hf::causal_attention" in names
    torch.testing.assert_close(loss.item(), cpu_loss.item(), rtol=1e-5, atol=1e-5)
    for (name, p_cpu), p in zip(cpu_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=name)

    settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    cpu_model.eval()
    model.eval()
    expected = cpu_model.generate(ids[:, :5], **settings)
    assert torch.equal(model.generate(ids[:, :5].to("neuron"), **settings).cpu(), expected)
