"""transformers' pipelines pick neuron when the caller names no device, as they pick cuda:0
(torchneuron/integrations/pipelines.py), and compute what the same pipeline computes on CPU."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["[PAD]", "[UNK]", "[EOS]", *[f"w{i}" for i in range(61)]]


def _tokenizer():
    """A word-level tokenizer built here (nothing is downloaded)."""
    model = tokenizers.models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", eos_token="[EOS]")


def _model():
    config = transformers.LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, pad_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _pipeline(**options):
    return transformers.pipeline("text-generation", model=_model(), tokenizer=_tokenizer(), **options)


@pytest.mark.parametrize("device", [None, 0])
def test_pipeline_with_no_device_or_an_ordinal_runs_on_neuron(device):
    options = {} if device is None else {"device": device}
    pipe = _pipeline(**options)
    assert pipe.device == torch.device("neuron", 0)
    assert pipe.model.device == torch.device("neuron", 0)
    on_cpu = _pipeline(device="cpu")
    prompt = "w3 w7 w11"
    want = on_cpu(prompt, max_new_tokens=6, do_sample=False)[0]["generated_text"]
    assert pipe(prompt, max_new_tokens=6, do_sample=False)[0]["generated_text"] == want


@pytest.mark.parametrize("device", ["cpu", -1, torch.device("cpu")])
def test_pipeline_keeps_an_explicit_device(device):
    assert _pipeline(device=device).device.type == "cpu"


def test_pipeline_keeps_a_model_already_on_neuron_there():
    model = _model().to("neuron")
    weight = model.model.embed_tokens.weight
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=_tokenizer())
    assert pipe.device.type == "neuron" and pipe.model.model.embed_tokens.weight is weight
