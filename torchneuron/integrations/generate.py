"""Hugging Face `generate` on neuron: decode steps at one size per bucket, each replayed as one graph.

With transformers' default (dynamic) cache every decode step meets a new sequence length, so eager
dispatch of the whole forward (a hundred ops a token for the smallest Llama) is paid per token. When
the caller chose no cache, `generate` on neuron runs with a static cache whose length is the
generation's bucket (`lowering.padding.bucket`, the size rule eager and compiled buckets use): every
decode step of a (batch, bucket) has the same shapes. transformers already decodes a compileable
cache through `get_compiled_call` on neuron; here that call is `torchneuron.capture` of the model's
call instead of `torch.compile`: recorded on a signature's first step (the prefill has run the
model: what it makes lazily exists), replayed as one executable call after, with no Dynamo tracing
in a fresh process. The tokens are the dynamic cache's (the
padded positions are masked); `TORCHNEURON_GENERATE_GRAPHS=0` keeps transformers' default.

Left alone (transformers' own path): a cache or `cache_implementation` the caller chose, a cache
returned to the caller (`return_dict_in_generate`), modes other than greedy search and sampling,
encoder-decoder and recurrent models, models transformers does not mark compileable, attention
implementations other than "sdpa" and "eager" (a registered kernel may not read the mask), quantized
models and models placed over several devices (`hf_device_map`), and models
whose static cache has layers other than plain `StaticLayer` (sliding windows keep Python state a
replay would not advance). The held cache is allocated before the first prefill, as transformers
allocates its chunked prefill's, so the first call and the later ones take the same paths and run
the same programs. A replay assumes what the recording read stays where it was: the held
caches and their graphs are keyed by the model's parameter and buffer storages, dtype, training
flag and attention implementation, so moving or reloading the model records anew (and drops what
it held for the storages it left).
"""
from __future__ import annotations

import collections
import functools
import weakref

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .. import config, graphs
from ..lowering import padding

HELD = 4  # static caches (with their recorded steps) a model keeps: one per batch size and bucket
_MODES = ("greedy_search", "sample")
# attention implementations that read the mask (a registered kernel may assume keys end at the query)
_ATTENTION = ("sdpa", "eager")
_STATE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _State


class _State:
    def __init__(self):
        self.held: collections.OrderedDict = collections.OrderedDict()  # key -> (cache, recorded step)
        self.step = None  # the recorded step of the cache the current generate call uses (None: ours unused)


def _eligible(model, generation_config, model_kwargs, generation_mode) -> bool:
    return (config.GENERATE_GRAPHS and model.device.type == "neuron"
            and generation_config.cache_implementation is None and generation_config.use_cache is not False
            and model_kwargs.get("past_key_values") is None and not generation_config.return_dict_in_generate
            and not getattr(generation_config, "disable_compile", False)
            and getattr(generation_config, "prefill_chunk_size", None) is None
            and str(getattr(generation_mode, "value", generation_mode)) in _MODES
            and getattr(model.config, "_attn_implementation", None) in _ATTENTION
            and getattr(model, "hf_quantizer", None) is None
            and len(set(getattr(model, "hf_device_map", {"": None}).values())) <= 1
            and not model.config.is_encoder_decoder and getattr(model, "_can_compile_fullgraph", False)
            and model._supports_default_dynamic_cache())


def _weights(model) -> tuple:
    """What a recorded step depends on besides its arguments and its cache."""
    storages = tuple(t.untyped_storage().data_ptr() for p in (*model.parameters(), *model.buffers())
                     for t in _plain_tensors(p))
    return (storages, model.dtype, model.training, getattr(model.config, "_attn_implementation", None))


def _plain_tensors(t) -> list:
    """`t`, or the plain tensors a tensor subclass holds (torchao's quantized weights: the wrapper
    has no storage of its own)."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    return [inner for name in t.__tensor_flatten__()[0] for inner in _plain_tensors(getattr(t, name))]


def _held_cache(model, generation_config, batch_size: int, max_cache_length: int):
    """(cache, recorded step) for this call, reset, or None where a static cache cannot stand in."""
    from transformers.cache_utils import StaticCache, StaticLayer

    text_config = model.config.get_text_config(decoder=True)
    length = padding.bucket(max_cache_length)
    limit = getattr(text_config, "max_position_embeddings", None)
    if limit:
        length = max(max_cache_length, min(length, limit))
    batch = max(generation_config.num_beams or 1, generation_config.num_return_sequences or 1) * batch_size
    state = _STATE.setdefault(model, _State())
    weights = _weights(model)
    for stale in [k for k in state.held if k[2] != weights]:  # (recorded on storages the model left)
        del state.held[stale]
    key = (batch, length, weights)
    entry = state.held.pop(key, None)
    if entry is None:
        cache = StaticCache(config=text_config, max_cache_len=length)
        if not all(type(layer) is StaticLayer for layer in cache.layers):
            return None
        if _initialize_early(model, cache, batch):
            # its zeros computed now: the reset below records as it does in every later call
            torch.neuron.synchronize(model.device)
        entry = (cache, _Step(weakref.ref(model)))  # (the held step must not keep the model alive)
    entry[0].reset()
    state.held[key] = entry
    while len(state.held) > HELD:
        state.held.popitem(last=False)
    return entry


def _initialize_early(model, cache, batch: int) -> bool:
    """Allocate the cache's layers now, with the shapes transformers gives its chunked prefill's
    cache (whether it did). A cache filled lazily by the first call's prefill takes other code paths
    in that call (its length is a Python 0, not the layers' tensor) than in the calls that reuse it,
    and each path compiles its own programs. Those shapes come from the config, which can mislead
    (Falcon's multi-query attention): each layer checks them at its first update."""
    shape = getattr(model, "_get_static_cache_init_shape", None)
    shape = shape() if shape is not None else None
    if shape is None:
        return False
    num_heads, head_dim = shape
    cache.early_initialization(batch_size=batch, num_heads=num_heads, head_dim=head_dim, dtype=model.dtype,
                               device=model.device)
    checked = _checked_layer_class(type(cache.layers[0]))
    for layer in cache.layers:
        layer.__class__ = checked
        layer.unchecked = True
    return True


@functools.cache
def _checked_layer_class(static_layer):
    class CheckedStaticLayer(static_layer):
        """A StaticLayer allocated early that checks, at its first update, the allocation against
        the keys and values the model gives it, and allocates again from them (as transformers
        would lazily) where they differ: another head count or size, or a dtype (autocast)."""

        def update(self, key_states, value_states, *args, **kwargs):
            if self.unchecked:
                self.unchecked = False
                keys, values = self.keys, self.values
                if (keys.shape[:2] != key_states.shape[:2] or keys.shape[-1] != key_states.shape[-1]
                        or values.shape[-1] != value_states.shape[-1] or keys.dtype != key_states.dtype
                        or values.dtype != value_states.dtype or keys.device != key_states.device):
                    self.is_initialized = False
            return super().update(key_states, value_states, *args, **kwargs)

    return CheckedStaticLayer


class _Step:
    """The model's call, recorded once per argument signature and replayed after; a model whose
    forward needs a device value mid-step (a data-dependent op, `item()`, a CPU fallback) cannot be
    recorded: its steps run eagerly from then on, as they would with transformers' own cache."""

    def __init__(self, model_ref):
        self.model_ref = model_ref
        self.recorded = graphs.capture(self.eager, warmup=0)
        self.refused = None  # why recording failed (the steps run eagerly)

    def eager(self, *args, **kwargs):
        return self.model_ref()(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        if self.refused is None:
            try:
                return self.recorded(*args, **kwargs)
            except graphs.CaptureError as e:  # (the recording was dropped unrun: the step has not happened)
                self.refused = str(e)
        return self.eager(*args, **kwargs)


def _prepare_cache(original):
    @functools.wraps(original)
    def prepare(self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length):
        entry = None
        if _eligible(self, generation_config, model_kwargs, generation_mode):
            entry = _held_cache(self, generation_config, batch_size, max_cache_length)
        if entry is None:
            if self in _STATE:
                _STATE[self].step = None
            return original(self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length)
        model_kwargs["past_key_values"], _STATE[self].step = entry
        return None

    prepare.torchneuron_wraps = original
    return prepare


def _compiled_call(original):
    @functools.wraps(original)
    def get_compiled_call(self, compile_config):
        state = _STATE.get(self)
        if state is not None and state.step is not None and compile_config is None:
            return state.step
        return original(self, compile_config)

    get_compiled_call.torchneuron_wraps = original
    return get_compiled_call


def _wrap(cls, name: str, wrapper) -> None:
    method = cls.__dict__.get(name)
    if method is not None and not hasattr(method, "torchneuron_wraps"):
        setattr(cls, name, wrapper(method))


def on_generation_utils(module) -> None:
    """(transformers.generation.utils has run) generate picks our static cache where it may."""
    _wrap(module.GenerationMixin, "_prepare_cache_for_generation", _prepare_cache)


def on_modeling_utils(module) -> None:
    """(transformers.modeling_utils has run) the decode call of our cache is its recorded step."""
    _wrap(module.PreTrainedModel, "get_compiled_call", _compiled_call)
