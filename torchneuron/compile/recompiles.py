"""torch.compile's counters (graphs, executable compiles, cache hits, graphs run eagerly or in
segments) and the reason for every recompilation."""
from __future__ import annotations

import collections

from .. import config
from .interpret import is_array

STATS = collections.Counter()
_reasons: list[str] = []


def compile_stats() -> dict:
    """Counts of graphs compiled, executable compiles, cache hits, eager-run graphs, and the reason
    for every recompilation."""
    return {**STATS, "recompile_reasons": list(_reasons)}


class Signatures:
    """The input signatures one graph compiled for: each after the first is a recompilation, its
    reason noted (and printed with TORCHNEURON_LOG=recompiles)."""

    def __init__(self, name: str):
        self.name = name
        self.seen: set = set()

    def note(self, arrays) -> None:
        signature = tuple((a.shape, a.dtype) if is_array(a) else a for a in arrays)
        if self.seen:
            reason = f"{self.name}: new input signature {_describe_change(self.seen, signature)}"
            _reasons.append(reason)
            if "recompiles" in config.LOG:
                print(f"torchneuron recompile: {reason}")
        self.seen.add(signature)


def _describe_change(seen, signature) -> str:
    previous = next(iter(seen))
    changes = [f"input {i}: {a} -> {b}" for i, (a, b) in enumerate(zip(previous, signature)) if a != b]
    return "; ".join(changes[:3]) or "different number of inputs"
