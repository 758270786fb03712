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

from .tasks import STAGES, TASKS, Task


def architectures(task: str = "causal-lm") -> list[str]:
    return TASKS[task].architectures()


def run_one(model_type: str, out: Path, timeout: float, compiled: bool, task: Task = TASKS["causal-lm"]) -> dict:
    path = out / "models" / f"{model_type}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torchneuron.sweep.worker", model_type, str(path), "--task", task.name]
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
        _mark_crash(result, crash, task.stages)
    return result


def _worker_env(out: Path) -> dict:
    """Tiny models share most op shapes: the workers share the persistent compilation cache (on by
    default, TORCHNEURON_CACHE_DIR), so an op compiled for one model loads from disk for the next."""
    del out
    return dict(os.environ)


def _mark_crash(result: dict, reason: str, order: tuple[str, ...] = STAGES) -> None:
    """The stage after the last recorded one failed with `reason` (unless one already failed there)."""
    stages = result["stages"]
    done = [s for s in order if s in stages]
    if len(done) < len(order):
        stages[order[len(done)]] = {"ok": False, "detail": reason, "seconds": 0.0}


def passed(result: dict, stage: str) -> bool:
    return result["stages"].get(stage, {}).get("ok", False)


def summary(results: list[dict], task: Task = TASKS["causal-lm"]) -> dict:
    """Pass counts over the task's stages; a stage the task skips counts for no architecture."""
    stages = task.stages
    on_cpu = [r for r in results if passed(r, "cpu")]
    per_stage = {s: sum(passed(r, s) for r in results) for s in stages}
    full = [r["model_type"] for r in on_cpu if all(passed(r, s) for s in stages)]
    reasons = collections.Counter()
    fallbacks = collections.Counter()
    for r in results:
        for s in stages:
            st = r["stages"].get(s)
            if st is not None and not st["ok"]:
                reasons[f"{s}: {_generic(st['detail'])}"] += 1
                break
        for op in r.get("fallback_ops", {}):
            fallbacks[op] += 1
    return {"task": task.name, "architectures": len(results), "per_stage": per_stage, "skipped": list(task.skipped), "cpu_pass": len(on_cpu),
            "neuron_pass": len(full), "neuron_share": len(full) / len(on_cpu) if on_cpu else 0.0,
            "reasons": reasons.most_common(), "fallback_ops": fallbacks.most_common()}


def _generic(detail: str) -> str:
    """A failure detail without per-model numbers, so equal causes count together."""
    import re
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", detail)[:160]


def markdown(results: list[dict], s: dict, task: Task = TASKS["causal-lm"]) -> str:
    checked = [st for st in task.stages if st not in ("build", "cpu")]
    lines = [f"# Hugging Face {task.title} sweep", "",
             (f"{s['architectures']} architectures; {s['cpu_pass']} run on CPU; {s['neuron_pass']} of those pass "
              f"{_series(checked)} on neuron ({100 * s['neuron_share']:.1f}%)."), "",
             "| stage | passed |", "|---|---|"]
    lines += [f"| {st} | {n}/{s['architectures']} |" for st, n in s["per_stage"].items()]
    lines += [f"| {st} | skipped: not applicable to {task.name} |" for st in task.skipped]
    lines += ["", "## Most common failure reasons (first failing stage)", "", "| count | reason |", "|---|---|"]
    lines += [f"| {n} | {reason.replace('|', '/')} |" for reason, n in s["reasons"]]
    lines += ["", "## Ops that ran on CPU (architectures using each)", "", "| architectures | op |", "|---|---|"]
    lines += [f"| {n} | {op} |" for op, n in s["fallback_ops"]]
    lines += ["", "## Failures", "", "| architecture | stage | reason |", "|---|---|---|"]
    for r in results:
        for st in task.stages:
            info = r["stages"].get(st)
            if info is not None and not info["ok"]:
                lines.append(f"| {r['model_type']} | {st} | {info['detail'].replace('|', '/')[:300]} |")
    return "\n".join(lines) + "\n"


def _series(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def plot(s: dict, path: Path, task: Task = TASKS["causal-lm"]) -> bool:
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
    ax.set_title(f"torchneuron Hugging Face {task.title} sweep")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_reports(results: list[dict], out: Path, task: Task = TASKS["causal-lm"]) -> dict:
    s = summary(results, task)
    (out / "sweep.json").write_text(json.dumps({"task": task.name, "summary": s, "results": results}, indent=1))
    (out / "sweep.md").write_text(markdown(results, s, task))
    plot(s, out / "sweep.png", task)
    return s


def sweep(names: list[str], out: Path, jobs: int = 1, timeout: float = 120.0, compiled: bool = False,
          task: str = "causal-lm") -> dict:
    """Runs `names` (model types in `task`'s auto mapping) and writes the reports into `out`."""
    spec = TASKS[task]
    (out / "models").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    results: dict[str, dict] = {}
    lock = threading.Lock()
    start = time.perf_counter()

    def one(name):
        r = run_one(name, out, timeout, compiled, spec)
        with lock:
            results[name] = r
            ok = "pass" if all(passed(r, st) for st in spec.stages) else next(
                f"FAIL {st}: {r['stages'][st]['detail'][:100]}" for st in spec.stages
                if not passed(r, st) and st in r["stages"])
            print(f"[{len(results)}/{len(names)} {time.perf_counter() - start:.0f}s] {name}: {ok}", flush=True)
            write_reports([results[n] for n in names if n in results], out, spec)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, names))
    return write_reports([results[n] for n in names], out, spec)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="torchneuron-sweep", description=__doc__)
    p.add_argument("--task", default="causal-lm", choices=sorted(TASKS),
                   help="which transformers auto mapping to sweep (default: causal-lm)")
    p.add_argument("--only", help="comma-separated model types (default: every architecture of the task)")
    p.add_argument("--skip", default="", help="comma-separated model types to leave out")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per architecture")
    p.add_argument("--out", default="sweep-out")
    p.add_argument("--compile", action="store_true", help="run the neuron stages through torch.compile")
    a = p.parse_args(argv)
    names = a.only.split(",") if a.only else architectures(a.task)
    names = [n for n in names if n not in set(a.skip.split(","))]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    s = sweep(names, Path(a.out), a.jobs, a.timeout, a.compile, a.task)
    print(f"{s['neuron_pass']}/{s['cpu_pass']} architectures that run on CPU pass on neuron "
          f"({100 * s['neuron_share']:.1f}%); reports in {a.out}/sweep.md")
