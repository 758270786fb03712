"""Hugging Face image classifiers (tiny configs, no downloads) on neuron, eager and under
torch.compile(backend="neuron"): logits and every gradient match CPU. Their convolutions use
string padding (SigLIP's and Gemma 3's patch embeddings `padding="valid"`, EfficientNet's 1x1
convolutions `"same"` and its stem `"valid"`)."""
import pytest
import torch

from torchneuron.compile import compile_stats

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("fresh_dynamo", "no_fallback")

IMAGE = 32
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "image_size": IMAGE, "patch_size": 8}
# ShieldGemma 2's prompt: <bos> <boi> four image tokens <eoi> text; its classifier reads the
# logits of the "Yes" and "No" tokens at the last position
_BOI, _EOI, _IMAGE_TOKEN, _YES, _NO = 120, 121, 122, 5, 6
_SHIELD_IDS = [[2, _BOI] + [_IMAGE_TOKEN] * 4 + [_EOI, 7, 8, 9]]


def _siglip():
    config = transformers.SiglipConfig(
        vision_config=VISION, text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                           "num_attention_heads": 4, "vocab_size": 128,
                                           "max_position_embeddings": 16, "bos_token_id": 1, "eos_token_id": 2,
                                           "pad_token_id": 0})
    config.num_labels = 3
    return transformers.SiglipForImageClassification(config).eval()


def _efficientnet():
    # three stages (one block each at depth_coefficient 0.5), widths 8..48, a 4x4 map before the pooler
    config = transformers.EfficientNetConfig(
        image_size=IMAGE, width_coefficient=0.1, depth_coefficient=0.5, hidden_dim=128,
        in_channels=[32, 16, 24], out_channels=[16, 24, 40], kernel_sizes=[3, 3, 5], strides=[1, 2, 2],
        num_block_repeats=[1, 2, 1], expand_ratios=[1, 6, 6], dropout_rate=0.0, drop_connect_rate=0.0,
        num_labels=3)
    model = transformers.EfficientNetForImageClassification(config).train()  # BatchNorm on batch statistics
    # transformers draws BatchNorm scales from N(0, 0.02) too: eleven of them shrink the logits to ~1e-19
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_parameters()
    return model


def _shieldgemma2():
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 128, "max_position_embeddings": 64,
            "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}
    # four image tokens: the projector pools the 4x4 patch grid to 2x2
    config = transformers.ShieldGemma2Config(text_config=text, vision_config=VISION, mm_tokens_per_image=4,
                                             boi_token_index=_BOI, eoi_token_index=_EOI,
                                             image_token_index=_IMAGE_TOKEN)
    config.yes_token_index, config.no_token_index = _YES, _NO
    return transformers.ShieldGemma2ForImageClassification(config).eval()


BUILDERS = {"siglip": _siglip, "efficientnet": _efficientnet, "shieldgemma2": _shieldgemma2}


def _logits(kind, model, pixels):
    if kind == "shieldgemma2":
        ids = torch.tensor(_SHIELD_IDS * pixels.shape[0], device=pixels.device)
        return model(input_ids=ids, pixel_values=pixels).logits
    return model(pixel_values=pixels).logits


# shieldgemma2 compiled (91 s on a loaded 2-core machine) runs with TORCHNEURON_SLOW_TESTS=1: its eager run and the other
# models compiled stay in the default tier
@pytest.mark.parametrize("kind, compiled", [
    pytest.param(kind, compiled, id=f"{kind}-{'compiled' if compiled else 'eager'}",
                 marks=[pytest.mark.slow] if (kind, compiled) == ("shieldgemma2", True) else [])
    for compiled in (False, True) for kind in BUILDERS])
def test_image_classifier_logits_and_gradients(kind, compiled):
    torch.manual_seed(0)
    cpu_model = BUILDERS[kind]()
    model = BUILDERS[kind]().to("neuron")
    model.load_state_dict(cpu_model.state_dict())
    run = torch.compile(model, backend="neuron") if compiled else model
    eager_graphs = compile_stats().get("eager_graphs", 0)
    pixels = torch.randn(2, 3, IMAGE, IMAGE)
    seed = torch.randn(2, 2 if kind == "shieldgemma2" else 3)

    expected = _logits(kind, cpu_model, pixels)
    actual = _logits(kind, run, pixels.to("neuron"))
    (expected * seed).sum().backward()
    (actual * seed.to("neuron")).sum().backward()

    assert compile_stats().get("eager_graphs", 0) == eager_graphs  # compiled graphs became executables
    assert expected.abs().max() > 1e-3  # the comparison is not of vanishing values
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-5)
    for (name, p_cpu), p in zip(cpu_model.named_parameters(), model.parameters()):
        if p_cpu.grad is None:  # e.g. the text tower of SiglipForImageClassification's config
            assert p.grad is None, name
            continue
        # float32 sums over many terms: tolerance relative to the gradient's scale
        scale = p_cpu.grad.abs().max().item()
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-4 * scale + 1e-7, msg=name)
    for (name, b_cpu), b in zip(cpu_model.named_buffers(), model.buffers()):  # BatchNorm statistics
        torch.testing.assert_close(b.cpu(), b_cpu, rtol=1e-4, atol=1e-6, msg=name)
