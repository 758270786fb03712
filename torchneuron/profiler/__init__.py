"""Device timing for `torch.profiler`: each neuron op as a range that includes its device time.

While a profiler records, every eager op on neuron runs inside a range named
`neuron::<op>` (for example `neuron::aten.add.Tensor`) that waits for the device before it
closes, so its duration is the op's device time; a call that builds and compiles a new plan
is named `neuron::compile <op>` instead. Outside profiling the driver pays one check per op.

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(x)
    prof.export_chrome_trace("trace.json")
    print(torchneuron.profiler.top_ops(prof, 10))
"""
from __future__ import annotations

import torch

from ..eager import driver

PREFIX = "neuron::"
COMPILE = PREFIX + "compile "


def install() -> None:
    driver.set_op_hook(torch._C._autograd._profiler_enabled, profiled_run)


def profiled_run(schema, plans, args, kwargs, run):
    """One eager call inside its range; the range waits for the device before it closes."""
    new = not driver.is_planned(schema, plans, args, kwargs)
    with torch.profiler.record_function(f"{COMPILE if new else PREFIX}{schema.op}"):
        out = run(schema, plans, args, kwargs)
        torch.neuron.synchronize()
    return out


def top_ops(prof, n: int = 10) -> str:
    """A table of the `n` neuron ops (and compiles) with the most device time."""
    rows = {}
    for e in prof.events():
        if e.name.startswith(PREFIX):
            total, count = rows.get(e.name, (0.0, 0))
            rows[e.name] = (total + e.cpu_time_total, count + 1)
    lines = [f"{'op':<60} {'calls':>6} {'total ms':>10} {'mean us':>10}"]
    for name, (total, count) in sorted(rows.items(), key=lambda r: -r[1][0])[:n]:
        lines.append(f"{name:<60} {count:>6} {total / 1000:>10.3f} {total / count:>10.1f}")
    return "\n".join(lines)
