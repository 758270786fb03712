"""Shrinks a Hugging Face config to a tiny model with generic rules (no downloads).

The config class's defaults describe the full-size architecture; the rules below cap every
size by the meaning of its key (hidden widths, layers, heads, vocab, experts, positions),
keep one layer of each kind where the config lists layer types, remap special token ids
into the small vocabulary, and recurse into nested configs (text_config and friends).
"""
from __future__ import annotations

import re

HIDDEN = 64
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
VOCAB = 128
POSITIONS = 128
IMAGE = 64

# Tuples, not sets: the rules take the first of these keys a config has (its layer count, its hidden size),
# and a set's order changes with the interpreter's string hashing (MobileBERT shrank two ways).
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
           "num_decoder_layers", "num_encoder_layers", "text_num_hidden_layers")
_HIDDEN = ("hidden_size", "n_embd", "d_model", "embed_dim", "n_embed", "dim", "model_dim", "word_embed_proj_dim",
           "embedding_size", "hidden_dim", "d_embed", "d_latents",
           "out_hidden_size")  # a vision tower's out_hidden_size is the text model's width
_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads",
          "encoder_attention_heads", "num_attention_heads_text")
_KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv",
             "num_key_value_groups")
_HEAD_DIMS = {"head_dim", "d_head", "attention_head_size", "kv_channels", "v_head_dim", "head_size", "attention_head_dim"}
_EXPERTS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_total"}
_TOP_K = {"num_experts_per_tok", "top_k", "moe_topk", "num_experts_per_token", "moe_k", "num_selected_experts"}
_GROUPS = {"n_group", "topk_group", "num_expert_groups", "moe_num_groups", "num_expert_group"}
_VOCAB = {"vocab_size", "text_vocab_size"}
_SMALL_DIMS = {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
               "index_head_dim": 16, "index_n_heads": 2, "mamba_d_head": 16, "mamba_n_heads": 8,
               "mamba_d_state": 16, "ssm_state_size": 16, "state_size": 16, "d_state": 16,
               "time_step_rank": 8, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
               "linear_num_key_heads": 2, "linear_num_value_heads": 4, "n_shared_experts": 1,
               "num_shared_experts": 1, "attention_window": 8, "block_size": 8, "chunk_size": 8,
               "num_memory_tokens": 0, "rotary_dim": HEAD_DIM, "num_latents": 16,
               "latent_query_num": 16,  # Kosmos-2's image rows (64; Kosmos-2.5's 2048 outgrow the positions)
               # Gemma 3 pools the vision patches to sqrt(mm_tokens_per_image) per side: a 2x2 grid still
               # pools the shrunk image's few patches (a 16x16 grid would pool them with a zero stride).
               "mm_tokens_per_image": 4}
_LAYER_LISTS = ("layer_types", "layers_block_type", "block_types", "hybrid_override_pattern", "attn_type_list",
                "mlp_layer_types", "layer_type")
# Mamba-2 blocks: (heads, head dim) pairs whose product must be the inner width, expand * hidden.
_MAMBA_HEADS = (("mamba_n_heads", "mamba_d_head"), ("n_mamba_heads", "mamba_headdim"), ("num_heads", "head_dim"))
_MAMBA_GROUPS = ("n_groups", "mamba_n_groups", "mamba_ngroups")
_LAYER_COUNT = re.compile(r"^num_\w*attends_per_block$")  # num_self_attends_per_block (Perceiver)
_HEAD_COUNT = re.compile(r"^num_\w*_heads$")  # num_cross_attention_heads and kin
_IMAGE_SIZES = {"image_size", "img_size", "input_size", "crop_size"}
# Nested widths named for the part they feed (text_hidden_size in a vision config); see shrink_dict.
_FEEDS = ("text_hidden_size", "decoder_hidden_size", "projection_dim")
# Per-stage lists (vision backbones, audio feature encoders): widths, block counts, head counts.
_WIDTH_LIST = re.compile(r"(hidden_sizes|embed_dims?|conv_dim|_channels|hidden_dims|widths|_dims)$")
_DEPTH_LIST = re.compile(r"depths?$")
_INTERMEDIATE = re.compile(r"(intermediate|ffn|inner|d_ff|mlp_dim|mlp_hidden|moe_dim|expert_dim|ff_dim)")
_SIZE = re.compile(r"(_size|_dim|_width|_channels|_dimension)$")  # Mimi: vector_quantization_hidden_dimension

# Qwen4-Exp's indexed-attention layers need their token-selection indexer, which its defaults leave unset.
_QWEN4_INDEXER = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM, "indexer_budget": 8,
                  "indexer_compress_ratio": 4}

# Architectures whose default config needs more than the generic rules.
OVERRIDES: dict[str, dict] = {
    "reformer": {"axial_pos_shape": [8, 16], "axial_pos_embds_dim": [32, 32], "attn_layers": ["local", "lsh"],
                 "local_attn_chunk_length": 8, "lsh_attn_chunk_length": 8, "max_position_embeddings": 128,
                 "is_decoder": True,
                 # It runs in train mode (see the worker's TRAIN_MODE): no dropout, hashing with a fixed seed,
                 # plain position embeddings (train mode wants axial ones to cover exactly the sequence, which
                 # generate then outgrows) and a bucket count (eval mode derives it from the first sequence).
                 "hidden_dropout_prob": 0.0, "local_attention_probs_dropout_prob": 0.0, "hash_seed": 0,
                 "axial_pos_embds": False, "num_buckets": 2},
    "xlnet": {"mem_len": 8},
    "rwkv": {"context_length": POSITIONS, "attention_hidden_size": HIDDEN},
    "longcat_flash": {"num_layers": 1},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "xmod": {"default_language": "en_XX"},
    "esm": {"pad_token_id": 1, "mask_token_id": 2},
    "lilt": {"hidden_size": 48},  # six box embeddings of hidden_size // 6 must fill the hidden size
    "mobilebert": {"embedding_size": 32},  # its MLM head widens embeddings by hidden - embedding_size
    "cvt": {"depth": [1, 2, 3]},  # its last stage indexes drop-path rates by stage number, so needs depth > 2
    "efficientnet": {"width_coefficient": 1.0, "hidden_dim": 1280},  # hidden_dim is the top conv's width
    "layoutlmv3": {"coordinate_size": 10, "shape_size": 12},  # 4 coordinates and 2 shapes fill hidden_size
    "perceiver": {"max_position_embeddings": 8},  # its masked-LM decoder emits one row per position
    # Zamba ties every hybrid layer's shared block to the first one's, which fails with a single one.
    "zamba": {"layers_block_type": ["linear_attention", "hybrid", "hybrid"], "num_hidden_layers": 3},
    # DbrxAttention reads rope_theta, no longer an attention-config field, and clamps by clip_qkv, which
    # must be set (DBRX checkpoints set 8).
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # Per-layer-type rope tables: the default is empty and the rotary embedding looks up each type.
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},  # unset by default; the model indexes it
    "qwen4_exp_text": _QWEN4_INDEXER,
    "qwen4_exp": {"text_config": _QWEN4_INDEXER},
    # MusicGen's generate starts every codebook from decoder_start_token_id, set in the checkpoints'
    # generation configs to the bos id (the full vocabulary's size, remapped to the top of the small one).
    "musicgen": {"decoder": {"decoder_start_token_id": VOCAB - 1}},
    "musicgen_melody": {"decoder": {"decoder_start_token_id": VOCAB - 1}},
    # Its config turns num_hidden_layers into the per-stack count times the cycles (one cache slot per
    # attention call); unset, the per-stack count is derived again from the shrunk layer count.
    "hrm_text": {"num_layers_per_stack": None},
    # BLT builds its cache from the top config, which has no num_hidden_layers (its parts do): no cache.
    "blt": {"use_cache": False},
    # Chunks shorter than the sequence take a recurrent path that writes states in place, which backward
    # cannot go through: keep the default chunk (one padded chunk). Its config rounds the query-key width
    # up to a multiple of 64 and its model does not: keep that width one.
    "xlstm": {"hidden_size": 128, "embedding_dim": 128, "num_blocks": 2, "chunk_size": 64},
    "cohere_compass": {"text_config": {"rope_parameters": {"full_attention": {"rope_type": "default",
                                                                          "rope_theta": 10000.0}}}},
    # Unset by default, indexed per layer by the model (the checkpoints list it): one dense, one sparse. Its
    # SAM encoder downsamples to 896 channels, its checkpoints' vision-encoder width, while the default
    # encoder is 4096 wide: the last stage is the encoder's width.
    "deepseek_ocr2": {"text_config": {"mlp_layer_types": ["dense", "sparse"]},
                      "vision_config": {"sam_config": {"downsample_channels": [2 * HIDDEN, HIDDEN]}}},
    # Its modeling code defaults mrope_section to the full-size [16, 24, 24] where its config has none, and
    # the config does not flag the key as one _set_mrope fills: sections for the shrunk head_dim.
    "paddleocr_vl": {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                                         "mrope_section": [2, 3, 3]}}},
    # ERNIE 4.5 VL orders its sections (height, width, time) and interleaves the spatial two, which must
    # match; the Qwen2-VL proportions _set_mrope fills in are (time, height, width).
    "ernie4_5_vl_moe": {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                                            "mrope_section": [3, 3, 2]}}},
    # Llama 4's vision adapter reads the pixel-shuffled patches (the width over pixel_shuffle_ratio squared,
    # 4 x 64) through a layer as wide as the vision intermediate size; the checkpoints keep them equal.
    "llama4": {"vision_config": {"intermediate_size": 4 * HIDDEN}},
    # MUSE's out_hidden_size is a merged patch's width, the vision width times merge_size squared (2 x 2),
    # not the text width it names in Qwen2-VL's configs.
    "muse_spark": {"out_hidden_size": 4 * HIDDEN},
    "muse_glimmer": {"out_hidden_size": 4 * HIDDEN},
    # Its config derives these from the hidden size in __post_init__, then sets the full-size values the
    # default's to_dict() carried over them: the values it derives for the shrunk sizes (64 wide, 4 heads).
    "bros": {"dim_bbox_sinusoid_emb_2d": HIDDEN // 4, "dim_bbox_sinusoid_emb_1d": HIDDEN // 4 // 8,
             "dim_bbox_projection": HEAD_DIM},
    # Its config validator asks the audio adaptor's intermediate size to be a quarter of the text width.
    "fun_asr_nano": {"adaptor_config": {"intermediate_size": HIDDEN // 4}},
    # Audio is encoded in chunks of whole acoustic-tokenizer hops (3200 samples: the product of its
    # downsampling ratios, which the rules keep); the validator asks for a multiple of the hop.
    "vibevoice_asr": {"acoustic_tokenizer_chunk_size": POSITIONS * 3200},
    # Its decoder reads num_key_value_heads, which the top config class does not define (the checkpoints'
    # config.json sets it; only the encoder's config class has it): the default model fails to build too.
    "moonshine_streaming": {"num_key_value_heads": HEADS},
    # Molmo2's adapter emits text_hidden_size-wide features (3584 by default) into its text model (4096 wide
    # by default; the checkpoints match them): the adapter feeds the shrunk text width.
    "molmo2": {"adapter_config": {"text_hidden_size": HIDDEN}},
    # Step3p7's text model builds a sliding-window mask whatever its layer types; the default config
    # leaves the window unset (the checkpoints set it).
    "step3p7": {"text_config": {"sliding_window": 8}},
    # Pix2Struct's attention output layer is hidden_size wide, so heads times d_kv must equal the hidden
    # size (12 x 64 = 768 by default); d_kv is not among the head dims the rules shrink (T5 keeps its 64).
    "pix2struct": {"text_config": {"d_kv": HEAD_DIM}, "vision_config": {"d_kv": HEAD_DIM}},
}


def _kv(value: int, d: dict) -> int:
    """Keep grouped-query attention grouped, multi-head attention multi-head."""
    heads = next((d[k] for k in _HEADS if isinstance(d.get(k), int)), None)
    return HEADS if value is None or value == heads else max(1, min(value, HEADS // 2))


def _token_id(value, vocab: int):
    if isinstance(value, list):
        return [_token_id(v, vocab) for v in value]
    if isinstance(value, int) and value >= vocab:
        return vocab - 1 - value % 8  # distinct small ids near the top of the small vocab
    return value


def shrink_dict(d: dict, widths: frozenset = frozenset(), siblings: frozenset = frozenset()) -> dict:
    """The shrunk copy of a config dict (to_dict() form); nested config dicts recurse. `widths` holds the
    hidden sizes of the enclosing config's other parts and `siblings` their names (less `_config`): a
    nested width equal to one of them (a vision adapter's output width, the text model's hidden size)
    follows it down to HIDDEN."""
    out = dict(d)
    vocab = min(d.get("vocab_size") or VOCAB, VOCAB)
    parts = {k: v for k, v in d.items() if _is_config(k, v)}
    hiddens = {v[k] for v in parts.values() for k in _HIDDEN if isinstance(v.get(k), int)}
    for key, value in d.items():
        if _is_config(key, value):
            out[key] = shrink_dict(value, frozenset(hiddens), frozenset(k.removesuffix("_config") for k in parts))
        elif key == "head_dim" and value is None:
            out[key] = HEAD_DIM  # derived in the model as hidden // heads; some models need it set
        elif key in _KV_HEADS and value is None and "num_attention_heads" in d:
            out[key] = HEADS  # left for the model to derive, which some never do (Nemotron)
        elif key == "vocab_size" and value is None:
            out[key] = VOCAB  # set from the checkpoint's vocabulary file (ESM)
        elif isinstance(value, dict) and _int_list(value.get("mrope_section")):
            out[key] = {**value, "mrope_section": _mrope(value["mrope_section"])}
        elif _int_list(value):
            out[key] = _shrink_list(key, value, widths)
        elif isinstance(value, bool) or not isinstance(value, int):
            continue
        else:
            # Dots3's adapter_out_dim, BLT's hidden_size_global, Inkling2's text_hidden_size and PP-FormulaNet's
            # decoder_hidden_size in their vision configs, Florence-2's vision projection_dim: widths that
            # feed another part of the model.
            sibling = "adapter" in key or key.startswith("hidden_size_") or key in _FEEDS
            # A width named for a sibling part (NeMo diarization's head_config.audio_hidden_size, where the
            # sibling is audio_config): the width that part hands over.
            sibling = sibling or (key.endswith("_hidden_size") and key.removesuffix("_hidden_size") in siblings)
            # Nemotron-H Omni's vision_hidden_size, Kimi-K2.5's projection_hidden_size: widths of a part
            # this config holds, read where that part's output is projected.
            part = _SIZE.search(key) and value in hiddens
            out[key] = HIDDEN if (sibling and value in widths) or part else _shrink_int(key, value, d, vocab)
    for key, value in d.items():
        if key.endswith(("token_id", "token_ids", "token_index")):
            out[key] = _token_id(value, vocab)
        elif key in ("out_features", "out_indices"):
            del out[key]  # backbones default to their last stage, which the shrunk depths moved
    _unset_moe_sizes(d, out)
    _keep_layer_kinds(out)
    _keep_attention_layer(out)
    _kv_sharing(out)
    _layer_ids(out)
    _trim_per_layer(d, out)
    _derived_head_dims(d, out)
    _mamba_heads(out)
    _feature_layers(out)
    _global_layers(out)
    _pinpoints(d, out)
    _patch_queries(out)
    _patch_positions(d, out)
    return out


def _patches(c: dict) -> int | None:
    """The patch count of a vision config's image (image_size over patch_size per side); None if unknown."""
    size, patch = c.get("image_size"), c.get("patch_size")
    sides = [size, size] if isinstance(size, int) else size
    if not isinstance(patch, int) or not _int_list(sides) or len(sides) != 2:
        return None
    return (sides[0] // patch) * (sides[1] // patch)


def _patch_positions(d: dict, out: dict) -> None:
    """A position table with one row per patch of the image (Molmo2's num_position_embeddings, 27 x 27 by
    default) follows the shrunk image: the tower adds it to the patches without slicing."""
    if isinstance(d.get("num_position_embeddings"), int) and d["num_position_embeddings"] == _patches(d):
        out["num_position_embeddings"] = _patches(out)


def _global_layers(d: dict) -> None:
    """Layer indices in a config that lists some of its own layers. SAM-style encoders list their
    global-attention layers (2, 5, 8, 11 of twelve), and DeepSeek-VL hybrid reads the hidden state of the
    first: indices past the shrunk layer count are dropped, and where none is left the last layer is the
    global one."""
    layers = next((d[k] for k in _LAYERS if isinstance(d.get(k), int)), None)
    for key in [k for k in d if k.endswith("global_attn_indexes")]:
        if layers is not None and _int_list(d[key]):
            d[key] = [i for i in d[key] if i < layers] or [layers - 1]
    # Mllama's vision tower concatenates its last hidden state and those of its intermediate_layers_indices
    # (3 to 30): they move inside the shrunk tower, keeping their count, and its vision_output_dim stays
    # the hidden size times that count plus one (1280 x 6 = 7680 by default).
    for key in [k for k in d if k.endswith("intermediate_layers_indices")]:
        if layers is not None and _int_list(d[key]):
            d[key] = [min(i, layers - 1) for i in d[key]]
            if isinstance(d.get("vision_output_dim"), int) and isinstance(d.get("hidden_size"), int):
                d["vision_output_dim"] = d["hidden_size"] * (len(d[key]) + 1)


def _patch_queries(d: dict) -> None:
    """Aria's projector maps the vision tower's patch count to its number of queries through a table
    keyed by the full-size counts (35 x 35 and 70 x 70 patches): re-keyed to the shrunk image's count."""
    vision = d.get("vision_config")
    for key in [k for k, v in d.items() if k.endswith("patch_to_query_dict") and isinstance(v, dict)]:
        if isinstance(vision, dict) and isinstance(vision.get("image_size"), int) \
                and isinstance(vision.get("patch_size"), int):
            d[key] = {(vision["image_size"] // vision["patch_size"]) ** 2: 16}
            d.pop(f"max_value_{key}", None)  # derived from the table (the query parameter's rows)


def _pinpoints(d: dict, out: dict) -> None:
    """LLaVA-NeXT's grid of tiled resolutions counts in multiples of the vision tower's image size:
    scaled with that size to the shrunk one, each resolution keeps its number of tiles."""
    size = (d.get("vision_config") or {}).get("image_size")
    if not _int_list([v for pair in d.get("image_grid_pinpoints") or [] for v in pair]) or not isinstance(size, int):
        return
    new = out["vision_config"]["image_size"]
    out["image_grid_pinpoints"] = [[v * new // size for v in pair] for pair in d["image_grid_pinpoints"]]


def _feature_layers(d: dict) -> None:
    """Vision-language configs pick vision hidden states by layer index (VipLLaVA's five, from -2 to
    -11; Molmo2's adapter's [24, 18]): indices past the shrunk vision tower move to its last layers,
    keeping their count (the projector's width is the count times the vision width)."""
    layers = next((d["vision_config"][k] for k in _LAYERS if isinstance(d.get("vision_config"), dict)
                   and isinstance(d["vision_config"].get(k), int)), None)
    if layers is None:
        return
    for part in [d] + [v for k, v in d.items() if _is_config(k, v)]:
        for key in [k for k in part if k.endswith(("feature_layer", "feature_layers"))]:
            if _int_list(part[key]):
                part[key] = [max(i, -layers) if i < 0 else min(i, layers - 1) for i in part[key]]


def _unset_moe_sizes(d: dict, out: dict) -> None:
    """Mixture-of-experts configs whose defaults leave the expert count or top-k unset (DeepSeek V2,
    dots1: their checkpoints set them) get the shrunk sizes; the model cannot route without them."""
    moe = any(isinstance(d.get(k), int) for k in _EXPERTS | _TOP_K) or isinstance(d.get("moe_intermediate_size"), int)
    if not moe:
        return
    for key in _EXPERTS | _TOP_K | {"n_shared_experts"}:
        if key in d and d[key] is None:
            out[key] = 4 if key in _EXPERTS else 2 if key in _TOP_K else 1


def _keep_attention_layer(d: dict) -> None:
    """Hybrid models (Mamba or linear attention plus attention: Bamba, Jamba, Granite hybrid) need at
    least one attention layer in the shrunk layer count: transformers asks the cache for the sequence
    length through an attention layer. Their defaults place attention past the first layers (Jamba's
    period 8, offset 4) or nowhere (the checkpoints list it): the last layer becomes attention."""
    layers_key = next((k for k in _LAYERS if k in d), None)
    if layers_key is None or not isinstance(d[layers_key], int) or not isinstance(d.get("num_attention_heads"), int):
        return  # no attention in the model (Mamba, RWKV)
    layers = d[layers_key]
    if "attn_layer_indices" in d and not any(i < layers for i in d["attn_layer_indices"] or ()):
        d["attn_layer_indices"] = [layers - 1]
    for key in [k for k in d if k.endswith("_layer_period")]:
        offset = key.replace("_period", "_offset")
        if isinstance(d[key], int) and isinstance(d.get(offset), int) and d[key] > layers:
            d[key] = layers  # every kind of layer repeating with this period still appears
            d[offset] %= layers
    for key in _LAYER_LISTS:
        if isinstance(d.get(key), list) and d[key] and set(d[key]) == {"linear_attention"}:
            d[key] = d[key][:-1] + ["full_attention"]


def _kv_sharing(d: dict) -> None:
    """Models whose last num_kv_shared_layers layers reuse the keys and values of the last earlier layer
    of their kind (Gemma 3n) need a producer of each kind before the consumers: the kinds twice over."""
    layers_key = next((k for k in _LAYERS if k in d), None)
    shared, pattern = d.get("num_kv_shared_layers"), d.get("layer_types")
    if layers_key is None or not isinstance(shared, int) or shared <= 0 or not isinstance(pattern, list):
        return
    kinds = list(dict.fromkeys(pattern))
    d["layer_types"] = kinds * 2
    d[layers_key] = 2 * len(kinds)
    d["num_kv_shared_layers"] = len(kinds)


def _layer_ids(d: dict) -> None:
    """Index lists named for a layer kind (Zamba2's hybrid_layer_ids) follow the shrunk pattern."""
    for key in [k for k in d if k.endswith("_layer_ids")]:
        kind = key[: -len("_layer_ids")]
        pattern = next((d[k] for k in _LAYER_LISTS if isinstance(d.get(k), list) and kind in d[k]), None)
        if pattern is not None:
            d[key] = [i for i, t in enumerate(pattern) if t == kind]


def _mamba_heads(d: dict) -> None:
    """Mamba-2 heads times head dim must equal the inner width (expand * hidden, or mamba_d_ssm where
    set) and the heads split evenly into groups; the rules shrink those sizes independently."""
    expand = next((d[k] for k in ("mamba_expand", "expand") if isinstance(d.get(k), int)), None)
    hidden = d.get("hidden_size")
    if expand is None or not isinstance(hidden, int):
        return
    if isinstance(d.get("mamba_d_ssm"), int):
        d["mamba_d_ssm"] = expand * hidden
    for heads, head_dim in _MAMBA_HEADS:
        if isinstance(d.get(heads), int) and isinstance(d.get(head_dim), int):
            d[head_dim] = expand * hidden // d[heads]
            for groups in _MAMBA_GROUPS:
                if isinstance(d.get(groups), int) and d[heads] % d[groups]:
                    d[groups] = 1
            return


def _is_config(key: str, value) -> bool:
    """A nested config's dict (text_config, MusicGen's decoder)."""
    return isinstance(value, dict) and ("model_type" in value or key.endswith("config"))


def _mrope(sections: list, rotary: float = 1.0) -> list:
    """Multimodal rotary sections (time, height, width) split the rotary half of head_dim (all of it
    but for a partial_rotary_factor, GLM-4.1V's 0.5): keep the proportions."""
    total = int(HEAD_DIM * rotary) // 2
    out = [max(1, v * total // sum(sections)) for v in sections]
    out[-1] += total - sum(out)
    return out


def _int_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, int) and not isinstance(v, bool)
                                                          for v in value)


def _shrink_list(key: str, value: list, widths: frozenset = frozenset()) -> list:
    if key in _IMAGE_SIZES:
        return [min(v, IMAGE) for v in value]
    if _DEPTH_LIST.search(key):
        return [min(v, 2) for v in value]
    if key in _HEADS or _HEAD_COUNT.match(key):
        return [1 << (min(v, HEADS).bit_length() - 1) if v > 0 else v for v in value]  # powers of two divide widths
    if _WIDTH_LIST.search(key):
        # A stage as wide as another part of the enclosing config feeds it (Unlimited-OCR's SAM encoder
        # downsamples to its vision encoder's width): it follows that part down to HIDDEN.
        return [HIDDEN if v in widths else min(v, 2 * HIDDEN) for v in value]
    return value


def _derived_head_dims(d: dict, out: dict) -> None:
    """Multi-head latent attention (DeepSeek V3 and kin) derives sizes the rules shrank apart:
    rotary runs on head_dim = qk_rope_head_dim, and qk_head_dim = nope + rope."""
    if "qk_rope_head_dim" not in out:
        return
    if d.get("head_dim") == d["qk_rope_head_dim"]:
        out["head_dim"] = out["qk_rope_head_dim"]
    if "qk_head_dim" in out and "qk_nope_head_dim" in out:
        out["qk_head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]


def _trim_per_layer(d: dict, out: dict) -> None:
    """Per-layer lists and tables follow the new layer count."""
    layers_key = next((k for k in _LAYERS if k in d), None)
    if layers_key is None or not isinstance(d[layers_key], int):
        return
    old, new = d[layers_key], out[layers_key]
    for key, value in out.items():
        if isinstance(value, list) and len(value) == old and key not in _LAYER_LISTS and old != new:
            out[key] = [min(v, 2 * HIDDEN) if isinstance(v, int) and not isinstance(v, bool) else v
                        for v in value[:new]]
        elif key == "per_layer_config" and isinstance(value, dict):
            out[key] = {k: v for k, v in value.items() if int(k) < new}


def _shrink_int(key: str, value: int, d: dict, vocab: int) -> int:
    base = key.removeprefix("cross_")
    if base in _HIDDEN or base in _HEADS or base in _KV_HEADS or base in _HEAD_DIMS:
        key = base  # cross-attention sizes (Dia's decoder: cross_hidden_size, the encoder's width) shrink alike
    if key in _LAYERS or _LAYER_COUNT.match(key):
        return min(value, 2)
    if key in _HIDDEN:
        return min(value, HIDDEN)
    if key in _HEADS:
        return min(value, HEADS)
    if key in _KV_HEADS:
        return _kv(value, d)
    if _HEAD_COUNT.match(key):
        return min(value, HEADS)
    if key in _HEAD_DIMS:
        return min(value, HEAD_DIM)
    if key in _VOCAB or key.startswith("vocab_size") or key.endswith("_vocab"):  # BLT's hash n-gram vocab
        return vocab
    if key in _EXPERTS:
        return min(value, 4)
    if key in _TOP_K:
        return min(value, 2)
    if key in _GROUPS:
        return 1
    if key in _SMALL_DIMS:
        return min(value, _SMALL_DIMS[key])
    if key in _IMAGE_SIZES:
        return min(value, IMAGE)
    if "position" in key or key in ("n_positions", "n_ctx", "seq_length", "max_seq_len"):
        return min(value, POSITIONS) if value > 16 else value
    if _INTERMEDIATE.search(key):
        return min(value, 2 * HIDDEN)
    hidden = next((d[k] for k in _HIDDEN if isinstance(d.get(k), int)), None)
    if _SIZE.search(key) and value == hidden:
        return HIDDEN  # a width that follows the hidden size (DeBERTa's pooler_hidden_size)
    if key.endswith("_groups") and value == hidden:
        return HIDDEN  # a depthwise convolution's groups, one per channel (Mimi's upsample_groups)
    if _SIZE.search(key) and value > 2 * HIDDEN:
        return 2 * HIDDEN
    return value


def _keep_layer_kinds(d: dict) -> None:
    """Keep the first layer of each kind in a per-layer pattern and set the layer count to match."""
    layers_key = next((k for k in _LAYERS if k in d), None)
    for key in _LAYER_LISTS:
        pattern = d.get(key)
        if not isinstance(pattern, (list, str)) or len(pattern) < 2:
            continue
        if isinstance(pattern, str) and not key.endswith("pattern"):
            continue  # a single kind's name (ResNet's layer_type "bottleneck"), not a per-layer string
        kinds = list(dict.fromkeys(pattern))
        picked = [pattern[pattern.index(k)] for k in kinds]
        picked = picked if len(picked) >= 2 else picked * 2
        d[key] = "".join(picked) if isinstance(pattern, str) else picked
        if layers_key is not None:
            d[layers_key] = len(picked)


def shrink(config_class, model_type: str):
    """A tiny instance of `config_class` (its defaults shrunk, then the per-model overrides)."""
    d = shrink_dict(config_class().to_dict())
    _aliased_token_ids(config_class, d)
    _override(d, OVERRIDES.get(model_type, {}))
    for key in ("architectures", "_name_or_path", "transformers_version", "auto_map", "quantization_config"):
        d.pop(key, None)
    config = config_class.from_dict(d)
    config.architectures = []  # auto classes with several heads per model type (DeiT's) iterate it
    _set_mrope(config)
    return config


def _override(d: dict, overrides: dict) -> None:
    """Overrides replace values; a nested config's overrides add to it, at any depth (DeepSeek-OCR 2's SAM
    encoder inside its vision config)."""
    for key, value in overrides.items():
        if isinstance(value, dict) and _is_config(key, d.get(key)):
            d[key] = dict(d[key])
            _override(d[key], value)
        else:
            d[key] = value


def _aliased_token_ids(config_class, d: dict) -> None:
    """Token ids kept under another name that the class maps them to (Molmo2's image_token_id is its
    image_patch_id) move into the small vocabulary like the others."""
    vocab = min(d.get("vocab_size") or VOCAB, VOCAB)
    for alias, key in getattr(config_class, "attribute_map", {}).items():
        if alias.endswith(("token_id", "token_index")) and key in d:
            d[key] = _token_id(d[key], vocab)


def _set_mrope(config) -> None:
    """Configs whose models read rope_parameters["mrope_section"] and default it in the modeling code
    to full-size sections (Qwen2-VL's [16, 24, 24]) get sections that fit the shrunk head_dim's rotary
    part (GLM-4.5V MoE splits exactly that). Where that part is too narrow for three sections (Qwen3.5's
    quarter of the head) they split half the head_dim, a sum its interleaved sections take; so do
    sections a config lists itself."""
    for key in getattr(config, "sub_configs", {}):
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            _set_mrope(sub)
    rope = getattr(config, "rope_parameters", None)
    if "mrope_section" in getattr(config, "ignore_keys_at_rope_validation", ()) and isinstance(rope, dict) \
            and "rope_type" in rope and "mrope_section" not in rope:  # not per-layer-type tables
        sections = _mrope([16, 24, 24], rope.get("partial_rotary_factor", 1.0))
        config.rope_parameters = {**rope, "mrope_section": sections if min(sections) > 0 else _mrope([16, 24, 24])}
