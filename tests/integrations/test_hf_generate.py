"""Hugging Face generate on neuron with no cache chosen: 64 greedy tokens equal to CPU's (whose
default dynamic cache meets a new sequence length every step), and memory bounded by the executable
cache (issue 14). On neuron the decode steps run at a static cache's bucketed length, each replayed
as one recorded graph (torchneuron/integrations/generate.py); with that off
(TORCHNEURON_GENERATE_GRAPHS=0), eager bucketing keeps the compiles per op to one per bucket of the
growing length."""
from __future__ import annotations

import pytest
import torch

import torchneuron
from torchneuron.integrations import generate

transformers = pytest.importorskip("transformers")


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        return transformers.LlamaForCausalLM(config).eval()
    config = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("replayed", [True, False], ids=["static-graphs", "dynamic-cache"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_generate_64_tokens_with_the_default_cache_equals_cpu(kind, replayed, monkeypatch):
    monkeypatch.setattr(torchneuron.config, "EAGER_BUCKETS", True)  # (whatever TORCHNEURON_EAGER_BUCKETS says)
    monkeypatch.setattr(generate.config, "GENERATE_GRAPHS", replayed)
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


@pytest.fixture
def graphs(monkeypatch):
    monkeypatch.setattr(generate.config, "GENERATE_GRAPHS", True)  # (whatever TORCHNEURON_GENERATE_GRAPHS says)


def _steps(model) -> list:
    """The recorded decode steps the model holds (torchneuron.integrations.generate)."""
    state = generate._STATE.get(model)
    return [step.recorded for _, step in state.held.values()] if state is not None else []


def _generate(model, prompt, **settings):
    with torch.no_grad():
        out = model.generate(prompt.to(model.device), do_sample=False, pad_token_id=0, **settings)
    return out.cpu() if isinstance(out, torch.Tensor) else out


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_generate_decodes_each_bucket_as_one_replayed_graph(kind, graphs):
    """With no cache chosen, generate on neuron decodes with a static cache of the bucketed length
    and replays each decode step as one recorded graph: the tokens are the dynamic cache's on CPU,
    a later call whose length falls in the same bucket replays the same graph, and a longer one
    records one graph more."""
    model = _model(kind)
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(2))
    expected = {n: _generate(model, prompt, max_new_tokens=n, min_new_tokens=n) for n in (64, 100, 140)}
    model = model.to("neuron")
    assert _generate(model, prompt, max_new_tokens=64, min_new_tokens=64).equal(expected[64])
    (step,) = _steps(model)
    # 63 decode steps: the first records (and runs), the rest replay
    assert (step.recordings, step.replays) == (1, 62)
    assert _generate(model, prompt, max_new_tokens=100, min_new_tokens=100).equal(expected[100])  # 106: bucket 128
    assert (step.recordings, step.replays) == (1, 62 + 99)
    assert _generate(model, prompt, max_new_tokens=140, min_new_tokens=140).equal(expected[140])  # 146: 256
    assert len(_steps(model)) == 2 and sum(s.recordings for s in _steps(model)) == 2


def test_generate_replays_read_the_weights_a_later_load_writes(graphs):
    """The recorded step reads the parameters' storages: weights loaded in place later give the new
    model's tokens; a model moved away and back (new storages) records anew, and drops what it held
    for the old storages."""
    model, other = _model("llama"), _model("llama")
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(4))
    expected = _generate(model, prompt, max_new_tokens=20, min_new_tokens=20)
    expected_other = _generate(other, prompt, max_new_tokens=20, min_new_tokens=20)
    model = model.to("neuron")
    assert _generate(model, prompt, max_new_tokens=20, min_new_tokens=20).equal(expected)
    model.load_state_dict(other.state_dict())
    assert _generate(model, prompt, max_new_tokens=20, min_new_tokens=20).equal(expected_other)
    assert [s.recordings for s in _steps(model)] == [1]
    first = _steps(model)[0]
    model = model.to("cpu").to("neuron")
    assert _generate(model, prompt, max_new_tokens=20, min_new_tokens=20).equal(expected_other)
    (again,) = _steps(model)  # (the cache and graph on the old storages are dropped)
    assert again is not first and again.recordings == 1


def test_sampling_draws_the_same_tokens_as_the_dynamic_cache(monkeypatch):
    """Sampling draws its random numbers outside the recorded step, so a seeded run gives the tokens
    of the same seeded run with transformers' dynamic cache (TORCHNEURON_GENERATE_GRAPHS=0)."""
    model = _model("llama").to("neuron")
    prompt = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(5))
    runs = []
    for graphs in (False, True):
        monkeypatch.setattr(generate.config, "GENERATE_GRAPHS", graphs)
        torch.manual_seed(7)
        with torch.no_grad():
            runs.append(model.generate(prompt.to("neuron"), do_sample=True, top_k=20, max_new_tokens=24,
                                       min_new_tokens=24, pad_token_id=0).cpu())
    assert runs[0].equal(runs[1])
    assert [s.replays for s in _steps(model)] == [22]


@pytest.mark.parametrize("setting", [
    {"cache_implementation": "dynamic"},
    {"return_dict_in_generate": True},
    {"num_beams": 2},
])
def test_generate_keeps_transformers_cache_where_the_caller_chose_or_takes_it(setting):
    model = _model("llama")
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(6))
    expected = _generate(model, prompt, max_new_tokens=8, min_new_tokens=8, **setting)
    model = model.to("neuron")
    got = _generate(model, prompt, max_new_tokens=8, min_new_tokens=8, **setting)
    if setting.get("return_dict_in_generate"):
        assert isinstance(got.past_key_values, transformers.DynamicCache)
        got, expected = got.sequences.cpu(), expected.sequences
    assert got.equal(expected)
    assert _steps(model) == []


def test_a_forward_that_reads_a_device_value_decodes_eagerly(graphs):
    """A forward that needs a value mid-step (here a hook's `item()`) cannot be recorded: its decode
    steps run eagerly instead, with the same tokens."""
    model = _model("llama")
    seen = []
    model.model.layers[0].register_forward_hook(lambda module, args, out: seen.append(out[0].abs().sum().item()))
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(8))
    expected = _generate(model, prompt, max_new_tokens=12, min_new_tokens=12)
    model = model.to("neuron")
    assert _generate(model, prompt, max_new_tokens=12, min_new_tokens=12).equal(expected)
    (step,) = [step for _, step in generate._STATE[model].held.values()]
    assert "graph capture cannot wait" in step.refused
    assert step.recorded.replays == 0 and len(seen) == 2 * 12


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_left_padded_batch_decodes_as_on_cpu(kind, graphs):
    """Rows of different lengths, left-padded: the static cache's 4-D mask carries the padding as the
    dynamic cache's does, and the replayed steps give CPU's tokens for every row."""
    model = _model(kind)
    prompt = torch.randint(1, 256, (3, 7), generator=torch.Generator().manual_seed(9))
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0
    mask[2, :5] = 0
    prompt = prompt.masked_fill(mask == 0, 0)
    settings = {"attention_mask": mask, "max_new_tokens": 30, "min_new_tokens": 30}
    expected = _generate(model, prompt, **settings)
    model = model.to("neuron")
    got = _generate(model, prompt, **{**settings, "attention_mask": mask.to("neuron")})
    assert got.equal(expected)
    assert [s.replays for s in _steps(model)] == [28]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_second_call_runs_the_programs_of_the_first(kind, graphs):
    """The held cache is allocated before the first call's prefill (as transformers does for its
    chunked prefill), so every call, the first included, reads its length from the cache's tensors
    and records the same fused segments: a second call compiles (almost) nothing. Filled lazily,
    the first call's prefill took other paths and the second compiled six segments of its own."""
    model = _model(kind).to("neuron")
    prompt = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(10))
    first = _generate(model, prompt, max_new_tokens=24, min_new_tokens=24)
    before = torchneuron.eager_stats()["segment_compiles"]
    assert _generate(model, prompt, max_new_tokens=24, min_new_tokens=24).equal(first)
    # (one: the first decode step after the prefill is eager in the first call, replayed after)
    assert torchneuron.eager_stats()["segment_compiles"] - before <= 1
    (cache, _), = generate._STATE[model].held.values()
    assert all(layer.is_initialized for layer in cache.layers)


def test_a_cache_allocated_with_the_wrong_shapes_allocates_again_at_its_first_update(graphs):
    """The early allocation takes transformers' shapes from the config, which are wrong for Falcon's
    multi-query attention (one key head, not four): the first update allocates again from the keys
    it gets, and the tokens are CPU's."""
    torch.manual_seed(0)
    config = transformers.FalconConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       multi_query=True, new_decoder_architecture=False, max_position_embeddings=256)
    model = transformers.FalconForCausalLM(config).eval()
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(12))
    expected = _generate(model, prompt, max_new_tokens=12, min_new_tokens=12)
    model = model.to("neuron")
    for _ in range(2):
        assert _generate(model, prompt, max_new_tokens=12, min_new_tokens=12).equal(expected)
    (cache, _), = generate._STATE[model].held.values()
    assert {layer.keys.shape[1] for layer in cache.layers} == {1}


def test_generate_under_autocast_fills_its_cache_lazily(graphs):
    """Under autocast GPT-2's keys reach the cache in the autocast dtype, not the model's: allocated
    early in the model's dtype, the cache allocates again in theirs at its first update (the
    update's copy would refuse them)."""
    model = _model("gpt2").to("neuron")
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(11))
    with torch.autocast("neuron", dtype=torch.bfloat16):
        got = _generate(model, prompt, max_new_tokens=10, min_new_tokens=10)
    assert got.shape == (1, 15)
    (cache, _), = generate._STATE[model].held.values()
    assert {layer.keys.dtype for layer in cache.layers} == {torch.bfloat16}
