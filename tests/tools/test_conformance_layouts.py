"""Conformance by layout (torchneuron/conformance/layouts.py): a sparse OpInfo's samples judged on
neuron against CPU, the records a layout's process streams, and the report."""
from __future__ import annotations

import torch
from torch.testing._internal.common_methods_invocations import op_db

from torchneuron.conformance import layouts


def _op(name: str):
    return next(op for op in op_db if op.name == name and not op.variant_test_name)


def test_a_coo_op_passes_against_cpu():
    record = layouts.check(_op("neg"), torch.sparse_coo, torch.float32, max_samples=2)
    assert record["status"] == "pass" and record["samples"] >= 1, record


def test_an_unsupported_layout_is_an_error_naming_it():
    record = layouts.check(_op("neg"), torch.sparse_csr, torch.float32, max_samples=1)
    assert record["status"] == "error" and "csr" in record["detail"].lower(), record


def test_a_mismatch_is_caught():
    assert layouts._compare(torch.ones(2).to_sparse(), torch.zeros(2).to_sparse(), torch.float32)
    assert layouts._compare(torch.ones(2).to_sparse(), torch.ones(2), torch.float32).startswith("layouts")
    assert layouts._compare(torch.ones(2).to_sparse(), torch.ones(2).to_sparse(), torch.float32) is None


def test_a_layout_runs_in_its_own_process_and_reports(tmp_path, monkeypatch):
    monkeypatch.setattr(layouts, "LAYOUTS", {"sparse_coo": torch.sparse_coo})
    records = layouts.run(["sparse_coo"], ["float32"], 1, tmp_path, timeout=600)
    assert {r["layout"] for r in records} == {"sparse_coo"}
    assert any(r["op"] == "neg" and r["status"] == "pass" for r in records)
    assert "| sparse_coo |" in (tmp_path / "layouts.md").read_text()


def test_the_cli_takes_layouts_comma_separated_or_one_by_one():
    import pytest

    from torchneuron.conformance import cli
    parse = cli._parser().parse_args
    assert [n for names in parse(["--layouts", "sparse_coo,sparse_csr"]).layouts for n in names] == \
        ["sparse_coo", "sparse_csr"]
    assert [n for names in parse(["--layouts", "sparse_coo", "sparse_bsr"]).layouts for n in names] == \
        ["sparse_coo", "sparse_bsr"]
    with pytest.raises(SystemExit):
        parse(["--layouts", "sparse_xyz"])
