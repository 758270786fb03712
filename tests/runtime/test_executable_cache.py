"""The executable cache: bounded memory over endless shapes, eviction, and the persistent cache on
disk shared by processes (issue 14, items 1, 2 and 6)."""
from __future__ import annotations

import os
import pickle
import subprocess

import numpy as np
import pytest
import torch

import torchneuron
from torchneuron.eager import driver
from torchneuron.runtime import executables
from torchneuron.testing.processes import last_json, run_code, start_code

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# These tests count each eager op's own executable (compiled, loaded, evicted, promoted) at its
# call: strict eager, here and in the processes they start, whatever TORCHNEURON_EAGER says (fused
# eager's segments have their own tests in test_fused_eager.py).
@pytest.fixture(autouse=True)
def _strict_eager():
    with torchneuron.eager_mode("strict"):
        yield


def _environment(**env) -> dict:
    return {"PYTHONPATH": ROOT, "TORCHNEURON_EAGER": "strict", **env}


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return run_code(code, env=_environment(**env), timeout=600, cwd=ROOT, ok=False)


def _cold_and_warm(code: str, cache_dir) -> tuple[dict, dict]:
    """The JSON last printed by `code` run in a process with an empty cache, then in a second one."""
    runs = []
    for _ in range(2):
        run = _run(code, TORCHNEURON_CACHE_DIR=str(cache_dir))
        assert run.returncode == 0, run.stderr[-3000:]
        runs.append(last_json(run.stdout))
    return runs[0], runs[1]


def test_an_evicted_plan_compiles_again_and_gives_the_same_result(monkeypatch):
    # (exact plans: bucketed, the third call would run at the bucket the first two sizes make,
    # which also widens its input first)
    monkeypatch.setattr(torchneuron.config, "EAGER_BUCKETS", False)
    limit = executables.CACHE.limit
    op = torch.ops.aten.mul.Tensor
    try:
        a, b = torch.randn(3, 5), torch.randn(6, 5)
        first = a.to("neuron") * 3
        executables.set_cache_limit(1)  # only the newest executable stays
        second = b.to("neuron") * 3
        stats = executables.cache_stats()
        assert stats["entries"] == 1 and stats["evictions"] >= 1
        assert not any(k[0][0] == (3, 5) for k in driver.plans_of(op))  # its plan went with it
        misses = stats["misses"]
        again = a.to("neuron") * 3
        assert executables.cache_stats()["misses"] == misses + 1  # compiled again
        torch.testing.assert_close(first.cpu(), a * 3)
        torch.testing.assert_close(again.cpu(), a * 3)
        torch.testing.assert_close(second.cpu(), b * 3)
    finally:
        executables.set_cache_limit(limit)


def test_cache_stats_reports_what_the_issue_names():
    x = torch.randn(4, 3).to("neuron")
    before = torchneuron.cache_stats()
    y = x.add(1)
    y = x.add(1)
    after = torchneuron.cache_stats()
    for key in ("entries", "bytes", "hits", "misses", "evictions", "compiles", "disk_hits", "limit"):
        assert key in after
    assert after["hits"] >= before["hits"] + 1
    assert after["bytes"] > 0 and after["entries"] > 0
    torch.testing.assert_close(y.cpu(), x.cpu() + 1)


def test_memory_stays_within_the_bound_over_a_thousand_shapes():
    result = _run("""
        import json, torch, torchneuron
        from torchneuron.eager import driver
        def resident():
            return int(open('/proc/self/statm').read().split()[1]) * 4096
        def step(n):
            return (torch.ones(n, 3).to('neuron') * 2).cpu()
        for n in range(1, 201):
            assert torch.equal(step(n), torch.full((n, 3), 2.0))
        start = resident()
        for n in range(201, 1001):
            assert torch.equal(step(n), torch.full((n, 3), 2.0))
        stats = torchneuron.cache_stats()
        stats['growth'] = resident() - start
        stats['plans'] = len(driver.plans_of(torch.ops.aten.mul.Tensor))
        print(json.dumps(stats))
    """, TORCHNEURON_CACHE_LIMIT="48M", TORCHNEURON_CACHE_DIR="0",
        TORCHNEURON_EAGER_BUCKETS="0")  # (bucketed, mul compiles once per power of two)
    assert result.returncode == 0, result.stderr[-3000:]
    stats = last_json(result.stdout)
    assert stats["misses"] >= 1000 and stats["evictions"] >= 900  # mul for every length
    assert stats["bytes"] <= 48 << 20 and stats["plans"] <= stats["entries"]
    # Unbounded, 800 lengths grew about 1.2 GB here; bounded, the cache's own bound plus the
    # executables compiled between two clears of JAX's caches.
    assert stats["growth"] < 150 << 20, stats


_PROGRAM = """
    import json, torch, torchneuron
    from torchneuron.compile import compile_stats
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    f = torch.compile(lambda t: torch.tanh(t @ t.T).sum(1), backend="neuron")
    eager = (x.to('neuron') * 2 + 1).softmax(1).cpu()
    compiled = f(x.to('neuron')).cpu()
    stats = torchneuron.cache_stats()
    print(json.dumps({"eager": eager.tolist(), "compiled": compiled.tolist(), "compiles": stats["compiles"],
                      "disk_hits": stats["disk_hits"], "untraced": stats["untraced_loads"],
                      "eager_entries": stats["entries_by_kind"].get("eager", 0), "cache": stats["persistent_cache"]}))
"""


def test_a_second_process_finds_the_first_ones_executables(tmp_path):
    cold, warm = _cold_and_warm(_PROGRAM, tmp_path)
    assert cold["cache"] == str(tmp_path) and cold["compiles"] > 0
    assert warm["compiles"] == 0 and warm["disk_hits"] == cold["compiles"] + cold["disk_hits"]
    # the eager plans' programs load by name, without being traced again
    assert cold["untraced"] == 0 and warm["untraced"] == warm["eager_entries"] > 0
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    for run in (cold, warm):
        torch.testing.assert_close(torch.tensor(run["eager"]), (x * 2 + 1).softmax(1))
        torch.testing.assert_close(torch.tensor(run["compiled"]), torch.tanh(x @ x.T).sum(1))


_PREFETCH_PROGRAM = """
    import json, os, torch, torchneuron
    torch.manual_seed(0)
    x = torch.randn(6, 5).to('neuron')
    ops = [torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid, torch.relu, torch.sqrt, torch.abs,
           torch.neg, torch.floor, lambda t: t.softmax(1), lambda t: t.sum(0), lambda t: t @ t.T]
    if os.environ.get("OTHER_ORDER"):  # another program: the first op, then others in another order
        ops = ops[:1] + ops[:0:-1]
    values = [op(x).cpu().tolist() for op in ops]
    with torchneuron.eager_mode("fused"):
        y = ((x * 2 + 1).tanh() - x).sum(1)
        values.append(y.cpu().tolist())
    stats = torchneuron.cache_stats()
    print(json.dumps({"values": values, "compiles": stats["compiles"], "disk_hits": stats["disk_hits"],
                      "prefetched": stats["prefetched"], "prefetch_hits": stats["prefetch_hits"]}))
"""


def _prefetch_reference(other_order: bool = False) -> list:
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    ops = [torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid, torch.relu, torch.sqrt, torch.abs,
           torch.neg, torch.floor, lambda t: t.softmax(1), lambda t: t.sum(0), lambda t: t @ t.T]
    if other_order:
        ops = ops[:1] + ops[:0:-1]
    return [op(x) for op in ops] + [((x * 2 + 1).tanh() - x).sum(1)]


def _assert_prefetch_values(run: dict, other_order: bool = False) -> None:
    for got, want in zip(run["values"], _prefetch_reference(other_order), strict=True):
        torch.testing.assert_close(torch.tensor(got), want, equal_nan=True)


def _prefetch_run(cache_dir, **env) -> dict:
    """_PREFETCH_PROGRAM's report from a process on `cache_dir`."""
    run = _run(_PREFETCH_PROGRAM, TORCHNEURON_CACHE_DIR=str(cache_dir), **env)
    assert run.returncode == 0, run.stderr[-3000:]
    return last_json(run.stdout)


def test_a_warm_process_loads_ahead_the_programs_the_one_before_asked_for(tmp_path):
    cold, warm, third = (_prefetch_run(tmp_path) for _ in range(3))
    assert cold["compiles"] >= 14 and cold["prefetched"] == cold["prefetch_hits"] == 0
    for run in (warm, third):
        assert run["compiles"] == 0 and run["disk_hits"] == cold["compiles"]
        # the first program's load starts the worker, which loads those that followed it in the
        # process before, ahead of their calls (all but one or two on an idle machine; a program the
        # calling thread asks for before the worker reaches it is loaded there, not twice)
        assert run["prefetch_hits"] >= run["disk_hits"] // 2 and run["prefetched"] >= run["prefetch_hits"]
    for run in (cold, warm, third):
        _assert_prefetch_values(run)


@pytest.mark.parametrize("env", [{"TORCHNEURON_CACHE_PREFETCH": "0"}, {"OTHER_ORDER": "1"}],
                         ids=["prefetching off", "another order"])
def test_a_warm_process_without_loading_ahead_or_asking_in_another_order_gets_its_programs(tmp_path, env):
    # off: every program loads on the calling thread; another order: the worker loads what the
    # process before asked for next, and this one asks for others first
    _prefetch_run(tmp_path)
    warm = _prefetch_run(tmp_path, **env)
    assert warm["compiles"] == 0 and warm["disk_hits"] > 0
    if "TORCHNEURON_CACHE_PREFETCH" in env:
        assert warm["prefetched"] == warm["prefetch_hits"] == 0
    _assert_prefetch_values(warm, other_order="OTHER_ORDER" in env)


_FACTORY_PROGRAM = """
    import json, torch, torchneuron
    from jax._src.interpreters import mlir
    from torchneuron.runtime import storages
    lowered = []
    lower = mlir.lower_jaxpr_to_module
    mlir.lower_jaxpr_to_module = lambda *a, **k: lowered.append(1) or lower(*a, **k)
    values, cores = [], []
    for t in (torch.arange(6, device='neuron:1'), torch.full((5,), 2.5, device='neuron:1'),
              torch.zeros(7, device='neuron:1'), torch.empty(3, device='neuron:1')):
        cores.append([d.id for d in storages.buffer_of(t).devices()])  # (a storage never written: zeros)
        values.append(t.sum().item())
    stats = torchneuron.cache_stats()
    print(json.dumps({"values": values, "cores": cores, "lowered": len(lowered), "compiles": stats["compiles"],
                      "untraced": stats["untraced_loads"], "disk_hits": stats["disk_hits"]}))
"""


def test_a_second_process_loads_factories_and_zeros_untraced_onto_their_core(tmp_path):
    # programs without a device array among their arguments are loaded onto their own device: they
    # were traced and lowered again in every process
    cold, warm = _cold_and_warm(_FACTORY_PROGRAM, tmp_path)
    assert cold["compiles"] > 0 and cold["lowered"] > 0
    assert warm["compiles"] == 0 and warm["lowered"] == 0
    assert warm["untraced"] == warm["disk_hits"] > 0
    for run in (cold, warm):
        assert run["values"] == [15.0, 12.5, 0.0, 0.0]
        assert run["cores"] == [[1]] * 4


_WEIGHED_PROGRAM = """
    import json, os, torch, torchneuron
    from torchneuron.runtime import compilation_cache, executables
    if os.environ.get("STORE_AS_SECONDS"):  # the first process: its compiles recorded as that long
        store = compilation_cache.store
        compilation_cache.store = lambda key, compiled, seconds, messages: store(key, compiled, float(os.environ["STORE_AS_SECONDS"]), messages)
    x = torch.randn(7, 19).to("neuron")
    y = torch.sinh(x).cpu()
    tiered = [e for f, s in executables.CACHE.entries for e in [f.signatures[s]]
              if f.name == "aten.sinh.default" and isinstance(e, executables._Tiered)]
    print(json.dumps({"weighed": tiered[0].compile_seconds, "untraced": torchneuron.cache_stats()["untraced_loads"]}))
"""


def test_a_program_loaded_from_disk_weighs_its_promotion_by_its_compile_time(tmp_path):
    """A quick program loaded from the cache loads in a few ms; its promotion to full optimisation
    is still weighed against what compiling it cost (stored with it), or a warm process would
    promote, and compile at full optimisation, programs the process that compiled them did not."""
    cold = _run(_WEIGHED_PROGRAM, TORCHNEURON_CACHE_DIR=str(tmp_path), STORE_AS_SECONDS="123.0")
    warm = _run(_WEIGHED_PROGRAM, TORCHNEURON_CACHE_DIR=str(tmp_path))
    for run in (cold, warm):
        assert run.returncode == 0, run.stderr[-3000:]
    cold, warm = last_json(cold.stdout), last_json(warm.stdout)
    assert cold["untraced"] == 0 and warm["untraced"] >= 1
    assert cold["weighed"] < 100 and warm["weighed"] == 123.0


_LINALG_PROGRAM = """
    import json, torch, torchneuron
    torch.manual_seed(0)
    a = torch.randn(4, 4)
    spd = a @ a.T + 4 * torch.eye(4)
    x = spd.to("neuron")
    results = {"cholesky": torch.linalg.cholesky(x), "solve": torch.linalg.solve(x, x[:, :2]),
               "eigvalsh": torch.linalg.eigvalsh(x), "det": torch.linalg.det(x)}
    print(json.dumps({"untraced": torchneuron.cache_stats()["untraced_loads"],
                      **{k: v.cpu().tolist() for k, v in results.items()}}))
"""


def test_a_second_process_runs_linalg_programs_loaded_untraced(tmp_path):
    # LAPACK-backed programs loaded by name must not find the LAPACK routines unset (a SIGSEGV)
    runs = [_run(_LINALG_PROGRAM, TORCHNEURON_CACHE_DIR=str(tmp_path)) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    cold, warm = (last_json(run.stdout) for run in runs)
    assert cold["untraced"] == 0 and warm["untraced"] > 0
    torch.manual_seed(0)
    a = torch.randn(4, 4)
    spd = a @ a.T + 4 * torch.eye(4)
    expected = {"cholesky": torch.linalg.cholesky(spd), "solve": torch.linalg.solve(spd, spd[:, :2]),
                "eigvalsh": torch.linalg.eigvalsh(spd), "det": torch.linalg.det(spd)}
    for run in (cold, warm):
        for name, value in expected.items():
            torch.testing.assert_close(torch.tensor(run[name]), value, rtol=1e-4, atol=1e-4, msg=name)


# Ops whose result layouts, dtypes and integer results come from their meta kernels, each in a way
# a stored plan must give back: a gapped view's strides kept by clone, TensorIterator's permuted
# output, several fresh results, values with indices, a promoted dtype, an out= tensor, in place.
_PLANS_PROGRAM = """
    import json, os, torch, torchneuron
    device = os.environ.get("DEVICE", "neuron")
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    ids = torch.arange(12).reshape(1, 12)
    def values(device):
        a, i = x.to(device), ids.to(device)
        out = torch.empty(3, 8, device=device)
        y = a.clone()
        y.add_(1.5)
        results = {
            "clone_gapped": i[:, -1:].clone(),
            "permuted_add": a.t() + a.t(),
            "layer_norm": torch.native_layer_norm(a, (8,), None, None, 1e-5),
            "max_dim": a.max(dim=1),
            "promoted": i.float() * 0.5 + i,
            "out": torch.add(a, 2.0, out=out),
            "in_place": y,
            "sorted": a.sort(dim=0),
        }
        flat = {}
        for name, value in results.items():
            for k, t in enumerate(value if isinstance(value, tuple) else (value,)):
                flat[f"{name}{k}"] = {"values": t.cpu().tolist(), "stride": list(t.stride()), "dtype": str(t.dtype)}
        return flat
    flat = values(device)
    stats = torchneuron.eager_stats() if device == "neuron" else {}
    print(json.dumps({"results": flat, "built": stats.get("plans_built"), "loaded": stats.get("plans_loaded")}))
"""


def test_a_second_process_reads_the_plans_the_first_built(tmp_path):
    """A warm process runs no meta kernel for plans a process before it built: it reads what they
    told (layouts, dtypes, integer results, the program's name) from the persistent cache, and its
    results keep CPU's values, strides and dtypes."""
    cold, warm = _cold_and_warm(_PLANS_PROGRAM, tmp_path)
    cpu = _run(_PLANS_PROGRAM, DEVICE="cpu", TORCHNEURON_CACHE_DIR="0")
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    expected = last_json(cpu.stdout)["results"]
    assert cold["loaded"] == 0 and cold["built"] > 10
    assert warm["built"] == 0 and warm["loaded"] == cold["built"]
    for run in (cold, warm):
        assert run["results"].keys() == expected.keys()
        for name, want in expected.items():
            got = run["results"][name]
            assert got["stride"] == want["stride"] and got["dtype"] == want["dtype"], name
            torch.testing.assert_close(torch.tensor(got["values"]), torch.tensor(want["values"]), msg=name)


def _unpickled(path):
    try:
        return pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001  (executables, and other entries)
        return None


def test_a_process_whose_first_plan_is_the_same_reads_the_others_from_one_bundle(tmp_path):
    cold, _ = _cold_and_warm(_PLANS_PROGRAM, tmp_path)
    removed = 0
    for entry in tmp_path.iterdir():  # every plan's own record: only the bundle is left to read them from
        value = _unpickled(entry)
        if type(value) is tuple and len(value) == 5:
            entry.unlink()
            removed += 1
    assert removed == cold["built"]
    run = _run(_PLANS_PROGRAM, TORCHNEURON_CACHE_DIR=str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    bundled = last_json(run.stdout)
    assert bundled["built"] == 0 and bundled["loaded"] == cold["built"]
    assert bundled["results"] == cold["results"]


def test_a_torn_stored_plan_is_built_again(tmp_path):
    _cold_and_warm(_PLANS_PROGRAM, tmp_path)
    for entry in tmp_path.iterdir():  # every entry torn: plans, programs, values
        if entry.is_file() and entry.name.startswith("torchneuron-"):
            entry.write_bytes(entry.read_bytes()[:7])
    run = _run(_PLANS_PROGRAM, TORCHNEURON_CACHE_DIR=str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    torn = last_json(run.stdout)
    assert torn["loaded"] == 0 and torn["built"] > 10
    cpu = last_json(_run(_PLANS_PROGRAM, DEVICE="cpu", TORCHNEURON_CACHE_DIR="0").stdout)["results"]
    for name, want in cpu.items():
        assert torn["results"][name]["stride"] == want["stride"], name
        torch.testing.assert_close(torch.tensor(torn["results"][name]["values"]), torch.tensor(want["values"]))


def test_concurrent_processes_share_one_cache_directory(tmp_path):
    env = _environment(TORCHNEURON_CACHE_DIR=str(tmp_path))
    procs = [start_code(_PROGRAM, env=env, cwd=ROOT) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    runs = [last_json(out) for out, _ in outputs]
    assert runs[0]["eager"] == runs[1]["eager"] and runs[0]["compiled"] == runs[1]["compiled"]
    third = last_json(_run(_PROGRAM, TORCHNEURON_CACHE_DIR=str(tmp_path)).stdout)
    assert third["compiles"] == 0 and third["eager"] == runs[0]["eager"]


@pytest.mark.parametrize("setting", ["", "0"])
def test_an_empty_or_zero_cache_dir_turns_the_cache_off(setting):
    run = _run(_PROGRAM, TORCHNEURON_CACHE_DIR=setting)
    assert run.returncode == 0, run.stderr[-3000:]
    assert last_json(run.stdout)["cache"] is None and last_json(run.stdout)["disk_hits"] == 0


def test_an_unusable_cache_directory_warns_and_runs_uncached(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    run = _run(_PROGRAM, TORCHNEURON_CACHE_DIR=str(blocker / "cache"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "is not usable" in run.stderr and "compiling without a persistent cache" in run.stderr
    result = last_json(run.stdout)
    assert result["cache"] is None and result["compiles"] > 0
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    torch.testing.assert_close(torch.tensor(result["eager"]), (x * 2 + 1).softmax(1))


def test_a_failing_cache_write_warns_once_and_turns_the_cache_off(tmp_path):
    run = _run("""
        import errno, json, warnings, torch
        import torchneuron
        from torchneuron.runtime import compilation_cache
        def full_disk(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")
        # the one store both JAX's writes (unnamed programs) and ours (named ones) go through
        compilation_cache.DirectoryStore.put = full_disk
        with warnings.catch_warnings(record=True) as caught:  # (the default filters)
            values = [(torch.arange(n).to('neuron') * 3).sum().item() for n in range(3, 9)]
        ours = [str(w.message) for w in caught if "compilation cache" in str(w.message)]
        print(json.dumps({"values": values, "warnings": ours, "cache": torchneuron.cache_stats()["persistent_cache"]}))
    """, TORCHNEURON_CACHE_DIR=str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    result = last_json(run.stdout)
    assert result["values"] == [3 * n * (n - 1) // 2 for n in range(3, 9)]
    assert len(result["warnings"]) == 1 and "No space left" in result["warnings"][0]
    assert result["cache"] is None


def test_recompiles_log_names_the_op_and_the_changed_sizes():
    run = _run("""
        import torch, torchneuron
        for n in (3, 4):
            (torch.ones(n, 2).to('neuron') * 2).cpu()
    """, TORCHNEURON_LOG="recompiles", TORCHNEURON_CACHE_DIR="0")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if "torchneuron recompile: aten.mul.Tensor" in line]
    assert len(lines) == 1 and "[[4, 2]]" in lines[0] and "tensor 0 dim 0" in lines[0]


def test_the_store_writes_whole_entries_and_prunes_the_oldest(tmp_path, monkeypatch):
    from torchneuron.runtime import compilation_cache
    monkeypatch.setattr(compilation_cache, "DISK_LIMIT", 4000)
    (tmp_path / compilation_cache.PRUNED_MARKER).touch()  # (pruned just now: no prune on the first write)
    store = compilation_cache.DirectoryStore(str(tmp_path))
    for i in range(5):
        store.put(f"entry-{i}", bytes([i]) * 1000)
        os.utime(tmp_path / f"entry-{i}", (i, i))  # written in order, oldest first
    assert store.get("entry-3") == bytes([3]) * 1000 and store.get("absent") is None
    assert not list(tmp_path.glob(".partial-*"))  # every write renamed into place
    store.prune()  # 5000 bytes over a bound of 4000: down to 3000, oldest first
    assert sorted(p.name for p in tmp_path.iterdir()) == [compilation_cache.PRUNED_MARKER, "entry-2", "entry-3",
                                                          "entry-4"]


def test_a_process_prunes_on_its_first_write_at_most_once_in_a_while(tmp_path, monkeypatch):
    # opening the store scans nothing (every `import torch` opens it); the first write prunes on the
    # worker thread unless some process pruned in the last PRUNE_EVERY seconds
    from torchneuron.runtime import compilation_cache
    monkeypatch.setattr(compilation_cache, "DISK_LIMIT", 4000)
    marker = tmp_path / compilation_cache.PRUNED_MARKER

    def fill():  # 5000 bytes, over the bound, the oldest first
        for i in range(5):
            (tmp_path / f"old-{i}").write_bytes(bytes([i]) * 1000)
            os.utime(tmp_path / f"old-{i}", (i + 1, i + 1))

    def names():
        return sorted(p.name for p in tmp_path.iterdir() if p.name != compilation_cache.PRUNED_MARKER)

    fill()
    store = compilation_cache.DirectoryStore(str(tmp_path))
    assert names() == [f"old-{i}" for i in range(5)] and not marker.exists()
    store.put("new-0", b"x" * 10)
    compilation_cache._PRUNER.wait()
    assert names() == ["new-0", "old-3", "old-4"] and marker.exists()  # down to 2010 bytes, oldest first
    fill()
    compilation_cache.DirectoryStore(str(tmp_path)).put("new-1", b"x" * 10)  # another process, just after
    compilation_cache._PRUNER.wait()
    assert names() == ["new-0", "new-1", *[f"old-{i}" for i in range(5)]]
    os.utime(marker, (1, 1))  # the last prune long ago
    compilation_cache.DirectoryStore(str(tmp_path)).put("new-2", b"x" * 10)
    compilation_cache._PRUNER.wait()
    assert names() == ["new-0", "new-1", "new-2", "old-3", "old-4"]


def test_one_function_serves_both_cores():
    # the runtime's strided reader is one Function per layout: its executable for neuron:0 refuses a
    # buffer on neuron:1 (a ValueError, not a TypeError) and it compiles one for that core too
    expected = torch.arange(12.0)[1::3]
    for core in (0, 1, 0):
        torch.testing.assert_close(torch.arange(12.0).to(f"neuron:{core}")[1::3].cpu(), expected)


def _entries_of(op_name: str, shape: tuple) -> list:
    """The executables of `op_name` for calls on `shape` buffers (a storage's buffer is flat)."""
    return [f.signatures[s] for f, s in executables.CACHE.entries
            if f.name == op_name and any(leaf[0] == shape for leaf in s[1:])]


@pytest.mark.parametrize("in_place", [False, True])
def test_a_hot_quick_executable_recompiles_at_full_optimisation(monkeypatch, in_place):
    # every check finds the calls worth a full compile: the first check promotes, the next call recompiles
    monkeypatch.setattr(executables, "_TIER_CHECKS", (2, 4))
    monkeypatch.setattr(executables, "_TIER_GAIN", 1e9)
    name = "aten.mul_.Tensor" if in_place else "aten.mul.Tensor"
    x, y = torch.randn(3, 11), torch.randn(3, 11)
    xn, yn = x.to("neuron"), y.to("neuron")
    before = torchneuron.cache_stats()["promotions"]
    expected, got = x.clone(), xn.clone()
    for _ in range(6):
        if in_place:
            expected.mul_(y)
            got.mul_(yn)
        else:
            expected, got = expected * y, got * yn
        torch.testing.assert_close(got.cpu(), expected)
    assert torchneuron.cache_stats()["promotions"] == before + 1
    assert not any(isinstance(e, executables._Tiered) for e in _entries_of(name, (33,)))


def test_a_cheap_quick_executable_stays_quick_and_is_called_bare(monkeypatch):
    monkeypatch.setattr(executables, "_TIER_CHECKS", (2, 4))
    monkeypatch.setattr(executables, "_TIER_GAIN", 0.0)
    x = torch.randn(2, 13)
    xn = x.to("neuron")
    before = torchneuron.cache_stats()["promotions"]
    for _ in range(6):
        torch.testing.assert_close((xn - 2).cpu(), x - 2)
    assert torchneuron.cache_stats()["promotions"] == before
    quick = _entries_of("aten.sub.Tensor", (26,))
    assert quick and not any(isinstance(e, executables._Tiered) for e in quick)


def test_a_promotion_lowers_for_its_own_shapes_when_a_call_of_other_shapes_makes_it_hot():
    """A quick program loaded from disk has no lowered program: when it turns hot the worker lowers
    one for stand-ins of the call's arguments. The call that turns it hot may be one of other shapes
    (a function tries its latest executable first and moves on when that refuses them): the
    promotion must not take those shapes, or the full program that replaces the quick one refuses
    every later call of its own (a fused generate failed this way once its segments came from disk)."""
    import jax.numpy as jnp
    executables.wait_for_promotions()
    function = executables.Function(lambda x: x * 2 + 1, "segment", "promotion test")
    small, large = jnp.arange(9.0), jnp.arange(128.0)
    function(small)
    (quick,) = function.signatures.values()
    assert isinstance(quick, executables._Tiered) and quick.background is not None
    quick.background = (None, None, None)  # as loaded from disk: nothing lowered, nothing to store
    for _ in range(executables._BACKGROUND_AFTER - 2):
        function(small)
    assert quick.calls == executables._BACKGROUND_AFTER - 1
    np.testing.assert_allclose(np.asarray(function(large)), np.arange(128.0) * 2 + 1)
    for _ in range(3):  # the small signature's executable turns hot now, with its own shapes
        function(small)
    executables.wait_for_promotions()
    for x in (small, large):
        np.testing.assert_allclose(np.asarray(function(x)), np.arange(x.size) * 2 + 1)
    assert function.signatures[quick.entry[1]] is not quick  # promoted: the full program serves the small shapes


_CODE_VERSION_PROGRAM = """
    import json
    import torchneuron
    from torchneuron.runtime import compilation_cache
    hashed = []
    real = compilation_cache._hash_code
    compilation_cache._hash_code = lambda *a: hashed.append(1) or real(*a)
    files = compilation_cache._code_files
    if EDITED:  # one source as if edited: another modification time
        compilation_cache._code_files = lambda: [(p, t + 1 if p.endswith("config.py") else t, n) for p, t, n in files()]
    print(json.dumps({"version": compilation_cache._code_version(), "hashed": len(hashed)}))
"""


def test_a_second_process_reads_the_code_version_and_an_edit_hashes_it_again(tmp_path):
    runs = []
    for edited in (False, False, True):
        run = _run(_CODE_VERSION_PROGRAM.replace("EDITED", str(edited)), TORCHNEURON_CACHE_DIR=str(tmp_path))
        assert run.returncode == 0, run.stderr[-3000:]
        runs.append(last_json(run.stdout))
    first, second, edited = runs
    assert first["hashed"] == 1 and second["hashed"] == 0  # (the second lists the files, and reads no source)
    assert second["version"] == first["version"]
    assert edited["hashed"] == 1  # (the same bytes: the same version, hashed again from them)
    assert edited["version"] == first["version"]


def test_a_warm_process_reads_its_small_values_from_one_bundle(tmp_path):
    """Plans' records and fused segments' output shapes: one file read for all of them (and one
    for the code version), where each was a file of its own."""
    program = _PLANS_PROGRAM.replace("import json, os, torch, torchneuron", """import json, os, torch, torchneuron
    from torchneuron.runtime import compilation_cache
    reads = []  # the small values read from their files (misses left out)
    real_read = compilation_cache._read_value
    def counted(key):
        found = real_read(key)
        if found is not None:
            reads.append(key)
        return found
    compilation_cache._read_value = counted""").replace(
        '"loaded": stats.get("plans_loaded")', '"loaded": stats.get("plans_loaded"), "reads": len(reads)')
    runs = [_run(program, TORCHNEURON_CACHE_DIR=str(tmp_path), TORCHNEURON_EAGER=mode) for mode in ("fused", "fused")]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr[-3000:]
    cold, warm = (last_json(run.stdout) for run in runs)
    assert cold["built"] > 10 and cold["reads"] == 0
    assert warm["built"] == 0 and warm["reads"] == 2  # (before: one more for each program's output shapes)
    assert warm["results"] == cold["results"]
