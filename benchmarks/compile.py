"""Compiled vs eager: ms per training step (forward, backward, AdamW) and per forward of the small GPT.

    python benchmarks/compile.py

The GPT of torchneuron.testing.models (2 layers, width 32, 4 heads, sequence 16, batch 4) on: neuron
strict eager (each op as it is called; benchmarks/fused_eager.py times fused eager, the default, whose
unread forward would compute nothing here), neuron torch.compile (the whole step), PyTorch CPU eager, torch.compile with inductor on CPU
(skipped if it cannot compile here), and the same model as a plain JAX function under jax.jit (the
ceiling). Also each first call (compile) time, and ratios to the jax.jit time. After every case is
built and compiled, the cases are timed in interleaved rounds, each reporting its fastest round (see
timing.py: the machine's speed comes in phases).

Two more rows measure the floor under any backend: the same compiled step where every graph, after
its first call, hands back its first outputs again without running (`replay`). What remains is
PyTorch's own work per step (Dynamo's guards and resumed frames, AOTAutograd's wrappers, the
autograd engine, the optimizer's Python, `zero_grad`) on neuron tensors and on CPU tensors.
"""
from __future__ import annotations

import math
import time
import types

import jax
import jax.numpy as jnp
import torch
import torch._dynamo
from timing import interleaved_seconds_per_call, sync_for
from torch._dynamo.backends.common import aot_autograd

import torchneuron
from torchneuron.compile import backend as neuron_compile
from torchneuron.testing.models import GPT, batches

LR = 1e-3


def first_call(fn, sync) -> float:
    """Seconds of the first call (tracing and compiling included)."""
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def own_code(fn):
    """`fn` with a code object of its own: torch.compile keeps compiled frames per code object,
    and each case must not check the other cases' guards on every call."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)


def replay_backend(device):
    """An AOTAutograd backend whose graphs run once (neuron: compiled; cpu: the FX graph) and then
    return those first outputs again, as fresh tensor objects (the autograd engine takes a gradient
    without copying only when nothing else holds it)."""
    def compiler(name):
        def compile_graph(gm, example_inputs):
            run = neuron_compile.compile_graph(gm, example_inputs, name) if device == "neuron" else gm
            first = []

            def replay(*inputs):
                if not first:
                    first.append(run(*inputs))
                return [o.detach() if isinstance(o, torch.Tensor) else o for o in first[0]]
            replay._boxed_call = False
            return replay
        return compile_graph
    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                        decompositions=neuron_compile._DECOMPOSITIONS, keep_inference_input_mutations=True)


def torch_case(device, compile_backend=None, mode=None):
    torch.manual_seed(0)
    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = (t.to(device) for t in next(iter(batches("gpt", 1, batch=4))))

    def step():
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    def forward():
        with torch.no_grad():
            return model(x)

    if compile_backend:
        step = torch.compile(own_code(step), backend=compile_backend)
        forward = torch.compile(own_code(forward), backend=compile_backend)
    if mode:
        step, forward = in_mode(mode, step), in_mode(mode, forward)
    sync = sync_for(device)
    return (first_call(step, sync), step, sync), (first_call(forward, sync), forward, sync)


def in_mode(mode: str, fn):
    def run():
        with torchneuron.eager_mode(mode):
            return fn()
    return run


def jax_case(batch: int = 4, model: GPT | None = None, data=None):
    """The GPT's training step (AdamW) and forward as plain JAX under jax.jit: `model` (default: the
    small GPT) gives the sizes and initial weights, `data` the (inputs, targets) batch."""
    model = model or GPT()
    layers, heads, width = len(model.blocks), model.blocks[0].heads, model.tokens.weight.shape[1]
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in model.named_parameters()}
    x, y = (jnp.asarray(t.numpy()) for t in (data or next(iter(batches("gpt", 1, batch=batch)))))

    def layer_norm(h, p):
        mean = h.mean(-1, keepdims=True)
        var = ((h - mean) ** 2).mean(-1, keepdims=True)
        return (h - mean) / jnp.sqrt(var + 1e-5) * p["weight"] + p["bias"]

    def linear(h, p):
        return h @ p["weight"].T + p["bias"]

    def sub(p, prefix):
        return {k[len(prefix) + 1:]: v for k, v in p.items() if k.startswith(prefix + ".")}

    def forward(p, idx):
        b, t = idx.shape
        h = p["tokens.weight"][idx] + p["positions.weight"][jnp.arange(t)]
        causal = jnp.tril(jnp.ones((t, t), bool))
        for i in range(layers):
            blk = sub(p, f"blocks.{i}")
            q, k, v = jnp.split(linear(layer_norm(h, sub(blk, "ln1")), sub(blk, "qkv")), 3, axis=-1)
            q, k, v = (z.reshape(b, t, heads, width // heads).transpose(0, 2, 1, 3) for z in (q, k, v))
            scores = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(width // heads), -jnp.inf)
            att = jax.nn.softmax(scores, -1) @ v
            h = h + linear(att.transpose(0, 2, 1, 3).reshape(b, t, width), sub(blk, "proj"))
            mlp = sub(blk, "mlp")
            hidden = jax.nn.gelu(linear(layer_norm(h, sub(blk, "ln2")), sub(mlp, "0")), approximate=True)
            h = h + linear(hidden, sub(mlp, "2"))
        return layer_norm(h, sub(p, "ln")) @ p["tokens.weight"].T

    def loss_fn(p, idx, targets):
        logp = jax.nn.log_softmax(forward(p, idx), -1)
        return -jnp.take_along_axis(logp, targets[..., None], -1).mean()

    @jax.jit
    def train_step(p, m, v, count):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        count = count + 1
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        def update(w, m, v):
            w = w * (1 - LR * 0.01)
            return w - LR * (m / (1 - 0.9 ** count)) / (jnp.sqrt(v / (1 - 0.999 ** count)) + 1e-8)
        return jax.tree.map(update, p, m, v), m, v, count, loss

    state = [params, jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params), jnp.zeros(())]

    def step():
        *state[:4], loss = train_step(*state)
        return loss

    infer = jax.jit(forward)
    result = {}

    def sync():
        jax.block_until_ready(state)
        jax.block_until_ready(result)

    def fwd():
        result["out"] = infer(state[0], x)

    return (first_call(step, sync), step, sync), (first_call(fwd, sync), fwd, sync)


def main():
    cases = {"jax.jit": jax_case,
             "neuron compiled": lambda: torch_case("neuron", "neuron"),
             "cpu eager": lambda: torch_case("cpu"),
             "cpu inductor": lambda: torch_case("cpu", "inductor"),
             "neuron eager": lambda: torch_case("neuron", mode="strict"),
             "neuron replay": lambda: torch_case("neuron", replay_backend("neuron")),
             "cpu replay": lambda: torch_case("cpu", replay_backend("cpu"))}
    built = {}
    torch._dynamo.reset()
    for name, build in cases.items():
        try:
            built[name] = build()
            print(f"{name}: first step {built[name][0][0]:.2f} s, first forward {built[name][1][0]:.2f} s", flush=True)
        except (torch._dynamo.exc.BackendCompilerFailed, RuntimeError, OSError) as e:  # inductor: C++
            print(f"{name}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
    steps = interleaved_seconds_per_call({n: (s[1], s[2]) for n, (s, _) in built.items()}, 10, 15, warmup=3)
    forwards = interleaved_seconds_per_call({n: (f[1], f[2]) for n, (_, f) in built.items()}, 10, 15, warmup=3)
    results = {n: ((built[n][0][0], steps[n] * 1e3), (built[n][1][0], forwards[n] * 1e3)) for n in built}
    ceiling = results["jax.jit"]
    print(f"{'':16} {'step ms':>9} {'x jax':>7} {'1st step s':>10} {'fwd ms':>8} {'x jax':>7} {'1st fwd s':>9}")
    for name, ((s_first, s_ms), (f_first, f_ms)) in results.items():
        print(f"{name:16} {s_ms:9.3f} {s_ms / ceiling[0][1]:7.2f} {s_first:10.2f} {f_ms:8.3f} "
              f"{f_ms / ceiling[1][1]:7.2f} {f_first:9.2f}")
    if "neuron eager" in results and "neuron compiled" in results:
        eager, comp = results["neuron eager"], results["neuron compiled"]
        print(f"neuron eager / compiled: step {eager[0][1] / comp[0][1]:.1f}x, forward {eager[1][1] / comp[1][1]:.1f}x")


if __name__ == "__main__":
    main()
