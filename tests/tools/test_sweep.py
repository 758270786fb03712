"""The architecture sweep: small architectures of each task pass every stage that task runs."""
import json
import os

import pytest
import torch

pytest.importorskip("transformers")

from torchneuron.sweep.runner import STAGES, sweep
from torchneuron.sweep.tasks import TASKS
from torchneuron.testing.processes import run_code


def _run(tmp_path, names: list[str], task: str) -> tuple[dict, list[dict], str]:
    summary = sweep(names, tmp_path, jobs=1, timeout=400, task=task)
    report = json.loads((tmp_path / "sweep.json").read_text())
    assert report["task"] == task
    failures = {r["model_type"]: {s: v for s, v in r["stages"].items() if not v["ok"]} for r in report["results"]}
    assert summary["neuron_pass"] == len(names), failures
    return summary, report["results"], (tmp_path / "sweep.md").read_text()


def test_sweep_three_architectures(tmp_path):
    _, results, md = _run(tmp_path, ["llama", "gpt2", "qwen2"], "causal-lm")
    assert all(set(r["stages"]) == set(STAGES) for r in results)
    assert md.startswith("# Hugging Face causal-LM sweep")
    assert "pass forward, backward and generate on neuron" in md
    assert "| forward | 3/3 |" in md


@pytest.mark.parametrize(("task", "name"), [
    ("masked-lm", "bert"),
    ("sequence-classification", "bert"),
    ("token-classification", "distilbert"),
    ("seq2seq-lm", "t5"),
    ("image-classification", "vit"),
    ("ctc", "wav2vec2"),
    ("speech-seq2seq", "whisper"),
    ("image-text-to-text", "llava"),
])
def test_sweep_task(tmp_path, task, name):
    spec = TASKS[task]
    summary, results, md = _run(tmp_path, [name], task)
    assert set(results[0]["stages"]) == set(spec.stages)
    assert summary["per_stage"] == {s: 1 for s in spec.stages}
    assert md.startswith(f"# Hugging Face {spec.title} sweep")
    if not spec.generates:
        assert results[0]["skipped"] == ["generate"]
        assert "| generate | skipped: not applicable" in md
        assert "pass forward and backward on neuron (100.0%)" in md


def _shrunk(name: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from torchneuron.sweep.shrink import shrink
    return shrink(CONFIG_MAPPING[name], name)


@pytest.mark.parametrize("name", ["bamba", "jamba", "granitemoehybrid"])
def test_shrunk_hybrid_keeps_an_attention_layer(name):
    # Their defaults put attention past the first two layers or nowhere; transformers then asks a cache
    # of linear-attention layers only for the sequence length and fails.
    config = _shrunk(name)
    assert "full_attention" in config.layer_types and "linear_attention" in config.layer_types
    assert len(config.layer_types) == config.num_hidden_layers


def test_shrunk_jamba_keeps_experts_and_pure_mamba_stays_attention_free():
    config = _shrunk("jamba")
    assert max(config.layers_num_experts) > 1  # the periodic MoE layer is still there
    assert set(_shrunk("mamba").layer_types) == {"linear_attention"}


@pytest.mark.parametrize("name", ["mamba2", "falcon_h1", "zamba2"])
def test_shrunk_mamba2_heads_fill_the_inner_width(name):
    d = _shrunk(name).to_dict()
    expand = d.get("mamba_expand", d.get("expand"))
    heads, head_dim = next((d[h], d[k]) for h, k in (("mamba_n_heads", "mamba_d_head"), ("n_mamba_heads", "mamba_headdim"),
                                                     ("num_heads", "head_dim")) if h in d)
    assert heads * head_dim == expand * d["hidden_size"]
    groups = next(d[k] for k in ("n_groups", "mamba_n_groups", "mamba_ngroups") if k in d)
    assert heads % groups == 0


def test_shrunk_moe_fills_unset_expert_counts():
    assert _shrunk("deepseek_v2").num_experts_per_tok == 2
    config = _shrunk("dots1")
    assert (config.n_routed_experts, config.num_experts_per_tok, config.n_shared_experts) == (4, 2, 1)


def test_shrunk_kv_sharing_has_a_producer_per_kind():
    config = _shrunk("gemma3n_text")
    first_consumer = config.num_hidden_layers - config.num_kv_shared_layers
    assert 0 < first_consumer < config.num_hidden_layers
    assert set(config.layer_types[:first_consumer]) == set(config.layer_types)
    assert "reuse" in config.kv_sharing_modes  # raised before: a consumer kind without a producer


def test_shrunk_layer_ids_follow_the_pattern():
    config = _shrunk("zamba2")
    assert config.hybrid_layer_ids == [i for i, t in enumerate(config.layers_block_type) if t == "hybrid"]
    assert config.hybrid_layer_ids


def test_shrunk_nested_widths_follow_the_part_they_feed():
    config = _shrunk("dots3_note")  # its validator checks the vision adapter's output is the text width
    assert config.vision_config.adapter_out_dim == config.text_config.hidden_size
    blt = _shrunk("blt")
    assert blt.encoder_config.hidden_size_global == blt.global_config.hidden_size
    assert blt.encoder_hash_byte_group_vocab <= 128


def test_shrunk_widths_named_for_a_sibling_part_follow_it():
    # NeMo speech LM's diarization head reads the audio encoder's output; its validator checks the widths
    # (shrink raised before: head_config.audio_hidden_size 128, audio_config.hidden_size 64).
    diarization = _shrunk("nemo_speechlm").audio_config.diarization_config
    assert diarization.head_config.audio_hidden_size == diarization.audio_config.hidden_size == 64


def test_shrunk_depthwise_groups_follow_the_hidden_size():
    from transformers import MimiModel
    codec = _shrunk("kyutai_speech_to_text").codec_config  # Mimi upsamples with one group per channel
    assert codec.upsample_groups == codec.hidden_size == 64
    MimiModel(codec)  # raised before: in_channels must be divisible by groups


def test_nested_override_adds_to_the_shrunk_part():
    config = _shrunk("dbrx")
    assert config.attn_config.rope_theta == 10000.0 and config.attn_config.clip_qkv == 8.0
    assert config.d_model == 64  # the rest of the shrunk config is kept


def test_shrink_does_not_depend_on_string_hashing():
    # MobileBERT has two hidden-size keys; the rules used to take whichever a set listed first.
    code = ("from transformers import MobileBertConfig; from torchneuron.sweep.shrink import shrink; "
            "c = shrink(MobileBertConfig, 'mobilebert'); print(c.true_hidden_size, c.intra_bottleneck_size)")
    import torchneuron
    root = os.path.dirname(os.path.dirname(torchneuron.__file__))  # this checkout's package in the child too
    outs = {tuple(run_code(code, env={"PYTHONPATH": root, "PYTHONHASHSEED": seed}, timeout=600).stdout.split()[-2:])
            for seed in ("1", "3")}  # 3 picked the other width before
    assert len(outs) == 1, outs


def test_musicgen_builds_its_decoder_with_codebook_rows():
    from torchneuron.sweep.worker import build
    model = build("musicgen", TASKS["causal-lm"])
    batch = TASKS["causal-lm"].inputs(model)
    codebooks = model.config.num_codebooks
    assert batch["input_ids"].shape == (2 * codebooks, 8) and batch["labels"].shape == (2, 8, codebooks)
    assert model(**batch).loss.isfinite()


def test_shrunk_cross_attention_and_dimension_sizes_follow_their_kin():
    dia = _shrunk("dia").decoder_config  # cross-attention reads the encoder's (shrunk) width
    assert (dia.cross_hidden_size, dia.cross_head_dim) == (64, 16)
    assert dia.cross_num_attention_heads % dia.cross_num_key_value_heads == 0
    codec = _shrunk("kyutai_speech_to_text").codec_config  # Mimi's quantizer projects to the codebook width
    assert codec.vector_quantization_hidden_dimension == codec.codebook_dim


def test_document_models_get_a_box_per_token():
    from types import SimpleNamespace

    from torchneuron.sweep.tasks import _boxes
    g = torch.Generator().manual_seed(0)
    box = _boxes(SimpleNamespace(max_2d_position_embeddings=128), g)  # LayoutLM: indices on its 2-D grid
    assert box.shape == (2, 8, 4) and box.dtype == torch.long and 0 <= box.min() and box.max() < 128
    assert (box[..., 2] >= box[..., 0]).all() and (box[..., 3] >= box[..., 1]).all()  # sizes index embeddings
    quad = _boxes(SimpleNamespace(dim_bbox=8), g)  # Bros: four corner points, normalised
    assert quad.shape == (2, 8, 8) and quad.is_floating_point() and 0 <= quad.min() and quad.max() <= 1
    assert "bbox" not in TASKS["token-classification"].inputs(_built("bert", "token-classification"))


def _built(name: str, task: str):
    from torchneuron.sweep.worker import build
    return build(name, TASKS[task])


def test_audio_inputs_follow_the_model():
    wrapper = _built("speech-encoder-decoder", "speech-seq2seq")  # main input `inputs`: its encoder's input
    assert set(TASKS["speech-seq2seq"].inputs(wrapper)) == {"input_values", "labels"}
    granite = TASKS["ctc"].inputs(_built("granite_speech5_ctc", "ctc"))  # mel frame + delta, pairs stacked
    assert granite["input_features"].shape[-1] == 4 * 80
    pop = _built("pop2piano", "speech-seq2seq")  # token-id main input, but its generate requires the audio
    assert TASKS["speech-seq2seq"].inputs(pop)["input_features"].shape[-1] == pop.config.d_model


def test_speech_models_generate_from_the_audio_they_stream():
    from torchneuron.sweep.tasks import generation_prompt
    spec = TASKS["speech-seq2seq"]
    voxtral = _built("voxtral_realtime", "speech-seq2seq")  # an audio embedding added at every text position
    batch = spec.inputs(voxtral)
    assert batch["input_features"].shape[-1] == 8 * voxtral.config.audio_length_per_tok
    assert generation_prompt(voxtral, batch, 3)["input_ids"].shape == (2, 5)  # 3 audio tokens left to generate
    kyutai = _built("kyutai_speech_to_text", "speech-seq2seq")  # a text id and a code per codebook each step
    batch = spec.inputs(kyutai)
    assert batch["input_ids"].shape == (2, 8, 1 + kyutai.config.num_codebooks) and batch["labels"].shape == (2, 8)
    assert set(generation_prompt(kyutai, batch, 3)) == {"input_values"}
    dia = _built("dia", "speech-seq2seq")  # text in, audio codes out with a delay per codebook
    batch = spec.inputs(dia)
    codebooks = len(dia.config.delay_pattern)
    assert batch["decoder_input_ids"].shape == (2, 8, codebooks) and batch["labels"].shape == (2 * codebooks, 8)
    assert torch.equal(batch["labels"][1], batch["decoder_input_ids"][0, :, 1])  # row 1: codebook 1 of item 0


def test_image_classifiers_take_the_layout_their_forward_names():
    batch = TASKS["image-classification"].inputs(_built("siglip2", "image-classification"))
    assert batch["pixel_values"].dim() == 3 and batch["spatial_shapes"].tolist() == [[4, 4]] * 2


def test_train_mode_models_and_captioners():
    from torchneuron.sweep.worker import TRAIN_MODE, build
    assert "rwkv" in TRAIN_MODE and build("rwkv", TASKS["causal-lm"]).training
    assert not build("llama", TASKS["causal-lm"]).training
    git = build("git", TASKS["causal-lm"])
    assert "pixel_values" in TASKS["causal-lm"].inputs(git)  # GIT's LM loss skips the image positions


@pytest.mark.parametrize("name", ["idefics3", "llava_next"])  # tiles with a pixel mask; tiles per grid resolution
def test_image_text_batch_has_a_token_per_image_feature(name):
    from torchneuron.sweep.tasks import _image_token, _image_token_count, _vision_api
    from torchneuron.sweep.worker import build
    spec = TASKS["image-text-to-text"]
    model = build(name, spec)
    batch = spec.inputs(model)
    vision = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask", "labels")}
    with torch.no_grad():
        features = _image_token_count(_vision_api(model).get_image_features(**vision))
    tokens = (batch["input_ids"] == _image_token(model.config)).sum(dim=1)
    assert features > 0 and tokens.tolist() == [features] * 2
    assert model(**batch).loss.isfinite()


def test_image_text_config_sets_unset_image_tokens_inside_the_vocabulary():
    from torchneuron.sweep.tasks import IMAGE_TOKEN, image_text_config
    config = _shrunk("blip-2")
    assert config.image_token_index is None  # BLIP-2's checkpoints set it
    image_text_config(config)
    assert config.image_token_index == IMAGE_TOKEN < config.text_config.vocab_size


def test_patch_layouts_follow_the_vision_config():
    from types import SimpleNamespace

    from torchneuron.sweep.tasks import _flattened_patches, _patch_grid, _patch_list
    g = torch.Generator().manual_seed(0)
    muse = SimpleNamespace(patch_size=14, merge_size=2, patch_temporal=2, num_channels=3)
    pixels, extra = _patch_grid(SimpleNamespace(model_type="muse_spark"), muse, g)
    assert pixels.shape == (2 * 16, 3 * 2 * 14 * 14) and extra["image_grid_thw"].tolist() == [[1, 4, 4]] * 2
    paddle = SimpleNamespace(patch_size=14, spatial_merge_size=2, num_channels=3)
    pixels, extra = _patch_grid(SimpleNamespace(model_type="paddleocr_vl"), paddle, g, "image_grid_hw")
    assert pixels.shape == (32, 3, 14, 14) and extra["image_grid_hw"].tolist() == [[4, 4]] * 2
    pixels, extra = _patch_list(SimpleNamespace(patch_size=16, image_size=64, num_channels=3), g)
    assert pixels.shape == (2, 16, 768) and extra["pixel_attention_mask"].shape == (2, 16)
    patches = _flattened_patches(SimpleNamespace(patch_embed_hidden_size=12, seq_len=4096), g)
    assert patches.shape == (2, 16, 14) and patches[0, 5, :2].tolist() == [1.0, 1.0]  # row, column


def test_shrunk_vision_language_sizes_stay_consistent():
    from torchneuron.sweep.shrink import HEAD_DIM, HIDDEN, IMAGE
    next_ = _shrunk("llava_next")  # tiled resolutions scale with the image: 336 x 672 is one by two tiles
    assert [IMAGE, 2 * IMAGE] in next_.image_grid_pinpoints
    vip = _shrunk("vipllava")  # five feature layers, all inside the two-layer tower
    assert len(vip.vision_feature_layer) == 5 and all(-2 <= i <= 1 for i in vip.vision_feature_layer)
    assert all(0 <= i < 2 for i in _shrunk("molmo2").adapter_config.vision_feature_layer)
    assert _shrunk("gemma3").mm_tokens_per_image == 4
    assert sum(_shrunk("glm4v_moe").text_config.rope_parameters["mrope_section"]) == HEAD_DIM // 4  # half rotary
    assert _shrunk("nemotron_h_omni").vision_hidden_size == HIDDEN == _shrunk("inkling2").vision_config.text_hidden_size
    formula = _shrunk("pp_formulanet")  # its vision decoder width feeds the text decoder's cross-attention
    assert formula.vision_config.decoder_hidden_size == formula.text_config.d_model == HIDDEN


def test_shrunk_vision_tables_follow_the_shrunk_tower():
    from torchneuron.sweep.shrink import HIDDEN
    aria = _shrunk("aria")  # its projector's query table is keyed by the tower's patch count
    vision = aria.vision_config
    assert list(aria.projector_patch_to_query_dict) == [(vision.image_size // vision.patch_size) ** 2]
    assert aria.max_value_projector_patch_to_query_dict == 16
    hybrid = _shrunk("deepseek_vl_hybrid").high_res_vision_config  # global layers inside the shrunk encoder
    assert hybrid.global_attn_indexes and all(i < hybrid.num_hidden_layers for i in hybrid.global_attn_indexes)
    ocr = _shrunk("unlimited_ocr").vision_config  # the SAM stage that feeds the vision encoder is its width
    assert ocr.sam_config.downsample_channels[-1] == ocr.encoder_config.hidden_size == HIDDEN


def test_shrunk_configs_keep_derived_sizes():
    from torchneuron.sweep.shrink import HIDDEN
    vision = _shrunk("mllama").vision_config  # hidden states of 5 intermediate layers plus the last
    assert all(i < vision.num_hidden_layers for i in vision.intermediate_layers_indices)
    assert vision.vision_output_dim == vision.hidden_size * (len(vision.intermediate_layers_indices) + 1)
    molmo = _shrunk("molmo2")  # a position row per patch; the image token under its own name, in the vocab
    assert molmo.vision_config.num_position_embeddings == (64 // molmo.vision_config.patch_size) ** 2
    assert molmo.image_token_id < molmo.text_config.vocab_size
    ocr = _shrunk("deepseek_ocr2").vision_config  # an override two configs deep keeps the rest of the part
    assert ocr.sam_config.downsample_channels[-1] == ocr.encoder_config.hidden_size == HIDDEN
    assert ocr.sam_config.hidden_size == HIDDEN
    text = _shrunk("pix2struct").text_config  # its attention output layer is hidden_size wide
    assert text.num_heads * text.d_kv == text.hidden_size


@pytest.mark.parametrize("name,keys", [
    ("fuyu", {"pixel_values": (2, 4, 2700)}),  # flat patches
    ("molmo2", {"image_token_pooling": (8, 4), "image_grids": (2, 4)}),  # 2 x 2 pooled patches per token
    ("inkling_mm_model", {"pixel_values": (8, 2, 40, 40, 3)}),  # one two-frame clip per token
    ("inkling2", {"pixel_values": (8, 40, 40, 3), "image_grid_thw": (2, 3)}),  # grid in tokens
    ("granite_docling", {"pixel_attention_mask": (2, 1)}),  # a mask over tiles
    ("instructblipvideo", {"pixel_values": (2, 2, 3, 64, 64)}),  # two-frame clips behind video tokens
    ("kosmos-2", {"image_embeds_position_mask": (2, 24)}),  # 16 latent queries placed by a mask
    ("kosmos-2.5", {"flattened_patches": (2, 16, 130), "image_embeds_position_mask": (2, 24)}),
    ("idefics", {"pixel_values": (2, 1, 3, 64, 64), "image_attention_mask": (2, 8, 1)}),  # cross-attention
    ("mllama", {"pixel_values": (2, 1, 4, 3, 64, 64), "cross_attention_mask": (2, 8, 1, 4)}),
    ("udop", {"bbox": (2, 8, 4)}),  # a box per text token
])
def test_image_text_inputs_follow_the_model(name, keys):
    from torchneuron.sweep.worker import build
    spec = TASKS["image-text-to-text"]
    model = build(name, spec)
    batch = spec.inputs(model)
    assert {k: tuple(batch[k].shape) for k in keys} == keys
    if "image_embeds_position_mask" in batch:  # the mask marks exactly the rows that take no labels
        assert (batch["image_embeds_position_mask"] == (batch["labels"] == -100)).all()
    if "bbox" in batch:
        assert (batch["bbox"][..., :2] <= batch["bbox"][..., 2:]).all()
    with torch.no_grad():
        assert model(**batch).loss.isfinite()


def test_norms_are_calibrated_where_a_tiny_models_gradients_vanish():
    """A deep stack of convolutions and BatchNorms with scales near 0 (transformers' N(0, 0.02) for some
    vision models) loses its signal on CPU: the worker notices (the check would compare zeros) and gives
    its norms one batch's statistics and unit scales, after which the gradients are alive."""
    from types import SimpleNamespace

    from torchneuron.sweep import worker

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layers = []
            for _ in range(12):
                norm = torch.nn.BatchNorm2d(4)
                torch.nn.init.normal_(norm.weight, std=0.02)
                layers += [torch.nn.Conv2d(4, 4, 3, padding=1), norm, torch.nn.Dropout(0.5)]
            self.body = torch.nn.Sequential(*layers)

        def forward(self, pixel_values, labels=None):
            out = self.body(pixel_values).mean((1, 2, 3))
            return SimpleNamespace(loss=((out - labels) ** 2).sum() if labels is not None else None)

    torch.manual_seed(0)
    batch = {"pixel_values": torch.randn(2, 4, 8, 8), "labels": torch.ones(2)}

    def gradients(model):
        model.zero_grad()
        model(**batch).loss.backward()
        return {"body.0.weight": model.body[0].weight.grad.clone()}  # (the first layer: its signal passes every norm)

    model = Tiny().eval()
    assert worker._vanished(gradients(model))
    assert worker._calibrate_norms(model, batch)
    assert not model.training and all(m.p == 0.5 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert not worker._vanished(gradients(model))
    assert not worker._calibrate_norms(torch.nn.Linear(2, 2), {"input": torch.ones(1, 2)})
