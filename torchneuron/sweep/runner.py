"""Runs the sweep: one spawned process per architecture, a timeout each, then the reports."""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .worker import STAGES


def architectures() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def run_one(model_type: str, out: Path, timeout: float, compiled: bool) -> dict:
    path = out / "models" / f"{model_type}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torchneuron.sweep.worker", model_type, str(path)]
    cmd += ["--compile"] if compiled else []
    log = out / "logs" / f"{model_type}.log"
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=_worker_env(out))
            crash = f"process exited with {proc.returncode}" if proc.returncode else ""
        except subprocess.TimeoutExpired:
            crash = f"timeout after {timeout:.0f} s"
    result = json.loads(path.read_text()) if path.exists() else {"model_type": model_type, "stages": {}}
    if crash:
        _mark_crash(result, crash)
    return result


def _worker_env(out: Path) -> dict:
    """Tiny models share most op shapes: the workers share the persistent compilation cache (on by
    default, TORCHNEURON_CACHE_DIR), so an op compiled for one model loads from disk for the next."""
    del out
    return dict(os.environ)


def _mark_crash(result: dict, reason: str) -> None:
    """The stage after the last recorded one failed with `reason` (unless one already failed there)."""
    stages = result["stages"]
    done = [s for s in STAGES if s in stages]
    if len(done) < len(STAGES):
        stages[STAGES[len(done)]] = {"ok": False, "detail": reason, "seconds": 0.0}


def passed(result: dict, stage: str) -> bool:
    return result["stages"].get(stage, {}).get("ok", False)


def summary(results: list[dict]) -> dict:
    on_cpu = [r for r in results if passed(r, "cpu")]
    per_stage = {s: sum(passed(r, s) for r in results) for s in STAGES}
    full = [r["model_type"] for r in on_cpu if all(passed(r, s) for s in STAGES)]
    reasons = collections.Counter()
    fallbacks = collections.Counter()
    for r in results:
        for s in STAGES:
            st = r["stages"].get(s)
            if st is not None and not st["ok"]:
                reasons[f"{s}: {_generic(st['detail'])}"] += 1
                break
        for op in r.get("fallback_ops", {}):
            fallbacks[op] += 1
    return {"architectures": len(results), "per_stage": per_stage, "cpu_pass": len(on_cpu),
            "neuron_pass": len(full), "neuron_share": len(full) / len(on_cpu) if on_cpu else 0.0,
            "reasons": reasons.most_common(), "fallback_ops": fallbacks.most_common()}


def _generic(detail: str) -> str:
    """A failure detail without per-model numbers, so equal causes count together."""
    import re
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", detail)[:160]


def markdown(results: list[dict], s: dict) -> str:
    lines = ["# Hugging Face causal-LM sweep", "",
             (f"{s['architectures']} architectures; {s['cpu_pass']} run on CPU; {s['neuron_pass']} of those pass "
              f"forward, backward and generate on neuron ({100 * s['neuron_share']:.1f}%)."), "",
             "| stage | passed |", "|---|---|"]
    lines += [f"| {st} | {n}/{s['architectures']} |" for st, n in s["per_stage"].items()]
    lines += ["", "## Most common failure reasons (first failing stage)", "", "| count | reason |", "|---|---|"]
    lines += [f"| {n} | {reason.replace('|', '/')} |" for reason, n in s["reasons"]]
    lines += ["", "## Ops that ran on CPU (architectures using each)", "", "| architectures | op |", "|---|---|"]
    lines += [f"| {n} | {op} |" for op, n in s["fallback_ops"]]
    lines += ["", "## Failures", "", "| architecture | stage | reason |", "|---|---|---|"]
    for r in results:
        for st in STAGES:
            info = r["stages"].get(st)
            if info is not None and not info["ok"]:
                lines.append(f"| {r['model_type']} | {st} | {info['detail'].replace('|', '/')[:300]} |")
    return "\n".join(lines) + "\n"


def plot(s: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(list(s["per_stage"]), list(s["per_stage"].values()))
    ax.axhline(s["architectures"], color="gray", linestyle="--")
    ax.set_ylabel("architectures passing")
    ax.set_title("torchneuron Hugging Face sweep")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_reports(results: list[dict], out: Path) -> dict:
    s = summary(results)
    (out / "sweep.json").write_text(json.dumps({"summary": s, "results": results}, indent=1))
    (out / "sweep.md").write_text(markdown(results, s))
    plot(s, out / "sweep.png")
    return s


def sweep(names: list[str], out: Path, jobs: int = 1, timeout: float = 120.0, compiled: bool = False) -> dict:
    (out / "models").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    results: dict[str, dict] = {}
    lock = threading.Lock()
    start = time.perf_counter()

    def one(name):
        r = run_one(name, out, timeout, compiled)
        with lock:
            results[name] = r
            ok = "pass" if all(passed(r, st) for st in STAGES) else next(
                f"FAIL {st}: {r['stages'][st]['detail'][:100]}" for st in STAGES
                if not passed(r, st) and st in r["stages"])
            print(f"[{len(results)}/{len(names)} {time.perf_counter() - start:.0f}s] {name}: {ok}", flush=True)
            write_reports([results[n] for n in names if n in results], out)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, names))
    return write_reports([results[n] for n in names], out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="torchneuron-sweep", description=__doc__)
    p.add_argument("--only", help="comma-separated model types (default: every causal-LM architecture)")
    p.add_argument("--skip", default="", help="comma-separated model types to leave out")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per architecture")
    p.add_argument("--out", default="sweep-out")
    p.add_argument("--compile", action="store_true", help="run the neuron stages through torch.compile")
    a = p.parse_args(argv)
    names = a.only.split(",") if a.only else architectures()
    names = [n for n in names if n not in set(a.skip.split(","))]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    s = sweep(names, Path(a.out), a.jobs, a.timeout, a.compile)
    print(f"{s['neuron_pass']}/{s['cpu_pass']} architectures that run on CPU pass on neuron "
          f"({100 * s['neuron_share']:.1f}%); reports in {a.out}/sweep.md")
