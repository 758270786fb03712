"""TORCHNEURON_LOG=recompiles for eager ops: each plan an op builds for new shapes of a call it
already ran, with the sizes that changed and why they were not served by an existing executable."""
from __future__ import annotations

import sys

from . import buckets
from .describe import CallDescription
from .schema import OpSchema

# An op not bucketed runs at its exact sizes: a size it has not run at compiles a new executable.
EXACT_SIZES = "eager runs this op at its exact sizes"


def _shapes(key) -> list:
    return [entry[0] for entry in key if isinstance(entry, tuple) and entry and isinstance(entry[0], tuple)]


def _structure(key) -> tuple:
    """A plan key without its sizes: ranks, dtypes, sharing, device."""
    return tuple((len(e[0]), *e[3:]) if isinstance(e, tuple) and e and isinstance(e[0], tuple) else e
                 for e in key)


def log_new_plan(schema: OpSchema, plans: dict, key, desc: CallDescription) -> None:
    structure = _structure(key)
    earlier = [k for k in plans if k is not key and _structure(k) == structure]
    if not earlier:
        return
    new = _shapes(key)
    changed = sorted({(i, d) for old in earlier for i, (a, b) in enumerate(zip(_shapes(old), new))
                      for d in range(len(b)) if a[d] != b[d]})
    dims = ", ".join(f"tensor {i} dim {d}" for i, d in changed) or "strides or offsets"
    print(f"torchneuron recompile: {schema.op} for shapes {[list(s) for s in new]} "
          f"({len(earlier)} earlier plan(s) of the same call differ in {dims}): not bucketed: "
          f"{buckets.why_not() or EXACT_SIZES}",
          file=sys.stderr)
