"""The layering contract: run -> facts -> checks -> report/kb -> triage -> runreport -> plan -> cluster -> eval -> train -> sweep -> cli,
from the floor up. No module imports a layer above its own, lazily (inside a function) or not: read from
the source, so an import that only runs on a rare path is caught too."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sftdoctor"
LAYERS = [
    ("sftdoctor", "sftdoctor.errors", "sftdoctor.findings"),
    ("sftdoctor.run",),
    ("sftdoctor.facts",),
    ("sftdoctor.checks",),
    ("sftdoctor.report", "sftdoctor.kb"),
    ("sftdoctor.triage",),
    ("sftdoctor.runreport",),
    ("sftdoctor.plan",),
    ("sftdoctor.cluster",),
    ("sftdoctor.eval",),
    ("sftdoctor.train",),
    ("sftdoctor.sweep",),
    ("sftdoctor.cli", "sftdoctor.__main__"),
]


def layer(module: str) -> int:
    """The layer of a module: the most specific prefix that names one."""
    best, depth = None, -1
    for number, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and name.count(".") > depth:
                best, depth = number, name.count(".")
    assert best is not None, module
    return best


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every sftdoctor import in the file, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            # `from sftdoctor import report` imports the module sftdoctor.report
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if (PACKAGE.parent / f"{node.module}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
                      or (PACKAGE.parent / f"{node.module}.{a.name}".replace(".", "/")).is_dir()]
    return [(line, name) for line, name in found if name == "sftdoctor" or name.startswith("sftdoctor.")]


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_layer_above_its_own(path):
    own = layer(module_name(path))
    upward = [f"{path.name}:{line} imports {name}" for line, name in imports(path) if layer(name) > own]
    assert not upward, upward


def test_the_contract_can_fail():
    """A check that imported the trainer would be caught."""
    assert layer("sftdoctor.train.launch") > layer("sftdoctor.checks.memory") > layer("sftdoctor.run.resolve")
    assert layer("sftdoctor.facts.configs") < layer("sftdoctor.plan.command")
