"""PEFT (LoRA) and TRL (SFTTrainer) on neuron: each run equals the same run on CPU, and the trainers pick
neuron by themselves through torchneuron.integrations.huggingface (see docs/HUGGINGFACE.md)."""
import copy

import pytest
import torch

import torchneuron

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")
peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = 128
WORDS = ["[PAD]", "[EOS]", "[UNK]"] + [f"w{i}" for i in range(VOCAB - 3)]
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
# Adam's first steps move a weight by lr * g / (|g| + eps): where a gradient is near eps (1e-8), its last-bit
# rounding differences grow to ~1e-5 in the weight.
WEIGHTS = {"rtol": 1e-4, "atol": 1e-4}


# accelerate keeps its device in a process-wide singleton: each test chooses it afresh (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _model():
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      pad_token_id=0, eos_token_id=1, bos_token_id=None, loss_type="ForCausalLM")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _lora_model():
    config = peft.LoraConfig(target_modules=["q_proj", "v_proj"], r=4, lora_alpha=8, lora_dropout=0.0)
    return peft.get_peft_model(_model(), config)


def _tokens():
    return torch.randint(3, VOCAB, (4, 8), generator=torch.Generator().manual_seed(1))


def _lora_steps(model, device, steps=3):
    """A plain training loop on `device`: the losses, and the names of the parameters that got a gradient."""
    model.to(device)
    ids = _tokens().to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        with_grad = {name for name, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, with_grad


def test_lora_training_on_neuron_matches_cpu(no_fallback):
    cpu_model = _lora_model()
    model = copy.deepcopy(cpu_model)
    base = {name: p.detach().clone() for name, p in cpu_model.named_parameters() if "lora_" not in name}
    cpu_losses, cpu_with_grad = _lora_steps(cpu_model, "cpu")
    losses, with_grad = _lora_steps(model, "neuron")

    lora = {name for name, _ in model.named_parameters() if "lora_" in name}
    assert len(lora) == 2 * 2 * 2  # A and B, for q_proj and v_proj, in each of the 2 layers
    assert with_grad == cpu_with_grad == lora
    torch.testing.assert_close(losses, cpu_losses, **TOLERANCE)
    assert losses[-1] < losses[0]
    for (name, p), p_cpu in zip(model.named_parameters(), cpu_model.parameters()):
        assert p.device.type == "neuron"
        torch.testing.assert_close(p.detach().cpu(), p_cpu.detach(), **WEIGHTS)
        if name in base:
            assert torch.equal(p.detach().cpu(), base[name])
    # lora_B starts at zero: after training it is not, so the adapter changed the model
    assert all(p.abs().sum().item() > 0 for name, p in model.named_parameters() if "lora_B" in name)

    merged, cpu_merged = model.merge_and_unload(), cpu_model.merge_and_unload()
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    assert merged.device.type == "neuron"
    ids = _tokens()
    with torch.no_grad():
        logits = merged(input_ids=ids.to("neuron")).logits
        cpu_logits = cpu_merged(input_ids=ids).logits
    torch.testing.assert_close(logits.cpu(), cpu_logits, **TOLERANCE)


# optim="adamw_torch": the default "adamw_torch_fused" (aten._fused_adamw_) may still fall back to CPU, and
# these tests are about PEFT and TRL, not that optimizer (tests/integrations/test_huggingface_trainer.py covers it).
TRAINING = {"per_device_train_batch_size": 2, "learning_rate": 1e-2, "logging_steps": 1, "report_to": [],
            "save_strategy": "no", "optim": "adamw_torch"}


def _run_on_both(make_trainer, model, losses_tolerance=TOLERANCE, weights_tolerance=WEIGHTS):
    """Trains `model` with `make_trainer(model, use_cpu)` on CPU, then on the device the libraries choose,
    which must be neuron, with no CPU fallback; both runs must agree. Returns both trainers."""
    cpu_trainer = make_trainer(copy.deepcopy(model), use_cpu=True)
    cpu_trainer.train()
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    before = torchneuron.fallback_stats()
    trainer = make_trainer(model, use_cpu=False)
    trainer.train()
    assert torchneuron.fallback_stats() == before

    assert next(cpu_trainer.model.parameters()).device.type == "cpu"
    assert trainer.model.device.type == "neuron"
    assert all(p.device.type == "neuron" for p in trainer.model.parameters())
    losses, cpu_losses = ([log["loss"] for log in t.state.log_history if "loss" in log] for t in (trainer, cpu_trainer))
    assert len(losses) == trainer.args.max_steps
    torch.testing.assert_close(losses, cpu_losses, **losses_tolerance)
    if weights_tolerance:
        for p, p_cpu in zip(trainer.model.parameters(), cpu_trainer.model.parameters()):
            torch.testing.assert_close(p.detach().cpu(), p_cpu.detach(), **weights_tolerance)
    return trainer, cpu_trainer


class _Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = _tokens()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_lora_trainer_on_neuron_matches_cpu(tmp_path):
    def make_trainer(model, use_cpu):
        args = transformers.TrainingArguments(output_dir=tmp_path / str(use_cpu), max_steps=2, use_cpu=use_cpu,
                                              **TRAINING)
        return transformers.Trainer(model=model, args=args, train_dataset=_Tokens())

    trainer, _ = _run_on_both(make_trainer, _lora_model())
    assert isinstance(trainer.model, peft.PeftModel)


def _tokenizer():
    """A word-level tokenizer built here (nothing is downloaded): "w5 w17" -> [8, 20]."""
    model = tokenizers.models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", eos_token="[EOS]",
                                                unk_token="[UNK]")


def _texts():
    generator = torch.Generator().manual_seed(2)
    lengths = [5, 7, 4, 6]  # unequal: the collator pads and masks
    return datasets.Dataset.from_dict({"text": [
        " ".join(WORDS[3 + int(i)] for i in torch.randint(0, VOCAB - 3, (n,), generator=generator))
        for n in lengths]})


# SFTConfig's defaults train under bfloat16 autocast with gradient checkpointing. In bfloat16, CPU and neuron
# round differently: the losses agree to 2e-2, and Adam's first steps (lr * sign of the gradient) can move a
# weight with a tiny gradient either way, so only the float32 runs compare weights.
@pytest.mark.parametrize("lora,bf16", [(False, False), (True, False), (False, True)], ids=["full", "lora", "bf16"])
def test_sft_trainer_on_neuron_matches_cpu(tmp_path, lora, bf16):
    def make_trainer(model, use_cpu):
        args = trl.SFTConfig(output_dir=str(tmp_path / str(use_cpu)), max_steps=2, use_cpu=use_cpu, max_length=16,
                             bf16=bf16, **TRAINING)
        peft_config = peft.LoraConfig(target_modules=["q_proj", "v_proj"], r=4, lora_dropout=0.0) if lora else None
        torch.manual_seed(0)  # the same random LoRA A matrices on both runs
        return trl.SFTTrainer(model=model, args=args, train_dataset=_texts(), processing_class=_tokenizer(),
                              peft_config=peft_config)

    tolerances = {"losses_tolerance": {"rtol": 2e-2, "atol": 2e-2}, "weights_tolerance": None} if bf16 else {}
    trainer, _ = _run_on_both(make_trainer, _model(), **tolerances)
    assert trainer.args.gradient_checkpointing
    assert isinstance(trainer.model, peft.PeftModel) == lora
    first = trainer.train_dataset[0]["input_ids"]
    assert first[-1] == 1 and len(first) == 6  # tokenized here, [EOS] appended
