"""Command line: select OpInfos and dtypes, run them in workers, write the report."""
from __future__ import annotations

import argparse
import fnmatch
import json
import shlex
import sys
import time
from pathlib import Path

from . import layouts, report
from .report import DEFAULT_VARIANTS, VARIANTS

DEFAULT_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool", "complex64")
GRADIENT_VARIANTS = ("backward", "forward_ad")


def _layout_names(text: str) -> list[str]:
    """`sparse_coo,sparse_csr` (or one name): the layouts, each checked."""
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in layouts.LAYOUTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown layout {', '.join(unknown)} (choose from {', '.join(layouts.LAYOUTS)})")
    return names


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchneuron-conformance", description=__doc__)
    p.add_argument("--ops", nargs="*", default=["*"], help="OpInfo names or globs (name.variant for variants)")
    p.add_argument("--dtypes", nargs="*", default=list(DEFAULT_DTYPES), help="dtype names, e.g. float32 int64")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--timeout", type=float, default=300, help="seconds per op (all its dtypes)")
    p.add_argument("--max-samples", type=int, default=8, help="sample inputs per op x dtype x variant")
    p.add_argument("--out", type=Path, default=Path("conformance"), help="output folder")
    p.add_argument("--variants", nargs="*", choices=VARIANTS, default=list(DEFAULT_VARIANTS),
                   help="what to compare (default: all but errors); `--variants errors` for error parity alone")
    p.add_argument("--no-backward", action="store_true", help="skip gradient checks (reverse and forward mode)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--layouts", nargs="+", type=_layout_names, metavar="LAYOUT",
                   help="run PyTorch's sparse OpInfo samples of these layouts instead (sparse_coo,sparse_csr,... "
                        f"of {','.join(layouts.LAYOUTS)}; the report is layouts.md)")
    p.add_argument("--from-records", type=Path, nargs="+", metavar="JSONL",
                   help="write the report from (partial) runs' records.jsonl instead of running; with "
                        "several files a later record replaces an earlier one of the same op and dtype")
    return p


def select(op_db, patterns, dtypes) -> list[tuple[str, list[str]]]:
    """(full name, [dtype names]) for each selected OpInfo with a requested dtype that CPU supports."""
    import torch

    from .runner import full_name

    wanted = [getattr(torch, d) for d in dtypes]
    tasks = []
    for op in op_db:
        name = full_name(op)
        if not any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(op.name, p) for p in patterns):
            continue
        supported = op.supported_dtypes("cpu")
        chosen = [str(d).removeprefix("torch.") for d in wanted if d in supported]
        if chosen:
            tasks.append((name, chosen))
    return tasks


class _Progress:
    """tqdm when installed, else a plain counter line per op."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.done, self.quiet, self.bar = total, 0, quiet, None
        if not quiet:
            try:
                from tqdm import tqdm

                # redraw rarely when logging to a file, where each redraw is appended
                self.bar = tqdm(total=total, unit="op", file=sys.stderr,
                                mininterval=0.5 if sys.stderr.isatty() else 30)
            except ImportError:
                pass

    def update(self, name: str, records) -> None:
        self.done += 1
        worst = ",".join(sorted({r["status"] for r in records}))
        if self.bar is not None:
            self.bar.set_postfix_str(f"{name}: {worst}"[:60], refresh=False)
            self.bar.update()
        elif not self.quiet:
            print(f"[{self.done}/{self.total}] {name}: {worst}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def run_conformance(ops=("*",), dtypes=DEFAULT_DTYPES, jobs=2, timeout=300.0, max_samples=8,
                    out=Path("conformance"), backward=True, quiet=False, command="",
                    variants=DEFAULT_VARIANTS) -> dict:
    """Run the selected OpInfos and write the report to out; returns the summary. `variants` names
    what to compare (VARIANTS); backward=False drops the gradient ones from it."""
    import jax
    import torch

    from .families import family
    from .pool import run_tasks
    from .runner import full_name, load_op_db

    variants = tuple(v for v in variants if backward or v not in GRADIENT_VARIANTS)
    op_db = load_op_db()
    families = {full_name(op): family(op) for op in op_db}
    tasks = select(op_db, list(ops), list(dtypes))
    records: list[dict] = []
    progress = _Progress(len(tasks), quiet)
    Path(out).mkdir(parents=True, exist_ok=True)
    stream = (Path(out) / "records.jsonl").open("w")  # partial results survive an interrupted run

    def done(task, task_records):
        records.extend(task_records)
        stream.writelines(json.dumps(r) + "\n" for r in task_records)
        stream.flush()
        progress.update(task[0], task_records)

    start = time.monotonic()
    try:
        run_tasks(tasks, jobs, timeout, variants, max_samples, families.get, done)
    finally:
        progress.close()
        stream.close()
    meta = {"torch": torch.__version__, "jax": jax.__version__, "seconds": time.monotonic() - start,
            "command": command or "torchneuron-conformance",
            "args": {"ops": list(ops), "dtypes": list(dtypes), "jobs": jobs, "timeout": timeout,
                     "max_samples": max_samples, "variants": list(variants)}}
    return report.write(Path(out), records, meta)


def merge_records(paths: list[Path]) -> list[dict]:
    """The records of several runs, the latest per (op, dtype): a rerun of some ops after a fix
    replaces their earlier records and keeps the rest."""
    latest: dict = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                latest[(record["op"], record["dtype"])] = record
    return list(latest.values())


def report_from_records(paths: list[Path], out: Path, command: str) -> dict:
    import jax
    import torch

    records = merge_records(paths)
    meta = {"torch": torch.__version__, "jax": jax.__version__, "seconds": sum(r["seconds"] for r in records),
            "command": command, "args": {"jobs": 1, "from_records": [str(p) for p in paths]}}
    return report.write(out, records, meta)


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.layouts:
        records = layouts.run([n for names in args.layouts for n in names], args.dtypes if args.dtypes != list(DEFAULT_DTYPES) else ["float32"],
                              min(args.max_samples, 3), args.out, args.timeout * 20)
        counts = {s: sum(r["status"] == s for r in records) for s in dict.fromkeys(r["status"] for r in records)}
        print(f"{len(records)} records by layout: {counts}; report in {args.out}/layouts.md")
        return
    if args.from_records:
        summary = report_from_records(args.from_records, args.out, "torchneuron-conformance " + shlex.join(argv))
    else:
        summary = run_conformance(args.ops, args.dtypes, args.jobs, args.timeout, args.max_samples, args.out,
                                  not args.no_backward, args.quiet,
                                  command="torchneuron-conformance " + shlex.join(argv), variants=args.variants)
    overall = summary["overall"]
    rate = "-" if overall["rate"] is None else f"{100 * overall['rate']:.1f}%"
    print(f"{summary['ops']} ops, {summary['records']} records: pass {rate}; {summary['counts']}; "
          f"report in {args.out}/conformance.md")
