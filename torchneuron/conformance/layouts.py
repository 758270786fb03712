"""Conformance by layout: PyTorch's sparse OpInfo samples on neuron against CPU.

For each layout asked for (`sparse_coo`, `sparse_csr`, `sparse_csc`, `sparse_bsr`, `sparse_bsc`), every
OpInfo of `op_db` that supports it gives its sparse samples (`OpInfo.sample_inputs_sparse`, built on
CPU from `torch.testing._internal.opinfo.definitions.sparse`); each sample runs on CPU and, moved
with `.to("neuron")`, on neuron. Results are compared dense (`to_dense()`), with their layouts. A
record (op x layout x dtype) is `pass`, `mismatch`, `error` (the exception's type and first line:
an unsupported layout's refusal is one), `used-fallback` (the CPU fallback ran) or `skipped` (no
sample CPU accepts). An OpInfo that declares a layout without a sample function for it (most
element-wise ops) is run on its dense samples with the input made sparse, as PyTorch's own sparse
tests do. Each layout runs in its own process, streaming its records, so a crash costs
one layout's remaining ops (recorded as `crashed`).

    torchneuron-conformance --layouts sparse_coo,sparse_csr --out reports/layouts
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
import unittest
from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .classify import DEFAULT_TOLERANCE

LAYOUTS = {"sparse_coo": torch.sparse_coo, "sparse_csr": torch.sparse_csr, "sparse_csc": torch.sparse_csc,
           "sparse_bsr": torch.sparse_bsr, "sparse_bsc": torch.sparse_bsc}


def _to_neuron(value):
    return value.to("neuron") if isinstance(value, torch.Tensor) else value


def _dense(value):
    if isinstance(value, torch.Tensor):
        value = value.to_dense() if value.layout != torch.strided else value
        return value.detach().cpu()
    return value


def _layouts(value) -> list:
    return [v.layout for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor)]


def _compare(expected, actual, dtype) -> str | None:
    """None when `actual` (neuron) matches `expected` (CPU), else what differs."""
    if _layouts(expected) != _layouts(actual):
        return f"layouts {_layouts(actual)} against CPU's {_layouts(expected)}"
    rtol, atol = DEFAULT_TOLERANCE.get(dtype, (0, 0))
    try:
        torch.testing.assert_close(tree_map(_dense, actual), tree_map(_dense, expected), rtol=rtol, atol=atol,
                                   equal_nan=True, check_device=False)
    except AssertionError as e:
        return " ".join(str(e).split("\n")[:3])
    return None


def _from_dense(op, layout, dtype):
    blocksize = (1, 1) if layout in (torch.sparse_bsr, torch.sparse_bsc) else None
    for sample in op.sample_inputs("cpu", dtype):
        x = sample.input
        if not isinstance(x, torch.Tensor) or x.ndim < (1 if layout is torch.sparse_coo else 2):
            continue
        try:
            sparse = x.to_sparse(layout=layout, blocksize=blocksize)
        except (RuntimeError, NotImplementedError):
            continue
        yield sample.__class__(sparse, args=sample.args, kwargs=sample.kwargs)


def check(op, layout, dtype, max_samples: int) -> dict:
    """One record: `op`'s sparse samples of `layout` and `dtype` on neuron against CPU."""
    import torchneuron
    record = {"op": op.name if not op.variant_test_name else f"{op.name}.{op.variant_test_name}",
              "layout": str(layout).split(".")[-1], "dtype": str(dtype).split(".")[-1], "status": "skipped",
              "detail": "no sample CPU accepts", "samples": 0}
    try:
        samples = list(itertools.islice(op.sample_inputs_sparse(layout, "cpu", dtype), max_samples))
    except (unittest.SkipTest, NotImplementedError):
        # no sparse sample function: the op's dense samples with a sparse input, as PyTorch's
        # test_sparse.py makes them for element-wise ops
        samples = list(itertools.islice(_from_dense(op, layout, dtype), max_samples))
        record["detail"] = "no sample CPU accepts (from dense samples)"
    fallbacks = dict(torchneuron.fallback_stats())
    for sample in samples:
        try:
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001, S112  (CPU refuses the sample: nothing to compare)
            continue
        record["samples"] += 1
        try:
            moved = tree_map(_to_neuron, (sample.input, sample.args, sample.kwargs))
            actual = op(moved[0], *moved[1], **moved[2])
            differs = _compare(expected, actual, dtype)
        except Exception as e:  # noqa: BLE001  (the record says what neuron raised)
            record.update(status="error", detail=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
            return record
        if differs is not None:
            record.update(status="mismatch", detail=differs[:300])
            return record
    if record["samples"]:
        grown = {k: v for k, v in torchneuron.fallback_stats().items() if v != fallbacks.get(k)}
        record.update(status="used-fallback" if grown else "pass", detail=", ".join(sorted(grown)))
    return record


def run_layout(layout_name: str, dtypes: list[str], max_samples: int, out) -> None:
    """Every OpInfo supporting the layout, each record a JSON line on `out` as it finishes."""
    from torch.testing._internal.common_methods_invocations import op_db

    import torchneuron  # noqa: F401
    layout = LAYOUTS[layout_name]
    for op in op_db:
        if not op.supports_sparse_layout(layout):
            continue
        for name in dtypes:
            dtype = getattr(torch, name)
            if dtype not in op.supported_dtypes("cpu"):
                continue
            started = time.perf_counter()
            record = check(op, layout, dtype, max_samples)
            record["seconds"] = round(time.perf_counter() - started, 3)
            out.write(json.dumps(record) + "\n")
            out.flush()


def run(layouts: list[str], dtypes: list[str], max_samples: int, out_dir: Path, timeout: float) -> list[dict]:
    """Each layout in its own process; their records, and the report in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for name in layouts:
        stream = out_dir / f"{name}.jsonl"
        with stream.open("w") as f:
            done = subprocess.run([sys.executable, "-c", f"from {__name__} import _main; _main()", name, "--dtypes", *dtypes,
                                   "--max-samples", str(max_samples)], stdout=f, timeout=timeout, check=False)
        found = [json.loads(line) for line in stream.read_text().splitlines() if line.strip()]
        if done.returncode != 0:
            found.append({"op": "(the rest)", "layout": name, "dtype": "-", "status": "crashed",
                          "detail": f"the layout's process exited with {done.returncode}", "samples": 0})
        records += found
    (out_dir / "layouts.md").write_text(report(records))
    return records


def report(records: list[dict]) -> str:
    lines = ["# Conformance by layout", "",
             "PyTorch's sparse OpInfo samples on neuron against CPU (`torchneuron-conformance --layouts`).", "",
             "| layout | records | pass | mismatch | error | used-fallback | skipped | crashed |", "|---" * 8 + "|"]
    statuses = ("pass", "mismatch", "error", "used-fallback", "skipped", "crashed")
    for layout in dict.fromkeys(r["layout"] for r in records):
        rows = [r for r in records if r["layout"] == layout]
        counts = [sum(r["status"] == s for r in rows) for s in statuses]
        lines.append(f"| {layout} | {len(rows)} | " + " | ".join(map(str, counts)) + " |")
    lines += ["", "| op | layout | dtype | status | detail |", "|---|---|---|---|---|"]
    for r in records:
        if r["status"] != "pass":
            detail = r["detail"].replace("|", "\\|")
            lines.append(f"| {r['op']} | {r['layout']} | {r['dtype']} | {r['status']} | {detail} |")
    return "\n".join(lines) + "\n"


def _main() -> None:
    parser = argparse.ArgumentParser(description="one layout's records, as JSON lines on stdout")
    parser.add_argument("layout", choices=sorted(LAYOUTS))
    parser.add_argument("--dtypes", nargs="*", default=["float32"])
    parser.add_argument("--max-samples", type=int, default=3)
    args = parser.parse_args()
    run_layout(args.layout, args.dtypes, args.max_samples, sys.stdout)


if __name__ == "__main__":
    _main()
