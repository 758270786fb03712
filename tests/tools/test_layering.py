"""The architecture, read from the package's own imports: data flows down the layers (dispatcher ->
eager or compile driver -> lowering table -> runtime) and no module imports one that imports it back.

Every import counts: module-level ones, those inside functions, relative ones (resolved against the
importing package), and `__import__`/`importlib.import_module` of a literal name. Importing a
submodule also runs its parent packages' `__init__`, but that is not counted as an edge: every module
would otherwise sit in a cycle with `torchneuron/__init__.py`, which wires the whole device together.
"""
from __future__ import annotations

import ast
import pathlib
import re
from collections.abc import Iterator

import pytest
import torch

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "torchneuron"

# Layer -> the other layers it may import (importing inside one's own layer is always allowed). A
# layer is a subpackage (torchneuron/runtime/...) or a top-level module (torchneuron/config.py).
# Layers absent here sit on top and may import anything: the package root and its wiring
# (module_moves, _autoload), profiler, and the tools (conformance, sweep, testing, demo).
ALLOWED = {
    "config": set(),
    "runtime": {"config"},
    "lowering": {"runtime", "config"},
    "eager": {"runtime", "lowering", "config"},
    "compile": {"runtime", "lowering", "config"},
    "amp": {"runtime", "lowering", "config"},
    "distributed": {"runtime", "config"},
    "device_module": {"runtime", "config"},
    "custom_ops": {"eager", "runtime", "lowering", "config"},
    # sparse COO kernels: compositions of dense ops that dispatch, on the ops' records
    "sparse": {"lowering", "config"},
    # other libraries' hooks: they reach the device through torch.neuron, and transformers' generate
    # records its decode steps through the graphs API at a bucket's size (integrations/generate.py)
    "integrations": {"graphs", "lowering", "config"},
}


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("torchneuron", *path.relative_to(PACKAGE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _modules()


def _imported_names(name: str, path: pathlib.Path) -> Iterator[tuple[str, int]]:
    """(fully qualified name, line) of everything `name` imports, submodules resolved where they exist."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                yield (f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base), node.lineno
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called in ("__import__", "import_module") and isinstance(node.args[0].value, str):
                yield node.args[0].value, node.lineno


def _graph() -> dict[str, dict[str, int]]:
    """Module -> {module of torchneuron it imports: first line that does}."""
    graph = {}
    for name, path in MODULES.items():
        edges = graph[name] = {}
        for target, line in _imported_names(name, path):
            if target.partition(".")[0] != "torchneuron":
                continue
            while target not in MODULES:
                target = target.rpartition(".")[0]
            if target != name:
                edges.setdefault(target, line)
    return graph


GRAPH = _graph()


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                on_stack.discard(member)
                component.append(member)
            on_stack.discard(node)
            if component:
                found.append(sorted([node, *component]))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_reader_sees_every_kind_of_import():
    assert "torchneuron.config" in GRAPH["torchneuron.runtime.devices"]  # from .. import config
    assert "torchneuron.eager.kernels" in GRAPH["torchneuron"]  # inside _register()
    assert "torchneuron.profiler" in GRAPH["torchneuron"]  # __import__("torchneuron.profiler")
    assert "torchneuron.compile.buckets" in GRAPH["torchneuron.compile.backend"]  # from . import buckets
    assert set(ALLOWED) <= {_layer(module) for module in GRAPH}


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_lies_below(layer):
    allowed = ALLOWED[layer] | {layer}
    offences = [f"{module} ({layer}) imports {target} ({_layer(target) or 'the package root'}) at line {line}"
                for module, edges in GRAPH.items() if _layer(module) == layer
                for target, line in edges.items() if _layer(target) not in allowed]
    assert not offences, f"{layer} may import only {sorted(allowed)}:\n" + "\n".join(offences)


def test_no_import_cycles():
    cycles = _cycles(GRAPH)
    described = ["; ".join(f"{a} imports {b} at line {GRAPH[a][b]}" for a in cycle for b in cycle if b in GRAPH[a])
                 for cycle in cycles]
    assert not cycles, "modules that import each other:\n" + "\n".join(described)


# Tables a driver keeps of its own work, keyed by op: allowed by the rule (its copies and caches).
DRIVERS_OWN = {
    "torchneuron.eager.driver.PLANS": "the eager driver's plans per op (its cache)",
    "torchneuron.eager.kernels.REGISTERED": "the ops the eager driver gave a kernel",
    "torchneuron.eager.fallback.STATS": "the CPU fallback's count per op (fallback_stats())",
    "torchneuron.eager.fallback.DECOMPOSITIONS": "PyTorch's Core ATen decompositions, the driver's copy",
    "torchneuron.compile.backend._DECOMPOSITIONS": "PyTorch's Core ATen decompositions less the lowered ops",
}


def _op_keyed(value) -> bool:
    """Whether `value` is a table keyed by ATen ops: a dict, set or sequence holding OpOverloads,
    OpOverloadPackets or "aten::"/"aten." names among its keys or members."""
    if not isinstance(value, (dict, set, frozenset, list, tuple)):
        return False
    members = list(value)

    def is_op(m) -> bool:
        if isinstance(m, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return True
        return isinstance(m, str) and re.fullmatch(r"aten(::|\.)\w+(\.\w+)?", m) is not None
    return any(is_op(m) for m in members[:200])


def test_no_module_outside_lowering_keeps_a_table_keyed_by_op():
    """Everything known of an op sits on its record (lowering/records.py); the drivers read it."""
    import importlib

    from torch._decomp import meta_table

    import torchneuron  # noqa: F401  (loads the table and wires the device)
    from torchneuron import lowering
    from torchneuron.lowering import Facet
    lowering.load_all()
    offences = []
    for name in sorted(MODULES):
        if name.startswith("torchneuron.lowering") or name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # (a tool whose optional dependency is absent)
            continue
        for attr, value in vars(module).items():
            if isinstance(value, Facet) or value is lowering.RECORDS or value is meta_table or (
                    f"{name}.{attr}" in DRIVERS_OWN):
                continue
            if _op_keyed(value):
                offences.append(f"{name}.{attr}")
    assert not offences, "op-keyed tables outside lowering/ (move them onto the ops' records):\n" + "\n".join(offences)


def test_the_scan_finds_an_op_keyed_table():
    assert _op_keyed({torch.ops.aten.add.Tensor: 1}) and _op_keyed(("aten::add",))
    assert not _op_keyed({"add": 1}) and not _op_keyed({"aten.index.Tensor: out of range": 1}) and not _op_keyed(3)


# Functions of one job: none over MAX_FUNCTION_LINES (end_lineno - lineno + 1, docstring included).
MAX_FUNCTION_LINES = 60
# Those not split yet, each with why; the list only shrinks (a function that now fits must leave it).
LONG_FUNCTIONS = {
    # a blocked attention loop: the carried state (running max, sum, output) and each block's
    # score/mask step share one scope; splitting means threading eight values through helpers
    "torchneuron/lowering/flex_attention.py:_attend_blocks": "one loop body over listed key/value blocks",
    "torchneuron/lowering/flex_attention.py:_backward_blocks": "two such loops (dq by rows, dk/dv by columns)",
}


def _function_lengths() -> Iterator[tuple[str, int]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{path.relative_to(PACKAGE.parent)}:{node.name}", node.end_lineno - node.lineno + 1


def test_no_function_is_longer_than_the_limit():
    lengths = {}
    for name, length in _function_lengths():
        lengths[name] = max(length, lengths.get(name, 0))
    too_long = sorted(f"{name} ({length} lines)" for name, length in lengths.items()
                      if length > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS)
    assert not too_long, (f"functions over {MAX_FUNCTION_LINES} lines (split them by what they decide):\n"
                          + "\n".join(too_long))
    fit = sorted(name for name in LONG_FUNCTIONS if lengths.get(name, 0) <= MAX_FUNCTION_LINES)
    assert not fit, "these fit now (or are gone): take them off LONG_FUNCTIONS:\n" + "\n".join(fit)
