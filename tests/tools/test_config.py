"""config: every TORCHNEURON_* environment variable is read there, once, and the README lists exactly those."""
import ast
import pathlib
import re

import pytest
import torch

from torchneuron import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torchneuron"
ENVIRONMENT_ACCESS = re.compile(r"\benviron\b|\bgetenv\b")
NAME = re.compile(r"TORCHNEURON_\w+")


def _readme_variables() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in NAME.findall(row.split("|")[1])}


def _environment_reads(path: pathlib.Path) -> list[str]:
    """The innermost call or subscript on each line of `path` that touches the environment with a
    TORCHNEURON_ name, as 'path:line: code'."""
    source = path.read_text()
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Call, ast.Subscript)):
            segment = ast.get_source_segment(source, node) or ""
            touches = ENVIRONMENT_ACCESS.search(segment) and NAME.search(segment)
            if touches and len(segment) < len(found.get(node.lineno, segment + " ")):
                found[node.lineno] = segment
    return [f"{path.relative_to(ROOT)}:{line}: {code}" for line, code in sorted(found.items())]


def test_readme_lists_exactly_the_configured_variables():
    readme = _readme_variables()
    assert readme == set(config.ENVIRONMENT), (
        f"README.md's environment table lacks {sorted(set(config.ENVIRONMENT) - readme)} "
        f"and lists unknown {sorted(readme - set(config.ENVIRONMENT))}")


def test_config_reads_each_documented_variable():
    read = set(NAME.findall("\n".join(_environment_reads(PACKAGE / "config.py"))))
    assert read == set(config.ENVIRONMENT), (
        f"read but undocumented: {sorted(read - set(config.ENVIRONMENT))}; "
        f"documented but never read: {sorted(set(config.ENVIRONMENT) - read)}")


def test_only_config_touches_the_environment():
    offenders = [line for path in sorted(PACKAGE.rglob("*.py")) if path != PACKAGE / "config.py"
                 for line in _environment_reads(path)]
    assert not offenders, "read these through torchneuron.config instead:\n" + "\n".join(offenders)


# Settings changed at run time: the code reads torchneuron.config where it uses it, never a copy.

def _module_level_config_reads(path: pathlib.Path) -> list[str]:
    """`config.X` read by a module-level statement of `path` (a copy made at import), as 'path:line: X'."""
    tree = ast.parse(path.read_text())
    settings = {name.removeprefix("TORCHNEURON_") for name in config.ENVIRONMENT}
    found = []
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(statement):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "config"
                    and node.attr in settings):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.attr}")
    return found


def test_settings_are_read_where_they_are_used():
    """Only the settings config.AT_IMPORT names (JAX's platform, the process's devices, ...) are read
    at import; every other one is read at its use, so assigning it takes effect."""
    assert set(config.AT_IMPORT) <= set(config.ENVIRONMENT)
    copies = [line for path in sorted(PACKAGE.rglob("*.py")) if path != PACKAGE / "config.py"
              for line in _module_level_config_reads(path)
              if f"TORCHNEURON_{line.rsplit(' ', 1)[1]}" not in config.AT_IMPORT]
    assert not copies, "read these where they are used (or name them in config.AT_IMPORT):\n" + "\n".join(copies)


@pytest.fixture
def setting(monkeypatch):
    """setting(name, value): assign torchneuron.config.<name> for the test."""
    return lambda name, value: monkeypatch.setattr(config, name, value)


def _out_of_bounds(n):
    """x[i] with an index past the end, on sizes no other test uses (a plan of its own)."""
    return torch.arange(float(n), device="neuron"), torch.tensor([1, n + 2], device="neuron")


def test_device_asserts_and_launch_blocking_at_run_time(setting):
    x, i = _out_of_bounds(23)
    setting("DEVICE_ASSERTS", False)
    x[i].cpu()  # no check compiled in: nothing raised
    setting("DEVICE_ASSERTS", True)
    x, i = _out_of_bounds(29)
    y = x[i]  # checked, raised at the next synchronisation
    with pytest.raises(RuntimeError, match="device-side assert"):
        y.cpu()
    setting("LAUNCH_BLOCKING", True)
    x, i = _out_of_bounds(31)
    with pytest.raises(RuntimeError, match="device-side assert"):
        x[i]  # raised at the op itself


def test_eager_buckets_at_run_time(setting):
    from torchneuron.eager import buckets
    for rows, enabled in ((7, False), (9, True)):  # (rows: sizes of its own, no plan seen before)
        setting("EAGER_BUCKETS", enabled)
        calls = buckets.STATS["calls"]
        grown = torch.ones(rows, 4, device="neuron")
        for _ in range(20):  # a length that grows one at a time, as a cache does: bucketed when enabled
            grown = torch.cat([grown, torch.ones(rows, 1, device="neuron")], 1)
            grown.sum(-1).cpu()
        assert (buckets.STATS["calls"] > calls) == enabled


def test_log_at_run_time(setting, capfd):
    setting("LOG", frozenset({"flushes"}))
    (torch.ones(3, device="neuron") + 1).cpu()
    assert "[torchneuron] flush" in capfd.readouterr().err
    setting("LOG", frozenset())
    (torch.ones(3, device="neuron") + 1).cpu()
    assert "[torchneuron] flush" not in capfd.readouterr().err


def test_bucket_sizes_and_compiled_buckets_at_run_time(setting):
    from torchneuron.compile import buckets as compiled_buckets
    from torchneuron.lowering import padding
    setting("MIN_BUCKET", 32)
    assert padding.bucket(3) == 32
    setting("MIN_BUCKET", 4)
    assert padding.bucket(3) == 4
    setting("BUCKETS", False)
    assert compiled_buckets.plan(torch.fx.symbolic_trace(lambda x: x + 1)) is None


def test_prefetch_at_run_time(setting):
    from torchneuron.runtime import prefetch
    setting("CACHE_PREFETCH", 8)
    eight = prefetch._successors_key("program")
    setting("CACHE_PREFETCH", 16)
    assert prefetch._successors_key("program") != eight  # (the list's length is in its name)
    setting("CACHE_PREFETCH", 0)
    noted = len(prefetch._order)
    prefetch.noted("a program this test made up", None)
    assert len(prefetch._order) == noted
