"""Hugging Face causal LMs (tiny configs, no downloads) under torch.compile(backend="neuron"):
the loss and every gradient match eager neuron and CPU."""
import pytest
import torch
import torch._dynamo

from torchneuron.compile import compile_stats

transformers = pytest.importorskip("transformers")

VOCAB = 128


def _config(kind):
    common = {"vocab_size": VOCAB, "num_hidden_layers": 2, "num_attention_heads": 4,
              "max_position_embeddings": 64, "loss_type": "ForCausalLM"}
    if kind == "llama":
        return transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **common)
    if kind == "gpt2":
        # dropout off: the three devices draw different random masks
        return transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=VOCAB,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, loss_type="ForCausalLM")
    config = transformers.MixtralConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2,
                                        num_local_experts=4, num_experts_per_tok=2, **common)
    # "grouped_mm" is what transformers picks on an unknown device: aten._grouped_mm, bfloat16 only
    config._experts_implementation = kind.split("-")[1]
    return config


pytestmark = pytest.mark.usefixtures("fresh_dynamo", "no_fallback")



@pytest.mark.parametrize("kind,dtype,tol", [
    ("llama", torch.float32, 1e-4),
    ("gpt2", torch.float32, 1e-4),
    ("mixtral-batched_mm", torch.float32, 1e-4),
    ("mixtral-grouped_mm", torch.bfloat16, 3e-2),
])
def test_hf_causal_lm_loss_and_gradients(kind, dtype, tol):
    config = _config(kind)
    torch.manual_seed(0)
    cpu_model = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
    models = [cpu_model]
    for _ in range(2):
        model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).to("neuron")
        model.load_state_dict(cpu_model.state_dict())
        models.append(model)
    ids = torch.randint(0, VOCAB, (2, 8))
    runs = ((models[0], "cpu"), (models[1], "neuron"), (torch.compile(models[2], backend="neuron"), "neuron"))
    losses = []
    for model, device in runs:
        loss = model(input_ids=ids.to(device), labels=ids.to(device)).loss
        loss.backward()
        losses.append(loss.float().item())
    assert compile_stats().get("eager_graphs", 0) == 0  # every graph became one executable
    torch.testing.assert_close(losses[2], losses[0], rtol=tol, atol=tol / 10)
    torch.testing.assert_close(losses[2], losses[1], rtol=tol, atol=tol / 10)
    for (name, p_cpu), p_eager, p_compiled in zip(*(m.named_parameters() if i == 0 else m.parameters()
                                                     for i, m in enumerate(models))):
        if p_cpu.grad is None:  # an expert no token chose
            assert p_compiled.grad is None or not p_compiled.grad.any()
            continue
        grad = p_compiled.grad.float().cpu()
        torch.testing.assert_close(grad, p_cpu.grad.float(), rtol=tol, atol=tol / 10, msg=name)
        torch.testing.assert_close(grad, p_eager.grad.float().cpu(), rtol=tol, atol=tol / 10, msg=name)
