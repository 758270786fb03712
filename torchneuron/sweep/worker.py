"""Runs one architecture through the sweep's stages; meant to run in its own process.

    python -m torchneuron.sweep.worker MODEL_TYPE RESULT.json [--task TASK] [--compile]

Stages, in order, each recorded in RESULT.json as soon as it ends (so a timeout still tells
which stage hung): build (tiny config and model), cpu (forward with labels, backward and
greedy generate on CPU), then forward, backward and generate on neuron compared with CPU.
Tasks that do not generate (classification, masked LM, CTC) list generate under "skipped".
"""
from __future__ import annotations

import copy
import json
import sys
import time
import traceback

import torch

from .tasks import TASKS, Task, generation_prompt

NEW_TOKENS = 3
LOSS_RTOL = 1e-3
GRAD_TOL = 2e-2  # relative to the gradient's largest magnitude: sums of many products drift
GRAD_ATOL = 1e-6  # gradients that are zero in exact arithmetic (a key bias) are pure rounding noise
GRAD_PARAMS = 4
VANISHED = 1e-9  # compared gradients all below this on CPU: the check would compare zeros
# Models that run forward and backward in train mode (their configs zero the dropout in shrink's OVERRIDES):
# Reformer's reversible layers recompute activations in backward and allow that only in train mode; RWKV
# in eval mode carries its recurrent state forward in place, which backward cannot go through.
TRAIN_MODE = {"reformer", "rwkv"}


def _reason(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


class Recorder:
    def __init__(self, model_type: str, path: str, task: Task):
        self.path = path
        self.result = {"model_type": model_type, "stages": {}, "fallback_ops": {}}
        if task.skipped:
            self.result["skipped"] = list(task.skipped)

    def stage(self, name: str, ok: bool, detail: str = "", seconds: float = 0.0) -> None:
        self.result["stages"][name] = {"ok": ok, "detail": detail, "seconds": round(seconds, 2)}
        self.save()

    def save(self) -> None:
        with open(self.path, "w") as f:
            json.dump(self.result, f)


def build(model_type: str, task: Task):
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from .shrink import shrink

    config = shrink(CONFIG_MAPPING[model_type], model_type)
    for key, value in task.overrides.get(model_type, {}).items():
        setattr(config, key, value)
    if task.configure is not None:
        task.configure(config)
    torch.manual_seed(0)
    auto = getattr(transformers, task.auto_class)
    model_class = auto._model_mapping[type(config)]
    sub = _sub_config(config, model_class.config_class)
    if sub is not None:  # MusicGen's causal LM is its decoder, built from the decoder's sub-config
        model = model_class._from_config(sub, dtype=torch.float32)
    else:
        model = auto.from_config(config, dtype=torch.float32)
    _break_ties(model)
    if model_type in TRAIN_MODE:
        return model.train()
    return model.eval()  # no dropout: CPU and neuron draw different random numbers


def _sub_config(config, config_class):
    """The sub-config of class `config_class` where the task's model class takes one of the composite
    config's parts and transformers cannot pick it as the text config (MusicGen has two text parts, its
    text encoder and its decoder); None where from_config builds the model from the whole config."""
    if isinstance(config, config_class):
        return None
    try:
        if isinstance(config.get_text_config(), config_class):
            return None  # Llama 4, Qwen3.5: from_config takes the text config itself
    except ValueError:
        pass  # ambiguous: several text parts
    return next((getattr(config, k) for k in getattr(config, "sub_configs", {})
                 if isinstance(getattr(config, k, None), config_class)), None)


@torch.no_grad()
def _break_ties(model) -> None:
    """Give all-zero weight matrices (zero-initialised MoE routers) small random values. With zero
    routers every expert scores the same, and which of tied experts topk picks is unspecified in
    PyTorch (CPU's choice falls out of its partial sort): the sweep would compare tie-breaking
    rather than the model. CPU and neuron get the same values (neuron copies this model)."""
    g = torch.Generator().manual_seed(1)
    for p in model.parameters():
        if p.dim() >= 2 and p.is_floating_point() and not p.any():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.02)


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def _grads(model) -> dict:
    named = [(n, p) for n, p in model.named_parameters() if p.grad is not None and p.numel()]  # MobileBERT has an empty one
    picks = {named[i * (len(named) - 1) // max(GRAD_PARAMS - 1, 1)] for i in range(GRAD_PARAMS)} if named else []
    return {n: p.grad.detach().float().cpu() for n, p in picks}


def _generate(model, batch: dict) -> list:
    config = model.generation_config
    if config.pad_token_id is None:
        # Set in the generation config, not passed: BLIP's generate passes its own pad id to its decoder's.
        eos = config.eos_token_id
        config.pad_token_id = eos if isinstance(eos, int) else 0
    # Copies: BLIP's generate writes its start id over the prompt's first id in place, which would change
    # the batch neuron runs next.
    prompt = generation_prompt(model, batch, NEW_TOKENS)
    model.eval()  # TRAIN_MODE models too: generation is inference (Reformer caches only in eval mode)
    # num_return_sequences is the default, 1; MusicGen's own generate reads it unset otherwise.
    kwargs = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "do_sample": False, "num_return_sequences": 1}
    out = model.generate(**prompt, **kwargs)
    if not isinstance(out, torch.Tensor):
        # Text-to-speech generates return the audio (VibeVoice: a list of waveforms): compare the tokens that
        # drove it, which they return when asked for the dict.
        out = model.generate(**prompt, **kwargs, return_dict_in_generate=True).sequences
    return out.cpu().tolist()


def run_cpu(model, batch, task: Task):
    out = model(**batch)
    out.loss.backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    tokens = None
    if task.generates:
        with torch.no_grad():
            tokens = _generate(model, batch)
    return out.loss.item(), grads, tokens


def _vanished(grads: dict) -> bool:
    """Whether the compared gradients are all but zero on CPU: a check that would compare zeros."""
    return bool(grads) and max(g.abs().max().item() for g in grads.values()) < VANISHED


def _calibrate_norms(model, batch: dict) -> bool:
    """Give a model's BatchNorm layers one batch's statistics and unit scales, as a trained network's
    norms keep its activations near unit scale (False: it has none). Transformers initialises some
    vision models' norm scales from N(0, 0.02) over running statistics of 0 and 1, so each norm
    shrinks activations ~50x and a tiny model's loss and gradients vanish (EfficientNet: loss exactly
    ln 2, gradients 0). Run on CPU before the copy for neuron is made: both devices run one model."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return False
    dropouts = [(m, m.p) for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    training = model.training
    with torch.no_grad():
        for m in norms:
            if m.affine:
                m.weight.fill_(1.0)
                m.bias.zero_()
            m.reset_running_stats()
            m.momentum = None  # (a cumulative average: one batch's statistics)
        for m, _ in dropouts:
            m.p = 0.0
        model.train()
        model(**{k: v for k, v in batch.items() if k != "labels"})
    for m, p in dropouts:
        m.p = p
    model.train(training)
    return True


def _compare_grads(cpu: dict, neuron_model) -> str:
    params = dict(neuron_model.named_parameters())
    worst = ""
    for name, ref in cpu.items():
        g = params[name].grad
        if g is None:
            return f"no gradient for {name}"
        got = g.detach().float().cpu()
        scale = ref.abs().max().item() or 1.0
        diff = (got - ref).abs().max().item()
        if not diff <= GRAD_TOL * scale + GRAD_ATOL:
            worst = f"{name}: max error {diff / scale:.2e} of its scale {scale:.2e}"
    return worst


def main(model_type: str, path: str, compiled: bool = False, task: str = "causal-lm") -> None:
    import torchneuron  # noqa: F401 (registers the device)
    from torchneuron.eager import fallback

    spec = TASKS[task]
    rec = Recorder(model_type, path, spec)
    stage = "build"
    t0 = time.perf_counter()
    try:
        model = build(model_type, spec)
        batch = spec.inputs(model)
        rec.result["parameters"] = sum(p.numel() for p in model.parameters())
        rec.stage(stage, True, type(model).__name__, time.perf_counter() - t0)
        stage, t0 = "cpu", time.perf_counter()
        neuron_model = copy.deepcopy(model)
        loss, grads, tokens = run_cpu(model, batch, spec)
        if _vanished(grads) and _calibrate_norms(neuron_model, batch):
            model = copy.deepcopy(neuron_model)  # (both devices run the calibrated model)
            loss, grads, tokens = run_cpu(model, batch, spec)
            rec.result["calibrated_norms"] = True
        rec.stage(stage, True, f"loss {loss:.6f}", time.perf_counter() - t0)

        neuron_model.to("neuron")
        runner = torch.compile(neuron_model, backend="neuron") if compiled else neuron_model
        nbatch = _to(batch, "neuron")
        stage, t0 = "forward", time.perf_counter()
        out = runner(**nbatch)
        got = out.loss.item()
        ok = abs(got - loss) <= LOSS_RTOL * max(abs(loss), 1e-6)
        rec.stage(stage, ok, f"loss {got:.6f} vs cpu {loss:.6f}", time.perf_counter() - t0)
        stage, t0 = "backward", time.perf_counter()
        out.loss.backward()
        bad = _compare_grads(grads, neuron_model)
        rec.stage(stage, not bad, bad, time.perf_counter() - t0)
        if not spec.generates:
            return
        stage, t0 = "generate", time.perf_counter()
        with torch.no_grad():
            got_tokens = _generate(neuron_model, nbatch)
        same = got_tokens == tokens
        rec.stage(stage, same, "" if same else f"tokens {got_tokens} vs cpu {tokens}", time.perf_counter() - t0)
    except BaseException as exc:  # noqa: BLE001 (every failure is a result to record)
        rec.result["traceback"] = traceback.format_exc()[-4000:]
        rec.stage(stage, False, _reason(exc), time.perf_counter() - t0)
    finally:
        rec.result["fallback_ops"] = {str(k): v for k, v in fallback.STATS.items()}
        rec.save()


if __name__ == "__main__":
    args = sys.argv[3:]
    main(sys.argv[1], sys.argv[2], "--compile" in args, args[args.index("--task") + 1] if "--task" in args else "causal-lm")
