"""config: every TORCHNEURON_* environment variable is read there, once, and the README lists exactly those."""
import ast
import pathlib
import re

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
