"""The architecture sweep on three small architectures: each passes every stage."""
import json

import pytest

pytest.importorskip("transformers")

from torchneuron.sweep.runner import STAGES, sweep


def test_sweep_three_architectures(tmp_path):
    names = ["llama", "gpt2", "qwen2"]
    summary = sweep(names, tmp_path, jobs=1, timeout=400)
    results = json.loads((tmp_path / "sweep.json").read_text())["results"]
    failures = {r["model_type"]: {s: v for s, v in r["stages"].items() if not v["ok"]} for r in results}
    assert summary["neuron_pass"] == 3, failures
    assert all(set(r["stages"]) == set(STAGES) for r in results)
    assert "| forward | 3/3 |" in (tmp_path / "sweep.md").read_text()
