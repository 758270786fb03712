"""The sweep's tasks: which transformers auto mapping lists the architectures, which auto class
builds them, how to make a batch with labels, and whether `generate` applies.

Adding a task is adding one `Task` to `TASKS`; the runner and worker read nothing else.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .shrink import IMAGE, VOCAB

STAGES = ("build", "cpu", "forward", "backward", "generate")
BATCH, SEQ = 2, 8
AUDIO_SAMPLES = 8000  # raw waveform length: 25 frames after wav2vec2's 320x convolutional downsampling
AUDIO_FRAMES = 64  # feature frames where the config does not fix the length
CTC_LABELS = 4
# The image token of configs that leave it unset: above the sweep's text ids (3 to 99), below the ids
# shrink remaps special tokens to (the top 8 of the small vocabulary).
IMAGE_TOKEN = VOCAB - 9
# Patch-grid models whose vision tower convolves each patch as a small image (channels, patch, patch)
# rather than projecting a flat row: Kimi-K2.5, PaddleOCR-VL.
PATCH_IMAGES = {"kimi_k25", "paddleocr_vl"}
# Audio models whose feature extractor widens each mel frame, by how much; no config field says it (the
# model's input layer hardcodes it) and the extractor cannot be built here (it needs torchaudio).
# Granite Speech 5: each frame with its delta, consecutive frames stacked in pairs (2 x 2).
FEATURES_PER_MEL = {"granite_speech5_ctc": 4}
# Patch-grid models whose grid counts language-model tokens (spatial_merge_size squared patches each) and
# whose pixels come one channels-last block per token: Inkling 2.
TOKEN_GRIDS = {"inkling2"}
# Models whose image tokens each embed one patch as a short channels-last clip (temporal_patch_size
# frames), with no grid argument: Inkling.
PATCH_CLIPS = {"inkling_mm_model"}
# Text models that caption an image: their language-model loss skips the image positions, so it needs one.
CAPTIONERS = {"git"}
# Tiled models whose pixel_attention_mask marks the real tiles (batch, tiles), not each tile's pixels:
# Granite Docling.
TILE_MASKS = {"granite_docling"}
# Frames per clip for models that read images only as video (InstructBLIP-Video): two, so that a clip's
# image tokens (frames x 32 Q-Former queries) and the text fit the shrunk 128 positions.
FRAMES = 2


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _vocab(model) -> int:
    emb = model.get_output_embeddings()
    if emb is not None and hasattr(emb, "weight"):
        return emb.weight.shape[0]
    return getattr(model.config.get_text_config(), "vocab_size", 100)  # none in CANINE: ids are code points


def _ids(model, shape: tuple, g: torch.Generator) -> torch.Tensor:
    """Token ids from 3 up (past the usual pad, bos and eos), below the shrunk special ids at the top."""
    return torch.randint(3, min(_vocab(model), 100), shape, generator=g)


def _coded_audio_inputs(model, codebooks: int) -> dict:
    """Text-to-speech encoder-decoders that decode audio codes with a delay per codebook (Dia's
    `delay_pattern`, one entry per codebook): text ids into the encoder, a code per codebook at each
    decoder step (batch, steps, codebooks), and labels a row per codebook (batch * codebooks, steps)."""
    g = _generator()
    ids = _ids(model, (BATCH, SEQ), g)
    vocab = getattr(model.config.get_text_config(decoder=True), "vocab_size", 100)
    codes = torch.randint(3, min(vocab, 100), (BATCH, SEQ, codebooks), generator=g)
    labels = codes.transpose(1, 2).reshape(BATCH * codebooks, SEQ)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": codes, "labels": labels}


def text_inputs(model) -> dict:
    """Token ids that are also the labels (causal and masked LM; seq2seq decodes the same ids).
    Decoders with one embedding per audio codebook (MusicGen) take one row per codebook and labels
    codebook-last."""
    delays = getattr(model.config, "delay_pattern", None)
    if isinstance(delays, list) and model.config.is_encoder_decoder:
        return _coded_audio_inputs(model, len(delays))
    embeddings = model.get_input_embeddings()
    if isinstance(embeddings, torch.nn.ModuleList) and model.main_input_name == "input_ids":
        codebooks = len(embeddings)
        ids = _ids(model, (BATCH * codebooks, SEQ), _generator())
        labels = ids.view(BATCH, codebooks, SEQ).transpose(1, 2).contiguous()
        return {"input_ids": ids, "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long), "labels": labels}
    g = _generator()
    ids = _ids(model, (BATCH, SEQ), g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    if model.config.model_type in CAPTIONERS:
        batch["pixel_values"] = pixel_values(model.config, g)
    per_token = getattr(model.config, "audio_length_per_tok", None)
    if per_token:
        # Streaming speech models (Voxtral Realtime) add one audio embedding to each text position and
        # require the audio: `audio_length_per_tok` feature frames (mel bins first) per text token.
        enc = getattr(model.config, "audio_config", None) or model.config
        batch["input_features"] = torch.randn(BATCH, enc.num_mel_bins, SEQ * per_token, generator=g)
    return batch


def generation_prompt(model, batch: dict, new_tokens: int) -> dict:
    """The generate prompt: the batch without labels; the audio alone for codec-stream models
    (_codec_streams). Streaming speech models (`audio_length_per_tok`)
    generate one token per audio token the text has not reached, and no more: their text prompt stops
    `new_tokens` short of the audio."""
    prompt = {k: v.clone() for k, v in batch.items() if k != "labels"}
    if _codec_streams(model) and "input_values" in prompt:  # not CSM's causal LM: its batch is text
        return {"input_values": prompt["input_values"]}  # it makes the code streams from the audio itself
    if getattr(model.config, "audio_length_per_tok", None):
        for key in ("input_ids", "attention_mask"):
            prompt[key] = prompt[key][:, :-new_tokens]
    return prompt


def _num_labels(model) -> int:
    return model.config.num_labels


def _grid_boxes(grid: int, g: torch.Generator) -> torch.Tensor:
    """A box (x0, y0, x1, y1) per token on a grid of `grid` positions, x0 <= x1 and y0 <= y1."""
    corners = torch.randint(0, grid, (BATCH, SEQ, 2, 2), generator=g).sort(dim=-1).values  # (x or y, min/max)
    return corners.permute(0, 1, 3, 2).reshape(BATCH, SEQ, 4)


def _boxes(config, g: torch.Generator) -> torch.Tensor:
    """One layout box per token for document models (`bbox`): corners (x0, y0, x1, y1) with x0 <= x1 and
    y0 <= y1 on the config's 2-D position grid (LayoutLM, LiLT, LayoutLMv3 embed coordinates and sizes
    by index); Bros (`dim_bbox`: its box as 4 corner points, 8 values) takes them normalised to [0, 1]."""
    grid = min(getattr(config, "max_2d_position_embeddings", None) or 1000, 1000)
    box = _grid_boxes(grid, g)
    points = getattr(config, "dim_bbox", None)
    if points is None:
        return box
    x0, y0, x1, y1 = (box.float() / grid).unbind(-1)
    quad = torch.stack([x0, y0, x1, y0, x1, y1, x0, y1], dim=-1)  # clockwise from the top left
    return quad[..., :points]


def _layout(model, batch: dict, g: torch.Generator) -> dict:
    """Document models whose forward takes token boxes get one per token (Bros requires them)."""
    if "bbox" in inspect.signature(model.forward).parameters:
        batch["bbox"] = _boxes(model.config, g)
    return batch


def sequence_label_inputs(model) -> dict:
    """Rows end in eos where the config has one: encoder-decoder classifiers pool the eos position."""
    g = _generator()
    ids = _ids(model, (BATCH, SEQ), g)
    eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, int):
        ids[:, -1] = eos
    labels = torch.randint(0, _num_labels(model), (BATCH,), generator=g)
    return _layout(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}, g)


def token_label_inputs(model) -> dict:
    g = _generator()
    ids = _ids(model, (BATCH, SEQ), g)
    labels = torch.randint(0, _num_labels(model), (BATCH, SEQ), generator=g)
    return _layout(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}, g)


def _side(value) -> tuple[int, int]:
    if isinstance(value, dict):
        return value.get("height", value.get("shortest_edge")), value.get("width", value.get("shortest_edge"))
    if isinstance(value, (list, tuple)):
        return tuple(value[-2:]) if len(value) >= 2 else (value[0], value[0])
    return value, value


def pixel_values(config, g: torch.Generator) -> torch.Tensor:
    """Images of the config's size and channel count (its vision sub-config's where it has one)."""
    vision = getattr(config, "vision_config", None) or getattr(config, "backbone_config", None) or config
    size = next((getattr(c, k) for c in (vision, config) for k in ("image_size", "input_size", "img_size")
                 if getattr(c, k, None)), IMAGE)
    h, w = _side(size)
    channels = next((getattr(c, k) for c in (vision, config) for k in ("num_channels", "in_channels", "in_chans")
                     if isinstance(getattr(c, k, None), int)), 3)
    return torch.randn(BATCH, channels, h, w, generator=g)


def image_label_inputs(model) -> dict:
    """Pixels, or token ids for models that classify quantised images (ImageGPT)."""
    g = _generator()
    labels = torch.randint(0, _num_labels(model), (BATCH,), generator=g)
    if model.main_input_name == "input_ids":
        return {"input_ids": _ids(model, (BATCH, SEQ), g), "labels": labels}
    # Classifiers that take their pixels laid out as a vision-language tower does (SigLIP2's patch list,
    # `spatial_shapes`) get them as LAYOUTS makes them for the first such argument their forward takes.
    params = inspect.signature(model.forward).parameters
    key = next((k for k in LAYOUTS if k in params), None)
    if key is not None:
        vision = getattr(model.config, "vision_config", None) or model.config
        pixels, extra = LAYOUTS[key](model, vision, g)
        return {"pixel_values": pixels, **extra, "labels": labels}
    return {"pixel_values": pixel_values(model.config, g), "labels": labels}


AUDIO_INPUTS = ("input_values", "input_features")


def _audio_name(model) -> str:
    """The model's audio argument: its main input, or where that is generic (`inputs`: the speech
    encoder-decoder wrapper) or token ids (Pop2Piano, whose generate requires the audio), its encoder's
    main input or the audio argument its generate requires."""
    name = model.main_input_name
    if name in AUDIO_INPUTS:
        return name
    encoder = model.get_encoder() if hasattr(model, "get_encoder") else None
    if getattr(encoder, "main_input_name", None) in AUDIO_INPUTS:
        return encoder.main_input_name
    params = inspect.signature(model.generate).parameters
    return next((n for n in AUDIO_INPUTS if n in params and params[n].default is params[n].empty), name)


def _feature_width(config, enc) -> int:
    """Features per frame: the config's input width (times FEATURES_PER_MEL where the feature extractor
    widens each mel frame), or where it has none the encoder's width."""
    mels = getattr(enc, "num_mel_bins", None)
    if mels and config.model_type in FEATURES_PER_MEL:
        return mels * FEATURES_PER_MEL[config.model_type]
    width = getattr(enc, "feature_projection_input_dim", None) or mels or getattr(enc, "feature_size", None)
    if width or hasattr(enc, "input_feat_per_channel"):
        return width or enc.input_feat_per_channel * getattr(enc, "input_channels", 1)
    # No input width at all: the features enter as the encoder's embeddings (Pop2Piano's spectrogram).
    return next((getattr(enc, k) for k in ("d_model", "hidden_size") if isinstance(getattr(enc, k, None), int)), 80)


def audio(model, g: torch.Generator) -> dict:
    """The model's audio input (see _audio_name): a raw waveform (`input_values`) or features
    (`input_features`). Whisper-style encoders (a fixed `max_source_positions` over mel bins) take mel
    bins first and exactly twice that many frames; the others take frames first, one row of features
    each (_feature_width), and a frame mask (Parakeet sums it for the output lengths)."""
    config = model.config
    name = _audio_name(model)
    if name == "input_values":
        return {name: torch.randn(BATCH, AUDIO_SAMPLES, generator=g)}
    enc = getattr(config, "encoder_config", None) or getattr(config, "audio_config", None) or config
    positions = getattr(enc, "max_source_positions", None)
    mels = getattr(enc, "num_mel_bins", None)
    if positions and mels:
        return {name: torch.randn(BATCH, mels, 2 * positions, generator=g)}
    width = _feature_width(config, enc)
    features = torch.randn(BATCH, AUDIO_FRAMES, width, generator=g)
    return {name: features, "attention_mask": torch.ones(BATCH, AUDIO_FRAMES, dtype=torch.long)}


def ctc_inputs(model) -> dict:
    g = _generator()
    batch = audio(model, g)
    batch["labels"] = torch.randint(1, _vocab(model), (BATCH, CTC_LABELS), generator=g)
    return batch


def _codec_streams(model) -> bool:
    """Speech-text models whose token ids carry an audio codec's codes beside each text token (Kyutai
    speech-to-text: a `codec_config` and `num_codebooks` code streams), which generate makes from audio."""
    config = model.config
    return (getattr(config, "codec_config", None) is not None and isinstance(getattr(config, "num_codebooks", None), int)
            and isinstance(getattr(config, "codebook_vocab_size", None), int))


def _codec_stream_inputs(model) -> dict:
    """Ids (batch, steps, 1 + codebooks): a text id then a code per codebook each step; text labels; and
    the waveform generate encodes with the codec, one codec frame per step (the forward ignores it)."""
    config, g = model.config, _generator()
    text = _ids(model, (BATCH, SEQ, 1), g)
    codes = torch.randint(0, min(config.codebook_vocab_size, 100), (BATCH, SEQ, config.num_codebooks), generator=g)
    samples = SEQ * config.codec_config.frame_size
    return {"input_ids": torch.cat([text, codes], dim=-1), "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
            "labels": text[..., 0].clone(), "input_values": torch.randn(BATCH, 1, samples, generator=g)}


def speech_seq2seq_inputs(model) -> dict:
    """Audio and decoder labels. Audio language models whose main input is token ids (Voxtral,
    Granite Speech) take audio only behind audio tokens; they run on text alone here."""
    if _codec_streams(model):
        return _codec_stream_inputs(model)
    if _audio_name(model) not in AUDIO_INPUTS:
        return text_inputs(model)
    g = _generator()
    batch = audio(model, g)
    batch["labels"] = _ids(model, (BATCH, SEQ), g)
    return batch


def _image_token_count(features) -> int:
    """Rows of image features per image, whatever container get_image_features returns: its pooler
    output, or where that is unset its last hidden state (Llama 4 projects that row by row)."""
    if hasattr(features, "pooler_output"):
        pooled = features.pooler_output
        features = pooled if pooled is not None else features.last_hidden_state
    parts = list(features) if isinstance(features, (list, tuple)) else [features]
    rows = sum(p.numel() // p.shape[-1] for p in parts)
    return rows // BATCH


def _patch_size(vision) -> int:
    return vision.patch_size if isinstance(vision.patch_size, int) else vision.patch_size[0]


def _channels(vision) -> int:
    return getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)


def _first_size(vision, keys: tuple) -> int:
    """The first of `keys` the vision config sets, as one int (the first of a per-axis pair); 1 if none."""
    value = next((getattr(vision, k) for k in keys if getattr(vision, k, None)), 1)
    return value if isinstance(value, int) else value[0]


def _patch_grid(config, vision, g: torch.Generator, key: str = "image_grid_thw") -> tuple[torch.Tensor, dict]:
    """Qwen2-VL-style inputs: each image a 2x2 grid of merged patches, pixels flattened per patch (or
    one small image per patch, PATCH_IMAGES), and its grid as (frames, height, width), or (height,
    width) where the argument is `image_grid_hw`."""
    patch = _patch_size(vision)
    merge = _first_size(vision, ("spatial_merge_size", "merge_size", "merge_kernel_size"))
    temporal = _first_size(vision, ("temporal_patch_size", "patch_temporal"))
    side = 2 * merge
    if config.model_type in TOKEN_GRIDS:  # a 2 x 2 grid of tokens, each merge x merge patches of pixels
        pixels = torch.randn(BATCH * 4, merge * patch, merge * patch, _channels(vision), generator=g)
        return pixels, {key: torch.tensor([[1, 2, 2] if key == "image_grid_thw" else [2, 2]] * BATCH)}
    pixels = torch.randn(BATCH * side * side, _channels(vision) * temporal * patch * patch, generator=g)
    if config.model_type in PATCH_IMAGES:
        pixels = pixels.view(len(pixels), -1, patch, patch)
    grid = [1, side, side] if key == "image_grid_thw" else [side, side]
    return pixels, {key: torch.tensor([grid] * BATCH)}


def _patch_list(vision, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    """SigLIP2-style (NaFlex) inputs: each image a row of flattened patches, its patch grid's shape, and
    a mask over the row (no padding: every image is the full square)."""
    patch = _patch_size(vision)
    side = _side(getattr(vision, "image_size", IMAGE))[0] // patch
    pixels = torch.randn(BATCH, side * side, _channels(vision) * patch * patch, generator=g)
    return pixels, {"spatial_shapes": torch.tensor([[side, side]] * BATCH),
                    "pixel_attention_mask": torch.ones(BATCH, side * side, dtype=torch.long)}


def _tiles(config, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    """Idefics2-style inputs: a list of tiles per row (one tile each here) and a mask over each tile's
    pixels (none padded)."""
    pixels = pixel_values(config, g).unsqueeze(1)
    mask = (BATCH, 1) if config.model_type in TILE_MASKS else (BATCH, 1, *pixels.shape[-2:])
    return pixels, {"pixel_attention_mask": torch.ones(mask, dtype=torch.bool)}


def _packed_patches(vision, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    """MiniCPM-V-style inputs: every image's patches side by side in one strip of patch-high pixels,
    and each image's grid in patches (4 x 4: its window attention and two 2 x 2 merges divide it)."""
    patch, side = _patch_size(vision), 4
    pixels = torch.randn(1, _channels(vision), patch, BATCH * side * side * patch, generator=g)
    return pixels, {"target_sizes": torch.tensor([[side, side]] * BATCH)}


def _anyres_tiles(model, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    """LLaVA-NeXT-style inputs: each image as the tiles its size maps to on the config's grid of
    resolutions plus the whole image, at the vision tower's size. The tile count comes from the
    model's own module (the function its get_image_features splits the tiles with)."""
    image = pixel_values(model.config, g)
    sizes = torch.tensor([list(image.shape[-2:])] * BATCH)
    count = sys.modules[type(model).__module__].image_size_to_num_patches
    tiles = count(sizes[0], model.config.image_grid_pinpoints, image.shape[-1])
    pixels = torch.randn(BATCH, tiles, *image.shape[1:], generator=g)
    return pixels, {"image_sizes": sizes}


def _flat_patches(config, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    """Fuyu-style inputs: each image as its patches, every patch's pixels flattened into one row (the
    model embeds them with a linear layer, no vision tower)."""
    side = _side(getattr(config, "image_size", IMAGE))[0] // config.patch_size
    width = config.num_channels * config.patch_size ** 2
    return torch.randn(BATCH, side * side, width, generator=g), {}


def _patch_clips(vision, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    """Inkling-style inputs: 4 patches per image, each a clip of temporal_patch_size frames, channels last."""
    patch = _patch_size(vision)
    frames = _first_size(vision, ("temporal_patch_size",))
    return torch.randn(BATCH * 4, frames, patch, patch, _channels(vision), generator=g), {}


def _pooled_crops(vision, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    """Molmo2-style inputs: each image one crop of flattened patches; each image token pools a 2 x 2 block of
    patches, given by their indices among all crops' patches; and each image's token grid as (low-res rows,
    columns, high-res rows, columns), with no high-res part here."""
    patch = _patch_size(vision)
    side = _side(getattr(vision, "image_size", IMAGE))[0] // patch
    pixels = torch.randn(BATCH, side * side, _channels(vision) * patch * patch, generator=g)
    half = side // 2
    rows, cols = torch.meshgrid(torch.arange(half), torch.arange(half), indexing="ij")
    corners = (2 * rows * side + 2 * cols).flatten()
    block = corners[:, None] + torch.tensor([0, 1, side, side + 1])
    pooling = torch.cat([block + i * side * side for i in range(BATCH)])
    return pixels, {"image_token_pooling": pooling, "image_grids": torch.tensor([[half, half, 0, 0]] * BATCH)}


# How get_image_features wants its pixels, keyed by the argument or config field that tells (the first
# one the model has wins); models with none of these get plain images of the config's size.
LAYOUTS: dict[str, Callable] = {
    "image_grid_thw": lambda model, vision, g: _patch_grid(model.config, vision, g),
    "image_grid_hw": lambda model, vision, g: _patch_grid(model.config, vision, g, "image_grid_hw"),
    "spatial_shapes": lambda model, vision, g: _patch_list(vision, g),
    "image_token_pooling": lambda model, vision, g: _pooled_crops(vision, g),
    "target_sizes": lambda model, vision, g: _packed_patches(vision, g),
    "image_grid_pinpoints": lambda model, vision, g: _anyres_tiles(model, g),
    "pixel_attention_mask": lambda model, vision, g: _tiles(model.config, g),
    # Fuyu's forward still takes its patches under their older name (its get_image_features names none).
    "image_patches": lambda model, vision, g: _flat_patches(model.config, g),
}
# LAYOUTS keys looked up in the forward's arguments too, where get_image_features names only pixel_values.
_FORWARD_LAYOUTS = {"image_patches"}

# Further inputs get_image_features asks for, keyed by argument name: each made from the pixels, the
# vision config and the generator.
EXTRAS: dict[str, Callable] = {
    "image_sizes": lambda pixels, vision, g: torch.tensor([list(pixels.shape[-2:])] * BATCH),
    "image_merge_sizes": lambda pixels, vision, g: torch.full((BATCH,), getattr(vision, "spatial_merge_size", 1)),
    # InstructBLIP's Q-Former reads the instruction too: a few ids from its own small vocabulary.
    "qformer_input_ids": lambda pixels, vision, g: torch.randint(3, 100, (BATCH, SEQ), generator=g),
    # DeepSeek-VL hybrid: the same images again for its high-resolution tower, at that tower's size.
    "high_res_pixel_values": lambda pixels, vision, g: pixel_values(vision.high_res_vision_config, g)
    if hasattr(vision, "high_res_vision_config") else pixels,
    # UDOP lays text out on the page: one normalised (x0, y0, x1, y1) box per text token.
    "bbox": lambda pixels, vision, g: _grid_boxes(1000, g).float() / 1000,
}


def _vision_api(model, method: str = "get_image_features"):
    """The module with the model's get_image_features (or `method`): the model itself, or its base model
    (DeepSeek-VL, Janus and Fuyu define it only there); None for models that take no image tokens."""
    for module in (model, getattr(model, "model", None)):
        if hasattr(module, method):
            return module
    return None


def _image_params(model, method: str = "get_image_features") -> set[str]:
    """The arguments of the model's get_image_features, and those its base model's requires: wrappers
    pass on **kwargs, so the inner one (Video-LLaMA 3's) may ask for more. Not the inner one's optional
    ones, nor the forward's: LLaVA's take image_sizes only for other vision towers than the one it has."""
    api = _vision_api(model, method)
    params = set(inspect.signature(getattr(api, method)).parameters)
    inner = getattr(api, "model", None)
    if hasattr(inner, method):
        params |= {n for n, p in inspect.signature(getattr(inner, method)).parameters.items()
                   if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD}
    return params


def vision_inputs(model, g: torch.Generator, method: str = "get_image_features") -> dict:
    """Pixels laid out as get_image_features asks (grids, patch lists, tiles) plus its further inputs;
    clips of FRAMES frames for get_video_features."""
    params = _image_params(model, method)
    params |= _FORWARD_LAYOUTS & set(inspect.signature(model.forward).parameters)
    vision = getattr(model.config, "vision_config", None) or model.config
    layout = next((LAYOUTS[k] for k in LAYOUTS if k in params or getattr(model.config, k, None)), None)
    if model.config.model_type in PATCH_CLIPS:
        layout = lambda model, vision, g: _patch_clips(vision, g)
    pixels, extra = layout(model, vision, g) if layout else (pixel_values(model.config, g), {})
    if method == "get_video_features":
        pixels = torch.randn(BATCH, FRAMES, *pixels.shape[1:], generator=g)
    extra.update({k: make(pixels, vision, g) for k, make in EXTRAS.items() if k in params and k not in extra})
    return {"pixel_values": pixels, **extra}


def _image_token(config):
    token = getattr(config, "image_token_id", None)
    return token if token is not None else getattr(config, "image_token_index", None)


def _video_token(config):
    token = getattr(config, "video_token_id", None)
    return token if token is not None else getattr(config, "video_token_index", None)


# Arguments that place image features by a mask over the text positions instead of an image token, and
# the config field that counts the rows (Kosmos-2 and Kosmos-2.5: their resamplers' latent queries; they
# have no get_image_features to count them with).
POSITION_MASKS = {"image_embeds_position_mask": "latent_query_num"}


@torch.no_grad()
def image_text_inputs(model) -> dict:
    """Images plus text that starts with one image token per image feature row: the count comes from
    running the model's own vision path once, so no per-model token arithmetic. Models that read images
    only as video (InstructBLIP-Video: get_video_features and a video token) get clips behind video tokens;
    models that place the features by a position mask (POSITION_MASKS) get the mask over those rows.
    Models with no image token (BLIP, GIT, vision encoder-decoders) take the images whole and caption
    them: text labels."""
    config = model.config
    token, method = _image_token(config), "get_image_features"
    if _vision_api(model) is None and _video_token(config) is not None and _vision_api(model, "get_video_features"):
        token, method = _video_token(config), "get_video_features"
    forward = inspect.signature(model.forward).parameters
    position_mask = next((k for k in POSITION_MASKS if k in forward), None)
    if position_mask is not None and token is None:  # the image input as captioners take it (IMAGE_INPUTS)
        g = _generator()
        key = next(k for k in IMAGE_INPUTS if k in forward)
        vision = {key: IMAGE_INPUTS[key](config, getattr(config, "vision_config", None) or config, g)}
        n = getattr(config, POSITION_MASKS[position_mask])
    elif token is None or _vision_api(model, method) is None:
        return _caption_inputs(model)
    else:
        g = _generator()
        vision = vision_inputs(model, g, method)
        n = _image_token_count(getattr(_vision_api(model, method), method)(**vision))
    text = _ids(model, (BATCH, SEQ), g)
    if token is not None:
        text[text == token] += 1  # Mistral 3's image token (10) is among the text ids: no stray image tokens
    image = torch.full((BATCH, n), token) if token is not None else _ids(model, (BATCH, n), g)
    ids = torch.cat([image, text], dim=1)
    labels = torch.cat([torch.full((BATCH, n), -100), text], dim=1)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **vision, "labels": labels}
    if position_mask is not None:
        batch[position_mask] = torch.arange(ids.shape[1]).expand(BATCH, -1) < n
    if "mm_token_type_ids" in forward:
        batch["mm_token_type_ids"] = (ids == token).long()  # Qwen2-VL's M-RoPE: 1 marks image tokens
    return batch


def _flattened_patches(vision, g: torch.Generator) -> torch.Tensor:
    """Pix2Struct-style images: a row of flattened patches per image, each led by its (row, column)."""
    width = vision.patch_embed_hidden_size
    side = int(min(getattr(vision, "seq_len", 16), 16) ** 0.5)
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    where = torch.stack([rows.flatten(), cols.flatten()], dim=-1).float().expand(BATCH, -1, -1)
    return torch.cat([where, torch.randn(BATCH, side * side, width, generator=g)], dim=-1)


def _tile_cross_attention(config, pixels: torch.Tensor, g: torch.Generator) -> dict:
    """Mllama: each row one image of max_num_tiles tiles, the first real (aspect ratio id 1 is 1 x 1), and
    every text token attending to that tile."""
    tiles = config.vision_config.max_num_tiles
    real = torch.arange(tiles) < 1
    return {"pixel_values": torch.randn(BATCH, 1, tiles, *pixels.shape[1:], generator=g),
            "aspect_ratio_ids": torch.ones(BATCH, 1, dtype=torch.long),
            "aspect_ratio_mask": real.long().expand(BATCH, 1, tiles).clone(),
            "cross_attention_mask": real.long().expand(BATCH, SEQ, 1, tiles).clone()}


# Models that read their images through cross-attention from the text (no image tokens), keyed by the
# forward's argument that says which text positions see which images: a list of one image per row.
CROSS_ATTENTION: dict[str, Callable] = {
    "cross_attention_mask": _tile_cross_attention,
    # IDEFICS: images (batch, images, channels, height, width), a text x images mask.
    "image_attention_mask": lambda config, pixels, g: {
        "pixel_values": pixels.unsqueeze(1), "image_attention_mask": torch.ones(BATCH, SEQ, 1, dtype=torch.long)},
}


# The image input of captioning models, keyed by its argument name (the first the forward takes wins).
IMAGE_INPUTS: dict[str, Callable] = {
    "pixel_values": lambda config, vision, g: pixel_values(config, g),
    "flattened_patches": lambda config, vision, g: _flattened_patches(vision, g),
}


def _caption_inputs(model) -> dict:
    """Images and the text that describes them: token ids that are also the labels (decoder labels in
    encoder-decoders, whose main input is the image). Models that take no image input listed in
    IMAGE_INPUTS (Mistral 4's text-only causal LM) run on text alone."""
    g = _generator()
    ids = _ids(model, (BATCH, SEQ), g)
    vision = getattr(model.config, "vision_config", None) or model.config
    params = inspect.signature(model.forward).parameters
    key = next((k for k in IMAGE_INPUTS if k in params), None)
    pixels = IMAGE_INPUTS[key](model.config, vision, g) if key else None
    batch = {key: pixels, "labels": ids.clone()} if key else {"labels": ids.clone()}
    if "input_ids" in params:
        batch.update(input_ids=ids, attention_mask=torch.ones_like(ids))
    batch.update({k: make(pixels, vision, g) for k, make in EXTRAS.items() if k in params})
    cross = next((k for k in CROSS_ATTENTION if k in params), None)
    if cross is not None and pixels is not None:
        batch.update(CROSS_ATTENTION[cross](model.config, pixels, g))
    return batch


def decoder_start(config) -> None:
    """Encoder-decoder models start decoding from decoder_start_token_id and pad the shifted labels
    with pad_token_id; some default configs (T5's, EncoderDecoder's) leave them unset."""
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = 0
    if getattr(config, "decoder_start_token_id", None) is None:
        pad = getattr(config, "pad_token_id", None)
        config.decoder_start_token_id = pad if pad is not None else 0


def classifier_config(config) -> None:
    """Sequence classification on decoder models finds each row's last token by the pad id; batches
    over one need it set (0 never appears in the sweep's ids). Encoder-decoder ones decode too."""
    for c in {id(c): c for c in (config, config.get_text_config())}.values():
        if getattr(c, "pad_token_id", None) is None:
            c.pad_token_id = 0
    decoder_start(config)


def image_text_config(config) -> None:
    """Configs that leave the image token unset (BLIP-2, InstructBLIP, Nemotron-H Omni: their checkpoints
    set it) get one inside the small vocabulary, as do video-only ones their video token (InstructBLIP-Video);
    encoder-decoders get their decoder's start (UDOP)."""
    image = next((k for k in ("image_token_id", "image_token_index") if hasattr(config, k)), None)
    video = next((k for k in ("video_token_id", "video_token_index") if hasattr(config, k)), None)
    key, token = (image, _image_token(config)) if image else (video, _video_token(config) if video else None)
    if key is not None and token is None:
        setattr(config, key, IMAGE_TOKEN)
    if getattr(config, "is_encoder_decoder", False):
        decoder_start(config)


@dataclass(frozen=True)
class Task:
    name: str
    title: str  # the name in report titles
    mapping: str  # in transformers.models.auto.modeling_auto
    auto_class: str  # in transformers
    inputs: Callable[[torch.nn.Module], dict]  # a CPU batch with labels, so the output has a loss
    generates: bool = False
    configure: Callable[[object], None] | None = None  # adjusts the shrunk config before building
    overrides: dict[str, dict] = field(default_factory=dict)  # per model type, over shrink's OVERRIDES

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this task runs (generate only where the task generates)."""
        return tuple(s for s in STAGES if s not in self.skipped)

    @property
    def skipped(self) -> tuple[str, ...]:
        return () if self.generates else ("generate",)

    def architectures(self) -> list[str]:
        from transformers.models.auto import modeling_auto
        return sorted(getattr(modeling_auto, self.mapping))


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("causal-lm", "causal-LM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM",
         text_inputs, generates=True),
    Task("seq2seq-lm", "seq2seq-LM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM",
         text_inputs, generates=True, configure=decoder_start),
    Task("masked-lm", "masked-LM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM", text_inputs,
         overrides={"reformer": {"is_decoder": False}}),
    Task("sequence-classification", "sequence-classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
         "AutoModelForSequenceClassification", sequence_label_inputs, configure=classifier_config),
    Task("token-classification", "token-classification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
         "AutoModelForTokenClassification", token_label_inputs),
    Task("image-classification", "image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
         "AutoModelForImageClassification", image_label_inputs),
    Task("ctc", "speech CTC", "MODEL_FOR_CTC_MAPPING_NAMES", "AutoModelForCTC", ctc_inputs),
    Task("speech-seq2seq", "speech seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "AutoModelForSpeechSeq2Seq",
         speech_seq2seq_inputs, generates=True, configure=decoder_start),
    Task("image-text-to-text", "image-text-to-text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
         "AutoModelForImageTextToText", image_text_inputs, generates=True, configure=image_text_config),
)}
