"""Fused eager (torchneuron.eager_mode("fused")): ops are recorded and run as one program when a value
is needed; every result equals strict eager's, every flush has its reason."""
import gc

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron.runtime import deferred
from torchneuron.testing.models import GPT, batches
from torchneuron.testing.processes import run_code, runs_sharing_a_cache


def _flushes():
    return dict(torchneuron.eager_stats()["flushes"])


def _new_flushes(before):
    after = _flushes()
    return {reason: n - before.get(reason, 0) for reason, n in after.items() if n != before.get(reason, 0)}


def _views_and_in_place(x):
    a = x @ x.T + 1
    b = a.relu().sum(0)
    a.add_(2)
    a[1:3].mul_(3)  # through a view
    t = a.t()
    t[0].sub_(b)  # a transposed view's row is a's column
    c = torch.cat([a, b[None]], 0).softmax(-1)
    return a, b, c


def test_values_equal_strict_eager_through_views_and_in_place_ops():
    x = torch.randn(5, 5)
    want = _views_and_in_place(x.clone())
    with torchneuron.eager_mode("fused"):
        got = _views_and_in_place(x.to("neuron"))
        assert torchneuron.eager_stats()["pending_ops"] > 0  # recorded, not run
        got = [t.cpu() for t in got]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_a_segment_runs_once_as_one_program():
    x = torch.randn(64).to("neuron")
    with torchneuron.eager_mode("fused"):
        before = torchneuron.eager_stats()
        y = x
        for _ in range(50):
            y = y * 1.01 + 0.5
        assert torchneuron.eager_stats()["pending_ops"] == before["pending_ops"] + 100
        value = y.cpu()
        after = torchneuron.eager_stats()
    assert after["segments"] == before["segments"] + 1
    assert after["values_out"] == before["values_out"] + 1  # the 99 intermediates died inside the program
    expected = x.cpu()
    for _ in range(50):
        expected = expected * 1.01 + 0.5
    torch.testing.assert_close(value, expected)



@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_python_scalars_keep_their_bits_when_equal_ones_are_shared(mode):
    # a segment reads equal scalars as one input, and the driver converts each value once: 0.0 and
    # -0.0 compare equal but divide differently, NaN equals nothing, 1 and 1.0 and True are
    # different types (int, float, bool results)
    x = torch.tensor([1.0, -2.0, 3.0])
    i = torch.tensor([1, 2, 3])

    def ops(x, i):
        return [x / 0.0, x / -0.0, x * float("nan"), x + float("-nan"), x / -0.0, x / 0.0,
                i * 1, i * 1.0, i * True, i + 2**40, x * 1.5, x * 1.5 + 1.5]

    want = ops(x, i)
    with torchneuron.eager_mode(mode):
        before = torchneuron.eager_stats()["ops"]
        got = [t.cpu() for t in ops(x.to("neuron"), i.to("neuron"))]
        assert torchneuron.eager_stats()["ops"] - before == (13 if mode == "fused" else 0)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, equal_nan=True)
        assert torch.equal(torch.signbit(g), torch.signbit(w))  # -inf stays -inf

@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_fresh_storages_get_their_zeros_inside_the_segment(mode):
    # torch.ones, zeros and empty().fill_() write a storage never written: fused eager records
    # its zeros as a node of the segment, strict eager makes them with a program call of their own
    import numpy as np

    from torchneuron.runtime import storages
    maker = storages._zeros_maker(37, np.dtype("float32"), 0)
    x = torch.arange(37.0).to("neuron")

    def step():
        y = torch.ones(37, device="neuron") * x + torch.full((37,), 2.0, device="neuron")
        z = torch.zeros(37, device="neuron")
        z[5:9] = x[1:5]  # a partial write: the zeros around it are read
        w = torch.empty(37, device="neuron").fill_(-1.5)
        return y, z, w

    first = maker.calls
    with torchneuron.eager_mode(mode):
        [t.cpu() for t in step()]  # (the plans are built)
        before, segments = maker.calls, torchneuron.eager_stats()["segments"]
        for _ in range(3):
            y, z, w = step()
        values = [t.cpu() for t in (y, z, w)]
        ran = torchneuron.eager_stats()["segments"] - segments
    expected_z = torch.zeros(37)
    expected_z[5:9] = torch.arange(1.0, 5.0)
    torch.testing.assert_close(values[0], torch.arange(37.0) + 2)
    torch.testing.assert_close(values[1], expected_z)
    torch.testing.assert_close(values[2], torch.full((37,), -1.5))
    if mode == "fused":  # (the calls that built the plans too: a later call's segment is the first's)
        assert maker.calls == first and ran == 1
    else:
        assert maker.calls >= before + 3 * 3  # (ones, zeros and empty().fill_; full has a lowering of its own)


# Each thing that needs a value flushes, with its reason.
TRIGGERS = {
    "item": (lambda t: t.sum().item(), "value needed"),
    "cpu": (lambda t: t.cpu(), "value needed"),
    "print": (lambda t: repr(t), "value needed"),
    "bool": (lambda t: bool((t > 100).any()), "value needed"),
    "tolist": (lambda t: t.tolist(), "value needed"),
    "nonzero": (lambda t: t.nonzero(), "data-dependent aten.nonzero.default"),
    "masked_select": (lambda t: t.masked_select(t > 0), "data-dependent aten.masked_select.default"),
    "synchronize": (lambda t: torch.neuron.synchronize(), "synchronize"),
    "cpu fallback": (lambda t: torch.poisson(t.abs()), "value needed"),
    "compiled graph": (lambda t: torch.compile(lambda a: a * 2, backend="neuron")(t), "compiled graph"),
}


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("trigger", list(TRIGGERS))
def test_each_trigger_flushes_with_its_reason(trigger):
    use, reason = TRIGGERS[trigger]
    x = torch.randn(3, 4)
    with torchneuron.eager_mode("fused"):
        y = x.to("neuron") * 2 - 1
        before = _flushes()
        assert torchneuron.eager_stats()["pending_ops"] > 0
        use(y)
        assert _new_flushes(before).get(reason, 0) >= 1, _new_flushes(before)
        torch.testing.assert_close(y.cpu(), x * 2 - 1)


@torchneuron.eager_mode("strict")  # (leaving fused mode for strict flushes)
def test_mode_switch_optimizer_step_and_length_flush(monkeypatch):
    p = torch.nn.Parameter(torch.randn(4).to("neuron"))
    optimizer = torch.optim.SGD([p], lr=0.1)
    with torchneuron.eager_mode("fused"):
        (p * p).sum().backward()
        before = _flushes()
        optimizer.step()
        assert _new_flushes(before) == {"optimizer step": 1}
        y = p * 3
        before = _flushes()
    assert _new_flushes(before) == {"mode switch": 1}  # leaving fused mode runs what it recorded
    monkeypatch.setattr(deferred, "MAX_NODES", 8)
    with torchneuron.eager_mode("fused"):
        before = _flushes()
        for _ in range(20):
            y = y + 1
        assert _new_flushes(before) == {"segment length": 2}
        torch.testing.assert_close(y.cpu(), p.detach().cpu() * 3 + 20)


def test_a_loop_that_never_synchronizes_repeats_a_few_segment_programs(monkeypatch):
    """A loop body longer than CUT_AFTER, its results never read inside the loop: segments are cut
    before the body's first op (it reads no pending value), so they repeat one structure instead of
    starting at another phase of the body each time (cut at MAX_NODES alone: a new program each)."""
    monkeypatch.setattr(deferred, "MAX_NODES", 64)
    monkeypatch.setattr(deferred, "CUT_AFTER", 32)
    x = torch.randn(16)

    def body(x):
        for _ in range(25):  # 50 ops
            x = x * 1.001 + 0.001
        return x

    with torchneuron.eager_mode("fused"):
        xn = x.to("neuron")
        before = torchneuron.eager_stats()["segment_compiles"]
        outs = [body(xn) for _ in range(30)]
        outs = [o.cpu() for o in outs]
        compiles = torchneuron.eager_stats()["segment_compiles"] - before
    assert compiles <= 3, f"{compiles} segment programs for 30 runs of one loop body"
    want = body(x)
    for got in outs:
        torch.testing.assert_close(got, want)


def test_errors_are_raised_at_the_call():
    with torchneuron.eager_mode("fused"):
        a, b = torch.ones(2, 3, device="neuron"), torch.ones(4, 5, device="neuron")
        with pytest.raises(RuntimeError, match="same reduction dim|cannot be multiplied"):
            a @ b
        with pytest.raises(RuntimeError, match="must match the size|broadcast"):
            a + b
        assert (a + 1).sum().item() == 12


def test_device_side_assert_in_a_segment_is_raised_at_synchronize():
    values = torch.arange(5.0).to("neuron")
    with torchneuron.eager_mode("fused"):
        index = torch.tensor([1, 9]).to("neuron")
        picked = values[index] * 2  # recorded: the bounds check runs with the segment
        with pytest.raises(RuntimeError, match="out of bounds"):
            torch.neuron.synchronize()
        del picked


def _train(mode, steps, model_kind="gpt"):
    torch.manual_seed(0)
    model = GPT().to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, compiles = [], []
    with torchneuron.eager_mode(mode):
        for x, y in batches(model_kind, steps, batch=4):
            loss = model(x.to("neuron"), y.to("neuron"))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            compiles.append(torchneuron.eager_stats()["segment_compiles"])
    return torch.stack(losses).cpu(), compiles, {n: p.detach().cpu() for n, p in model.named_parameters()}


def test_gpt_training_equals_strict_and_reaches_a_steady_state():
    strict_losses, _, strict_params = _train("strict", 20)
    fused_losses, _, fused_params = _train("fused", 20)
    torch.testing.assert_close(fused_losses, strict_losses, rtol=1e-6, atol=1e-6)
    # (the key projection's bias gets a gradient of pure rounding noise, zero in exact arithmetic, which
    # AdamW scales up to steps of the learning rate's size: fused programs round differently; the rest
    # of the attention projection sees some of that noise too, a thousandth of the learning rate)
    for name, value in strict_params.items():
        if not name.endswith("qkv.bias"):
            tolerance = 5e-5 if name.endswith("qkv.weight") else 1e-5
            torch.testing.assert_close(fused_params[name], value, rtol=1e-5, atol=tolerance)
    _, compiles, _ = _train("fused", 100)  # new data every step, one flush per optimizer step
    assert compiles[-1] - compiles[2] <= 3  # steps 4..100


def test_dropout_draws_as_strict_eager():
    x = torch.ones(1000).to("neuron")
    results = []
    for mode in ("strict", "fused"):
        torch.neuron.manual_seed(7)
        with torchneuron.eager_mode(mode):
            results.append([F.dropout(x, 0.5).cpu() for _ in range(3)])
    for s, f in zip(*results):
        torch.testing.assert_close(f, s)
    assert not torch.equal(results[0][0], results[0][1])  # each call draws anew


def test_memory_after_many_fused_steps_equals_strict():
    # Measured as growth from a baseline taken after a collection: tensors left in reference cycles by
    # earlier tests are otherwise freed by whichever collection happens to run inside one of the loops.
    def loop(mode):
        gc.collect()
        torch.neuron.synchronize()
        baseline = torch.neuron.memory_allocated()
        x = torch.randn(256).to("neuron")
        with torchneuron.eager_mode(mode):
            for _ in range(1000):
                x = (x * 0.5 + 1).tanh()
                x.add_(0.1)
            value = x.cpu()
        gc.collect()
        torch.neuron.synchronize()
        return value, torch.neuron.memory_allocated() - baseline

    strict_value, strict_memory = loop("strict")
    fused_value, fused_memory = loop("fused")
    torch.testing.assert_close(fused_value, strict_value)
    assert fused_memory == strict_memory


# (each a fresh process, ~10-30 s here: None already gives fused, so naming fused is for the slow tier)
@pytest.mark.parametrize("setting", [None, pytest.param("fused", marks=pytest.mark.slow), "strict"])
def test_eager_mode_validates_and_is_set_by_the_environment(setting):
    """Fused by default; TORCHNEURON_EAGER names the mode; eager_mode refuses an unknown one."""
    with pytest.raises(ValueError, match="expected one of"), torchneuron.eager_mode("lazy"):
        pass
    code = ("import torch, torchneuron; x = torch.ones(3, device='neuron') + 1; "
            "s = torchneuron.eager_stats(); print(s['mode'], s['pending_ops'], x.sum().item())")
    out = run_code(code, env={"TORCHNEURON_EAGER": setting}, timeout=120)  # (None: unset)
    mode, pending, total = out.stdout.split()
    assert mode == (setting or "fused") and float(total) == 6.0
    assert (int(pending) >= 1) == (mode == "fused")  # fused recorded the add; strict ran it


_SEGMENT_PROGRAM = """
import json, jax, torch, torch.nn.functional as F, torchneuron
from torchneuron.runtime import executables
traced = []
eval_shape = jax.eval_shape
jax.eval_shape = lambda *a, **k: traced.append(1) or eval_shape(*a, **k)
torch.manual_seed(0)
table, ids = torch.randn(11, 37), torch.tensor([3, 1, 10, 4])
t, i = table.to("neuron"), ids.to("neuron")
results = []
with torchneuron.eager_mode("fused"):
    for step in range(executables._BACKGROUND_AFTER + 2):
        results.append((F.embedding(i, t) * 1.5 + step).tanh().sum(0).cpu().tolist())
executables.wait_for_promotions()
with torchneuron.eager_mode("fused"):
    results.append((F.embedding(i, t) * 1.5 + 9).tanh().sum(0).cpu().tolist())
stats = torchneuron.cache_stats()
segments = [f.signatures[s] for f, s in executables.CACHE.entries if f.kind == "segment"]
print(json.dumps({"results": results, "promotions": stats["promotions"], "compiles": stats["compiles"],
                  "quick_segments": sum(isinstance(e, executables._Tiered) for e in segments),
                  "segments": len(segments), "traced": len(traced)}))
"""


def test_a_hot_segment_compiles_again_at_full_optimisation_and_a_warm_process_loads_that(tmp_path):
    """A segment compiles quick; called `_BACKGROUND_AFTER` times it is compiled again at full
    optimisation on a worker thread and takes the quick one's place. A second process loads the
    full program from the cache, and neither traces a plan nor compiles anything (the plans' output
    shapes are stored too; the embedding's device check is stored with its message)."""
    runs = cold, warm = runs_sharing_a_cache(_SEGMENT_PROGRAM, tmp_path)
    torch.manual_seed(0)
    table, ids = torch.randn(11, 37), torch.tensor([3, 1, 10, 4])
    steps = [*range(len(cold["results"]) - 1), 9]
    expected = [(F.embedding(ids, table) * 1.5 + s).tanh().sum(0) for s in steps]
    for run in runs:
        for got, want in zip(run["results"], expected):
            torch.testing.assert_close(torch.tensor(got), want)
    assert cold["promotions"] >= 1 and cold["segments"] >= 1 and cold["traced"] > 0
    assert cold["quick_segments"] < cold["segments"]  # the hot one runs its full program
    assert warm["compiles"] == 0 and warm["traced"] == 0 and warm["promotions"] == 0
    assert warm["quick_segments"] < warm["segments"]  # loaded at full optimisation


_QUICK_THEN_HOT = """
import json, sys, torch, torchneuron
from torchneuron.runtime import executables
on_calling_thread = []
promote = executables.CACHE.promote
executables.CACHE.promote = lambda *a: on_calling_thread.append(1) or promote(*a)
torch.manual_seed(0)
x = torch.randn(5, 29).to("neuron")
results = []
with torchneuron.eager_mode("fused"):
    for step in range(int(sys.argv[1])):
        results.append(((x * 0.75 + step).sin() * x).sum(1).cpu().tolist())
executables.wait_for_promotions()
stats = torchneuron.cache_stats()
segments = [f.signatures[s] for f, s in executables.CACHE.entries if f.kind == "segment"]
print(json.dumps({"results": results, "promotions": stats["promotions"], "compiles": stats["compiles"],
                  "on_calling_thread": len(on_calling_thread), "segments": len(segments),
                  "quick_segments": sum(isinstance(e, executables._Tiered) for e in segments)}))
"""


def test_a_segment_loaded_quick_from_disk_is_promoted_on_the_worker(tmp_path):
    """A process that ran a segment only a few times stored its quick program; a second process
    loads that one and, once the segment is hot, compiles the full program on the worker thread (it
    has no lowered program: it lowers one there), not on the calling thread in the middle of a call."""
    from torchneuron.runtime import executables
    runs = cold, warm = runs_sharing_a_cache(_QUICK_THEN_HOT, tmp_path,
                                             argvs=[(3,), (executables._BACKGROUND_AFTER + 2,)])
    torch.manual_seed(0)
    x = torch.randn(5, 29)
    for run in runs:
        for step, got in enumerate(run["results"]):
            torch.testing.assert_close(torch.tensor(got), ((x * 0.75 + step).sin() * x).sum(1))
    assert cold["promotions"] == 0 and cold["quick_segments"] == cold["segments"] >= 1  # stored quick
    assert warm["compiles"] == 0 and warm["promotions"] >= 1 and warm["on_calling_thread"] == 0
    assert warm["quick_segments"] == 0  # the hot segment runs its full program now


def test_a_promotion_waits_until_the_calling_thread_stops_compiling(monkeypatch):
    """A hot segment's promotion is queued, but the worker starts it only once the calling thread has
    compiled nothing for `_QUIET_SECONDS` (a cold `generate` compiles a new bucket's segments every few
    dozen steps: a promotion beside them slowed the whole call). Values equal CPU's throughout."""
    from torchneuron.runtime import compilation_cache, executables
    executables.wait_for_promotions()  # (earlier tests' promotions)
    monkeypatch.setattr(executables, "_QUIET_SECONDS", 5.0)
    previous = compilation_cache.directory()  # (off: an earlier run's full program would be loaded instead)
    compilation_cache.enable(None)
    try:
        _promote_after_compiles_stop(executables)
    finally:
        compilation_cache.enable(previous)


def _promote_after_compiles_stop(executables):
    import time
    torch.manual_seed(0)
    x = torch.randn(7, 23)
    d = x.to("neuron")
    before = torchneuron.cache_stats()["promotions"]
    with torchneuron.eager_mode("fused"):
        for step in range(executables._BACKGROUND_AFTER + 2):  # hot: its promotion is queued now
            torch.testing.assert_close(((d * 0.25 + step).cos() * d).sum(1).cpu(), ((x * 0.25 + step).cos() * x).sum(1))
        for op in (torch.sin, torch.exp, torch.tanh, torch.sigmoid, torch.erf, torch.expm1, torch.atan,
                   torch.sinh):  # each a new program, compiled well inside the quiet time of each other
            torch.testing.assert_close(op(d * 0.5).cpu(), op(x * 0.5))
            time.sleep(0.05)
            assert torchneuron.cache_stats()["promotions"] == before  # not while the thread compiles
    executables.wait_for_promotions()
    assert torchneuron.cache_stats()["promotions"] == before + 1  # once it stopped
    with torchneuron.eager_mode("fused"):
        torch.testing.assert_close(((d * 0.25 + 2).cos() * d).sum(1).cpu(), ((x * 0.25 + 2).cos() * x).sum(1))


def test_plans_that_ran_only_inside_segments_go_when_their_segments_go(monkeypatch):
    """A plan recorded in fused eager never compiles a program of its own, so the cache's eviction
    never reached it: each new shape kept a plan forever. It now goes once no cached segment runs it."""
    from torchneuron.eager import driver
    from torchneuron.runtime import executables
    monkeypatch.setattr(torchneuron.config, "EAGER_BUCKETS", False)  # (exact sizes: a plan per length)
    limit = executables.CACHE.limit
    lengths = range(101, 141)
    try:
        executables.set_cache_limit(1)  # only the newest executable stays
        with torchneuron.eager_mode("fused"):
            for n in lengths:
                x = torch.arange(float(n))
                torch.testing.assert_close((x.to("neuron") * 3 + 1).cpu(), x * 3 + 1)
    finally:
        executables.set_cache_limit(limit)
    kept = [key for key in driver.plans_of(torch.ops.aten.mul.Tensor) if key[0][0][0] in lengths]
    assert len(kept) <= 2, kept
