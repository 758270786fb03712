"""The architecture sweep: small architectures of each task pass every stage that task runs."""
import json

import pytest

pytest.importorskip("transformers")

from torchneuron.sweep.runner import STAGES, sweep
from torchneuron.sweep.tasks import TASKS


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
