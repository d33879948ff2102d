"""The layering contract: run -> facts -> checks -> render/kb -> triage -> report -> plan -> distributed -> eval
-> train -> sweep -> cli, from the floor up. No module imports a layer above its own, lazily (inside a function)
or not: read from the source, so an import that only runs on a rare path is caught too."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sftdoctor"
LAYERS = [
    ("sftdoctor", "sftdoctor.errors", "sftdoctor.findings", "sftdoctor.children", "sftdoctor.files"),
    ("sftdoctor.run",),
    ("sftdoctor.facts",),
    ("sftdoctor.checks",),
    ("sftdoctor.render", "sftdoctor.kb", "sftdoctor.checks.command"),  # `check` renders its findings
    ("sftdoctor.triage",),
    ("sftdoctor.report", "sftdoctor.diff"),
    ("sftdoctor.plan",),
    ("sftdoctor.distributed",),
    ("sftdoctor.eval", "sftdoctor.chat"),  # chat loads models as eval does (eval/target.py)
    ("sftdoctor.train",),
    ("sftdoctor.sweep",),
    # reference: docs rendered from every layer; mcp: the commands' JSON served as tools, with the CLI's parsers
    ("sftdoctor.cli", "sftdoctor.__main__", "sftdoctor.reference", "sftdoctor.mcp"),
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


def imports(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every sftdoctor import in the file, wherever it stands: `import`, `from ... import`
    (relative ones resolved against `module`, the file's own name), importlib.import_module("...") and
    __import__("...") with a literal name."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from .x import y, from .. import z
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((node.lineno, base))
            # `from sftdoctor import render` imports the module sftdoctor.render
            found += [
                (node.lineno, f"{base}.{a.name}")
                for a in node.names
                if (PACKAGE.parent / f"{base}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
                or (PACKAGE.parent / f"{base}.{a.name}".replace(".", "/")).is_dir()
            ]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
            )
        ):
            found.append((node.lineno, node.args[0].value))
    return [(line, name) for line, name in found if name == "sftdoctor" or name.startswith("sftdoctor.")]


def upward(path: Path, module: str | None = None) -> list[str]:
    own = layer(module or module_name(path))
    return [f"{path.name}:{line} imports {name}" for line, name in imports(path, module) if layer(name) > own]


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_layer_above_its_own(path):
    assert not upward(path), upward(path)


UPWARD = """
import sftdoctor.train.launch
from sftdoctor.sweep import command
from ..train import launch
from .. import eval
import importlib


def lazily():
    from sftdoctor.cli import main
    return importlib.import_module("sftdoctor.plan.command")


class Probe:
    def method(self):
        import sftdoctor.report.page
"""


def test_every_form_of_upward_import_is_caught(tmp_path):
    """Each way a check (layer 3) could import a higher layer, fed to the detector as sftdoctor.checks.memory."""
    path = tmp_path / "memory.py"
    path.write_text(UPWARD)
    found = {line.split(" imports ")[1] for line in upward(path, "sftdoctor.checks.memory")}
    assert found >= {
        "sftdoctor.train.launch",
        "sftdoctor.sweep",
        "sftdoctor.sweep.command",
        "sftdoctor.train",
        "sftdoctor.eval",
        "sftdoctor.cli",
        "sftdoctor.plan.command",
        "sftdoctor.report.page",
    }, found
    path.write_text("from . import common\nfrom ..facts import configs\nimport sftdoctor.run.resolve\n")
    assert upward(path, "sftdoctor.checks.memory") == []  # same layer and below: fine


def test_the_contract_can_fail():
    """A check that imported the trainer would be caught."""
    assert layer("sftdoctor.train.launch") > layer("sftdoctor.checks.memory") > layer("sftdoctor.run.resolve")
    assert layer("sftdoctor.facts.configs") < layer("sftdoctor.plan.command")
