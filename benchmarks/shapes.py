"""New shapes: what a growing or varying size costs, against PyTorch CPU in the same run.

    python benchmarks/shapes.py [--steps 50] [--only generate|train|uploads]

1. A tiny Llama (2 layers, hidden 64, 4 heads, vocab 256) `generate(max_new_tokens=64)`, greedy,
   with no cache chosen (on CPU Hugging Face's dynamic cache: every step's sequence length is new).
   Timed on neuron in a fresh process with an empty persistent cache, in a fresh process with the
   cache the first one filled, and again in the same process (the second call, which may share the
   CPU with background promotions of the first call's hot programs, and the median of the last
   three of six more calls, each once the promotions begun so far are done,
   `executables.wait_for_promotions()`),
   for: the default (fused eager, and a static cache of the bucketed length whose decode steps
   replay as one recorded graph each, torchneuron/integrations/generate.py); transformers' dynamic
   cache in fused eager (TORCHNEURON_GENERATE_GRAPHS=0: a decode step two fused segments, bucketed
   within a bucket) and in strict eager (TORCHNEURON_EAGER=strict); every eager op at its exact
   sizes (TORCHNEURON_EAGER_BUCKETS=0, an empty cache) as the baseline; and on CPU (min of 3).
   Resident memory growth of each neuron run and its XLA compiles (torchneuron.cache_stats()). Each
   neuron run must produce CPU's tokens.
2. The small GPT's training step (torchneuron.testing.models, width 32) compiled with
   `dynamic=True`, over `--steps` steps whose sequence length is drawn from 8..128 (the model's
   context is 128 here): XLA compiles and wall time on neuron with shape buckets, on neuron at exact
   sizes (TORCHNEURON_BUCKETS=0), and inductor on CPU with dynamic=True.

3. A data loader's variable-length batches: 1,000 uploads of distinct lengths (1 to 96,904 floats,
   `torch.randn(n).to("neuron")`), and the same with one op and a read back
   (`(x.to("neuron") * 2).cpu()`): resident memory growth over the 1,000 (each tensor freed before
   the next) and the time per length, against CPU's `torch.randn(n).clone()` (and `* 2`), both
   with one intra-op thread.

Every case runs in its own subprocess, so caches and memory start clean; CPU runs alongside.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GENERATE = """
    import json, time, torch, transformers
    def resident():
        return int(open('/proc/self/statm').read().split()[1]) * 4096
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                      max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, 256, (1, 8))
    device = {device!r}
    if device == 'neuron':
        import torchneuron
    model = model.to(device)
    runs = []
    for call in range({repeats}):
        if call >= 2 and device == 'neuron':  # settled: hot programs' background promotions done
            from torchneuron.runtime import executables  # (each call's own included: they start
            executables.wait_for_promotions()           # as programs reach their 16th call)
        start_memory, start = resident(), time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt.to(device), max_new_tokens=64, do_sample=False, min_new_tokens=64)
        tokens = out.cpu().tolist()
        runs.append({{"seconds": time.perf_counter() - start, "growth": resident() - start_memory}})
    stats = torchneuron.cache_stats() if device == 'neuron' else {{}}
    print(json.dumps({{"runs": runs, "tokens": tokens, "compiles": stats.get("compiles"),
                      "disk_hits": stats.get("disk_hits"), "entries": stats.get("entries"),
                      "bytes": stats.get("bytes"), "evictions": stats.get("evictions")}}))
"""

TRAIN = """
    import json, random, time, torch
    import torch._dynamo
    from torchneuron.testing.models import GPT
    torch._dynamo.config.recompile_limit = 1000
    device, backend = {device!r}, {backend!r}
    if device == 'neuron':
        import torchneuron
        from torchneuron.compile import compile_stats
    torch.manual_seed(0)
    model = GPT(context=128).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    def step(idx, targets):
        loss = model(idx, targets)
        loss.backward()
        return loss
    compiled = torch.compile(step, backend=backend, dynamic=True)
    rng = random.Random(0)
    lengths = [rng.randint(8, 128) for _ in range({steps})]
    start = time.perf_counter()
    for n in lengths:
        idx = torch.randint(0, 64, (4, n)).to(device)
        loss = compiled(idx, torch.roll(idx, -1, 1))
        opt.step()
        opt.zero_grad()
    final = loss.item()
    compiles = compile_stats()["compiles"] if device == 'neuron' else None
    print(json.dumps({{"seconds": time.perf_counter() - start, "compiles": compiles, "loss": final,
                      "lengths": len(set(lengths))}}))
"""

UPLOADS = """
    import json, time, torch
    device, with_op = {device!r}, {with_op!r}
    if device == 'neuron':
        import torchneuron
    # (the host's randn is the same work in both; on a shared machine its two intra-op threads
    # waited on each other for up to 9 ms a length)
    torch.set_num_threads(1)
    def resident():
        return int(open('/proc/self/statm').read().split()[1]) * 4096
    def batch(n):
        x = torch.randn(n).to(device) if device == 'neuron' else torch.randn(n).clone()
        return (x * 2).cpu() if with_op else x
    for n in (5, 6, 7):  # warm: the first upload, the op's first calls
        batch(n)
    lengths = [1 + 97 * i for i in range(1000)]
    start_memory, start = resident(), time.perf_counter()
    for n in lengths:
        batch(n)
    if device == 'neuron':
        torch.neuron.synchronize()
    seconds = time.perf_counter() - start
    stats = torchneuron.cache_stats() if device == 'neuron' else {{}}
    print(json.dumps({{"seconds": seconds, "per_length": seconds / len(lengths),
                      "growth": resident() - start_memory, "misses": stats.get("misses")}}))
"""


def run(code: str, **env) -> dict:
    environment = {**os.environ, "PYTHONPATH": ROOT, **env}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environment, cwd=ROOT, check=False)
    if done.returncode:
        raise SystemExit(f"case failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# name -> environment: the default (fused eager, decode steps replayed as graphs), then the paths
# it replaced (transformers' dynamic cache in fused and strict eager), then the exact-size baseline.
GENERATE_CONFIGS = {
    "graphs (default)": {"TORCHNEURON_EAGER": "fused", "TORCHNEURON_GENERATE_GRAPHS": "1"},
    "fused, dynamic cache": {"TORCHNEURON_EAGER": "fused", "TORCHNEURON_GENERATE_GRAPHS": "0"},
    "strict, dynamic cache": {"TORCHNEURON_EAGER": "strict", "TORCHNEURON_GENERATE_GRAPHS": "0"},
}
# calls after the first in the cold process: the second, then six more of which the last three are
# the settled ones (the third and fourth still promote the programs their calls made hot: a
# program's 16th call starts its background promotion, and a runtime program's check at its 256th
# call can recompile it on the calling thread)
SAME_PROCESS_CALLS = 7
SETTLED = 3


def generate_cases() -> None:
    cpu = run(GENERATE.format(device="cpu", repeats=3))
    cpu_seconds = min(r["seconds"] for r in cpu["runs"])
    results, rows = {}, []
    for name, env in GENERATE_CONFIGS.items():
        with tempfile.TemporaryDirectory() as cache:
            env = {**env, "TORCHNEURON_CACHE_DIR": cache, "TORCHNEURON_EAGER_BUCKETS": "1"}
            cold = run(GENERATE.format(device="neuron", repeats=1 + SAME_PROCESS_CALLS), **env)
            warm = run(GENERATE.format(device="neuron", repeats=1), **env)
        results[name], results[f"{name} warm"] = cold, warm
        settled = sorted(cold["runs"][-SETTLED:], key=lambda r: r["seconds"])
        rows += [(f"{name}: fresh, empty cache", cold["runs"][0], cold),
                 (f"{name}: fresh, warm cache", warm["runs"][0], warm),
                 (f"{name}: same process, 2nd call", cold["runs"][1], None),
                 (f"{name}: same process, settled", settled[len(settled) // 2], None)]
    with tempfile.TemporaryDirectory() as cache:  # the baseline: every eager op at its exact sizes
        exact = run(GENERATE.format(device="neuron", repeats=1), TORCHNEURON_CACHE_DIR=cache,
                    TORCHNEURON_EAGER_BUCKETS="0", TORCHNEURON_EAGER="strict", TORCHNEURON_GENERATE_GRAPHS="0")
    results["exact"] = exact
    rows.append(("strict, dynamic, exact sizes: empty cache", exact["runs"][0], exact))
    print(f"tiny Llama generate(max_new_tokens=64), CPU {cpu_seconds:.3f} s (min of 3)")
    print(f"{'neuron case':44} {'seconds':>8} {'x CPU':>8} {'RSS growth MB':>14} {'compiles':>9} {'disk loads':>10}")
    for name, r, whole in rows:
        extra = f"{whole['compiles']:>9} {whole['disk_hits']:>10}" if whole else f"{'':>9} {'':>10}"
        print(f"{name:44} {r['seconds']:8.3f} {r['seconds'] / cpu_seconds:7.1f}x {r['growth'] / 2**20:14.0f} {extra}")
    default = results["graphs (default)"]
    print(f"executables held (default): {default['entries']}, estimated {default['bytes'] / 2**20:.0f} MB, "
          f"{default['evictions']} evicted")
    for name, result in results.items():
        assert result["tokens"] == cpu["tokens"], f"{name}: neuron tokens differ from CPU's"


def train_cases(steps: int) -> None:
    with tempfile.TemporaryDirectory() as cache:
        bucketed = run(TRAIN.format(device="neuron", backend="neuron", steps=steps), TORCHNEURON_CACHE_DIR=cache)
    with tempfile.TemporaryDirectory() as cache:
        exact = run(TRAIN.format(device="neuron", backend="neuron", steps=steps), TORCHNEURON_CACHE_DIR=cache,
                    TORCHNEURON_BUCKETS="0")
    inductor = run(TRAIN.format(device="cpu", backend="inductor", steps=steps))
    print(f"\nGPT training, {steps} steps, {bucketed['lengths']} distinct lengths in 8..128, dynamic=True")
    print(f"{'case':32} {'seconds':>8} {'x inductor':>11} {'XLA compiles':>13}")
    for name, r in (("neuron, buckets", bucketed), ("neuron, exact sizes", exact), ("inductor (CPU)", inductor)):
        compiles = "" if r["compiles"] is None else r["compiles"]
        print(f"{name:32} {r['seconds']:8.2f} {r['seconds'] / inductor['seconds']:10.2f}x {compiles:>13}")


def upload_cases() -> None:
    print("\n1,000 uploads of distinct lengths (1..96,904 floats), each freed before the next")
    print(f"{'case':36} {'ms per length':>13} {'x CPU':>7} {'RSS growth MB':>14} {'programs':>9}")
    for with_op, name in ((False, "upload"), (True, "upload, x * 2, read back")):
        cpu = run(UPLOADS.format(device="cpu", with_op=with_op))
        neuron = run(UPLOADS.format(device="neuron", with_op=with_op), TORCHNEURON_CACHE_DIR="0")
        for device, r in (("CPU (clone)", cpu), ("neuron", neuron)):
            programs = "" if r["misses"] is None else r["misses"]
            print(f"{name + ', ' + device:36} {1e3 * r['per_length']:13.3f} "
                  f"{r['per_length'] / cpu['per_length']:6.1f}x {r['growth'] / 2**20:14.0f} {programs:>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--only", choices=("generate", "train", "uploads"))
    args = parser.parse_args()
    if args.only in (None, "generate"):
        generate_cases()
    if args.only in (None, "train"):
        train_cases(args.steps)
    if args.only in (None, "uploads"):
        upload_cases()


if __name__ == "__main__":
    main()
