"""No function of sftdoctor longer than 60 lines (docs/contributing.md: functions that do one thing): read from the
source, every def and async def, methods and nested functions included: from its `def` line to its last."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sftdoctor"
LIMIT = 60


def long_functions(root: Path = PACKAGE, limit: int = LIMIT) -> dict[str, int]:
    """FILE:NAME -> lines, of every function longer than `limit` lines under `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return found


def test_no_function_is_longer_than_60_lines():
    long = long_functions()
    assert not long, f"split these into functions that each do one thing: {long}"


def test_a_function_of_61_lines_is_found(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    (tmp_path / "m.py").write_text(f"def long():\n{body}    y = 0\n\n\nasync def short():\n{body}")
    assert long_functions(tmp_path) == {"m.py:long": 61}
