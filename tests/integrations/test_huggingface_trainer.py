"""torchneuron.integrations.huggingface: accelerate and transformers' Trainer pick neuron with no
setting, and a Trainer run on neuron (gradient accumulation, clipping) matches the same run on CPU."""
import copy
import json
import pathlib
import sys

import pytest
import torch

import torchneuron
from torchneuron.testing.processes import last_json, run_code, run_torchrun

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

VOCAB = 128


# accelerate keeps its device in a process-wide singleton: each test chooses it afresh (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _model(dropout=0.0):
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      loss_type="ForCausalLM", attention_dropout=dropout)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self):
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, VOCAB, (16, 8), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _train(model, output_dir, use_cpu, resume=None, callbacks=None, **options):
    options = {"max_steps": 3, "optim": "adamw_torch_fused", "save_strategy": "no", **options}
    args = transformers.TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_grad_norm=0.5,
        learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=use_cpu, **options)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, [log for log in trainer.state.log_history if "loss" in log]


def test_accelerator_picks_neuron():
    assert accelerate.utils.is_neuron_available()
    assert accelerate.Accelerator().device.type == "neuron"


def test_accelerator_on_cpu_when_asked():
    assert accelerate.Accelerator(cpu=True).device.type == "cpu"


def test_training_arguments_pick_neuron():
    args = transformers.TrainingArguments(output_dir="unused", report_to=[])
    assert args.device == torch.device("neuron", 0)
    assert args.n_gpu == 1  # one device per process: no DataParallel


# The default optimizer is AdamW(fused=True); its learning rate changes every step (linear schedule).
@pytest.mark.parametrize("optim", ["adamw_torch_fused", "adamw_torch"])
def test_trainer_on_neuron_matches_cpu(tmp_path, optim):
    model = _model()
    cpu_trainer, cpu_logs = _train(copy.deepcopy(model), tmp_path / "cpu", use_cpu=True, optim=optim)
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    before = torchneuron.fallback_stats()
    trainer, logs = _train(model, tmp_path / "neuron", use_cpu=False, optim=optim)
    assert torchneuron.fallback_stats() == before  # nothing ran on CPU

    assert next(cpu_trainer.model.parameters()).device.type == "cpu"
    assert trainer.model.device.type == "neuron"
    assert all(p.device.type == "neuron" for p in trainer.model.parameters())
    assert [log["step"] for log in logs] == [1, 2, 3]
    # grad_norm is the norm before clipping: above max_grad_norm, so every step clipped
    assert all(log["grad_norm"] > 0.5 for log in cpu_logs)
    for key in ("loss", "grad_norm"):
        torch.testing.assert_close([log[key] for log in logs], [log[key] for log in cpu_logs],
                                   rtol=1e-4, atol=1e-5)
    for p, p_cpu in zip(trainer.model.parameters(), cpu_trainer.model.parameters()):
        torch.testing.assert_close(p.cpu(), p_cpu, rtol=1e-4, atol=1e-5)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("options,tol", [({"torch_compile": True}, 1e-4), ({"bf16": True}, 2e-2)])
def test_trainer_options_on_neuron(tmp_path, options, tol):
    model = _model()
    _, cpu_logs = _train(copy.deepcopy(model), tmp_path / "cpu", use_cpu=True)
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    trainer, logs = _train(model, tmp_path / "neuron", use_cpu=False, **options)
    assert trainer.model.device.type == "neuron"
    if "torch_compile" in options:
        assert trainer.args.torch_compile_backend == "neuron"  # chosen by transformers itself
    torch.testing.assert_close([log["loss"] for log in logs], [log["loss"] for log in cpu_logs], rtol=tol, atol=tol)


# A fresh process per run, as a real resume is: it trains on neuron with nothing but `import torch`.
_RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import transformers
import test_huggingface_trainer as t

class CountSteps(transformers.TrainerCallback):
    steps = 0
    def on_step_end(self, args, state, control, **kwargs):
        CountSteps.steps += 1

trainer, logs = t._train(t._model(float(sys.argv[4])), sys.argv[2], use_cpu=False, max_steps=4,
                         save_strategy="steps", save_steps=2, resume=sys.argv[3] or None, callbacks=[CountSteps()])
assert trainer.model.device.type == "neuron"
weights = [p.detach().cpu().double().sum().item() for p in trainer.model.parameters()]
print(json.dumps({"steps_run": CountSteps.steps, "losses": [log["loss"] for log in logs], "weights": weights}))
"""


def _run_in_subprocess(output_dir, resume="", dropout=0.0):
    tests = pathlib.Path(__file__).parent
    return last_json(run_code(_RUN, tests, output_dir, resume, dropout, env={"PYTHONPATH": str(tests.parents[1])}))


@pytest.mark.slow  # two fresh processes (114 s here); the dropout test below resumes the same way in the default tier
def test_resume_from_checkpoint_continues_the_same_loss_curve(tmp_path):
    uninterrupted = _run_in_subprocess(tmp_path / "full")  # also saves checkpoint-2 and checkpoint-4
    resumed = _run_in_subprocess(tmp_path / "resumed", resume=tmp_path / "full" / "checkpoint-2")
    assert uninterrupted["steps_run"] == 4
    assert resumed["steps_run"] == 2  # steps 3 and 4; the history of steps 1 and 2 comes from the checkpoint
    assert len(uninterrupted["losses"]) == len(resumed["losses"]) == 4
    torch.testing.assert_close(resumed["losses"], uninterrupted["losses"], rtol=1e-5, atol=1e-6)


def test_resume_with_dropout_repeats_the_uninterrupted_run_bit_for_bit(tmp_path):
    """The checkpoint keeps neuron's generator (integrations/trainer_rng.py): the resumed run draws the
    same dropout masks as the run that never stopped."""
    uninterrupted = _run_in_subprocess(tmp_path / "full", dropout=0.3)
    resumed = _run_in_subprocess(tmp_path / "resumed", resume=tmp_path / "full" / "checkpoint-2", dropout=0.3)
    assert resumed["steps_run"] == 2
    assert resumed["losses"] == uninterrupted["losses"]
    assert resumed["weights"] == uninterrupted["weights"]
    states = torch.load(tmp_path / "full" / "checkpoint-2" / "rng_state.pth", weights_only=False)
    assert states["neuron"].dtype == torch.uint8 and states["neuron"].numel() > 0


# torchrun: accelerate chooses MULTI_NEURON and the c10d backend "neuron" by itself, each rank trains on
# its own core (neuron:LOCAL_RANK), and the run equals the same torchrun on CPU (gloo).
_TORCHRUN = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch, transformers
import test_huggingface_trainer as t

use_cpu = sys.argv[3] == "cpu"
trainer, logs = t._train(t._model(), sys.argv[2], use_cpu=use_cpu, max_steps=2)
rank = int(os.environ["LOCAL_RANK"])
device = next(trainer.model.parameters()).device
state = trainer.accelerator.state
result = {"device": str(device), "distributed": str(state.distributed_type), "backend": state.backend,
          "losses": [log["loss"] for log in logs],
          "params": [p.detach().cpu().double().sum().item() for p in trainer.model.parameters()]}
with open(os.path.join(sys.argv[2], f"result-{rank}.json"), "w") as f:
    json.dump(result, f)
"""


def _torchrun(output_dir, device):
    tests = pathlib.Path(__file__).parent
    env = {"PYTHONPATH": str(tests.parents[1]), "OMP_NUM_THREADS": "1", "TORCHNEURON_CORES": "2"}
    run_torchrun("--no-python", sys.executable, "-c", _TORCHRUN, tests, output_dir, device, env=env, timeout=400)
    return {rank: json.loads((output_dir / f"result-{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.slow
def test_trainer_under_torchrun_matches_cpu(tmp_path):
    cpu = _torchrun(tmp_path / "cpu", "cpu")
    neuron = _torchrun(tmp_path / "neuron", "neuron")
    for rank, result in neuron.items():
        assert result["device"] == f"neuron:{rank}"  # each rank on its own core
        assert result["distributed"] == "DistributedType.MULTI_NEURON" and result["backend"] == "neuron"
        assert len(result["losses"]) == 2
        torch.testing.assert_close(result["losses"], cpu[rank]["losses"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(result["params"], cpu[rank]["params"], rtol=1e-4, atol=1e-4)
    assert cpu[0]["distributed"] == "DistributedType.MULTI_CPU"
    assert neuron[0]["params"] == neuron[1]["params"]  # DDP kept the replicas equal
