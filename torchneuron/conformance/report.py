"""conformance.json, conformance.md and conformance.png from the records of a run."""
from __future__ import annotations

import collections
import json
from pathlib import Path

# Every variant, in report order (the runner runs those selected that apply to an OpInfo).
VARIANTS = ("forward", "backward", "forward_ad", "out", "inplace", "errors")
# Those run unless others are asked for: the values. Error parity is asked for by name (`--variants`),
# so that a wrong message does not hide a right value in a record's status.
DEFAULT_VARIANTS = ("forward", "backward", "forward_ad", "out", "inplace")


def _rate(records, ok=lambda r: r["status"] == "pass") -> dict:
    ran = [r for r in records if r["status"] != "skipped"]
    passed = sum(1 for r in ran if ok(r))
    return {"pass": passed, "ran": len(ran), "rate": passed / len(ran) if ran else None}


def _variant_rate(records, variant) -> dict:
    ran = [r["variants"][variant] for r in records
           if variant in r["variants"] and r["variants"][variant]["status"] != "skipped"]
    passed = sum(1 for v in ran if v["status"] == "pass")
    return {"pass": passed, "ran": len(ran), "rate": passed / len(ran) if ran else None}


def _error_cases(records) -> dict:
    """Error parity counted by case (one error input or out= check) rather than by record, with the
    mismatches by kind (no-error, other-type, other-message, ...)."""
    ran = [r["variants"]["errors"] for r in records
           if "errors" in r["variants"] and r["variants"]["errors"]["status"] != "skipped"]
    checked = sum(v.get("samples", 0) for v in ran)
    mismatched = sum(v.get("mismatched", 0) for v in ran)
    kinds = collections.Counter(c["kind"] for v in ran for c in v.get("cases", ()))
    return {"pass": checked - mismatched, "ran": checked, "rate": (checked - mismatched) / checked if checked else None,
            "kinds": dict(kinds.most_common())}


def _grouped(records, key) -> dict:
    groups = collections.defaultdict(list)
    for r in records:
        groups[r[key]].append(r)
    return {k: {**_rate(v), "counts": dict(collections.Counter(r["status"] for r in v))}
            for k, v in sorted(groups.items())}


def summarize(records) -> dict:
    return {
        "records": len(records),
        "ops": len({r["op"] for r in records}),
        "counts": dict(collections.Counter(r["status"] for r in records)),
        "overall": _rate(records),
        **{variant: _variant_rate(records, variant) for variant in VARIANTS},
        "error_cases": _error_cases(records),
        "by_dtype": _grouped(records, "dtype"),
        "by_family": _grouped(records, "family"),
        "fallback_ops": dict(collections.Counter(op for r in records for op in r["fallbacks"])),
    }


def _pct(rate: dict) -> str:
    return "-" if rate["rate"] is None else f"{100 * rate['rate']:.1f}% ({rate['pass']}/{rate['ran']})"


def markdown(summary: dict, records, meta: dict) -> str:
    lines = ["# torchneuron OpInfo conformance", "",
             (f"{summary['ops']} OpInfos, {summary['records']} op x dtype records; torch {meta['torch']}, "
              f"jax {meta['jax']}; {meta['seconds']:.0f} s with {meta['args']['jobs']} jobs; "
              f"command: `{meta['command']}`"), "",
             ("Pass rates count records that ran (skipped ones excluded). A record passes when every "
              "variant passes and nothing fell back to CPU."), "",
             "| scope | pass rate |", "| --- | --- |",
             f"| overall | {_pct(summary['overall'])} |"]
    for variant in VARIANTS:
        lines.append(f"| {variant} | {_pct(summary[variant])} |")
    lines.append(f"| errors, by case | {_pct(summary['error_cases'])} |")
    statuses = ("pass", "mismatch", "error", "used-fallback", "skipped")
    lines += ["", "Records by status: " + ", ".join(f"{s} {summary['counts'].get(s, 0)}" for s in statuses)]
    for title, key in (("By dtype", "by_dtype"), ("By family", "by_family")):
        lines += ["", f"## {title}", "", "| group | pass rate | " + " | ".join(statuses) + " |",
                  "| --- | --- |" + " --- |" * len(statuses)]
        for group, g in summary[key].items():
            lines.append(f"| {group} | {_pct(g)} | " + " | ".join(str(g["counts"].get(s, 0)) for s in statuses)
                         + " |")
    failures = [r for r in records if r["status"] in ("error", "mismatch")]
    lines += ["", f"## Failures ({len(failures)})", "", "| op | dtype | status | reason |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {r['op']} | {r['dtype']} | {r['status']} | {_cell(r['reason'])} |" for r in failures]
    lines += _error_section(records, summary["error_cases"])
    fell_back = [r for r in records if r["fallbacks"]]
    lines += ["", f"## Ops that used the CPU fallback ({len(fell_back)})", "", "| op | dtype | aten ops |",
              "| --- | --- | --- |"]
    lines += [f"| {r['op']} | {r['dtype']} | {', '.join(sorted(r['fallbacks']))} |" for r in fell_back]
    skipped = collections.Counter(r["reason"].split(":")[0] for r in records if r["status"] == "skipped")
    lines += ["", "## Skipped", "", "| reason | records |", "| --- | --- |"]
    lines += [f"| {reason} | {n} |" for reason, n in skipped.most_common()]
    return "\n".join(lines) + "\n"


def _error_section(records, cases: dict) -> list[str]:
    """Every error-parity mismatch, one row per case: what neuron did against what CPU did."""
    rows = [(r["op"], r["dtype"], c) for r in records if r["variants"].get("errors", {}).get("status") == "mismatch"
            for c in r["variants"]["errors"].get("cases", ())]
    if not rows and not cases["ran"]:
        return []
    kinds = ", ".join(f"{kind} {n}" for kind, n in cases["kinds"].items()) or "none"
    lines = ["", f"## Error parity mismatches ({len(rows)})", "",
             (f"Each case is one error input (`OpInfo.error_inputs`) or out= check (unsafe dtype, CPU tensors, "
              f"wrong shape); {cases['ran']} cases checked. Mismatches by kind: {kinds}."), "",
             "| op | dtype | case | kind | what neuron did |", "| --- | --- | --- | --- | --- |"]
    return lines + [f"| {op} | {dtype} | {c['case']} | {c['kind']} | {_cell(c['reason'])} |" for op, dtype, c in rows]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:200]


def plot(summary: dict, path: Path) -> bool:
    """Pass rate by family and by dtype; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, key, title in ((axes[0], "by_family", "by family"), (axes[1], "by_dtype", "by dtype")):
        groups = {k: g for k, g in summary[key].items() if g["rate"] is not None}
        ax.barh(list(groups), [100 * g["rate"] for g in groups.values()], color="tab:green")
        for i, g in enumerate(groups.values()):
            ax.text(1, i, f"{g['pass']}/{g['ran']}", va="center", fontsize=8)
        ax.set_xlim(0, 100)
        ax.set_xlabel("pass rate (%)")
        ax.set_title(f"OpInfo conformance {title}")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write(out_dir: Path, records, meta: dict) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    records = sorted(records, key=lambda r: (r["op"], r["dtype"]))
    summary = summarize(records)
    (out_dir / "conformance.json").write_text(json.dumps(
        {"meta": meta, "summary": summary, "records": records}, indent=1, default=str))
    (out_dir / "conformance.md").write_text(markdown(summary, records, meta))
    plot(summary, out_dir / "conformance.png")
    return summary
