"""The Memory Manager's phases read as their steps: each phase's entry point is a short
list of named steps, and no function of the phases, the judge, explain or history runs
past a screen (read from the code with ``ast``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "memory_pipelines"

#: the packages and modules whose functions stay short
SHORT = ("phases", "judge", "explain", "history", "purge.py", "sources/erasure.py")
#: the longest function they may hold (lines, docstring included)
MAX_FUNCTION_LINES = 80
#: the longest phase entry point, docstring excluded: a list of named steps
MAX_PHASE_RUN_LINES = 40
#: the names of a phase module's entry points
ENTRY_POINTS = ("run", "run_cycle", "run_maintenance")


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SHORT:
        path = ROOT / name
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _lines(fn: ast.FunctionDef | ast.AsyncFunctionDef, *, docstring: bool = True) -> int:
    first = fn.lineno
    body = fn.body
    if not docstring and body and isinstance(body[0], ast.Expr):
        value = body[0].value
        if isinstance(value, ast.Constant) and isinstance(value.value, str) and len(body) > 1:
            first = body[1].lineno
    return (fn.end_lineno or fn.lineno) - first + 1


def test_the_checked_modules_exist():
    missing = [name for name in SHORT if not (ROOT / name).exists()]
    assert not missing, f"gone or renamed, update SHORT: {missing}"
    assert len(_files()) > 20


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_runs_past_a_screen(path):
    long = {
        f"{fn.name} (line {fn.lineno})": _lines(fn)
        for fn in _functions(path)
        if _lines(fn) > MAX_FUNCTION_LINES
    }
    assert not long, f"split these into named steps: {long}"


def test_each_phase_entry_point_is_a_list_of_steps():
    runs = {
        f"{path.name}:{fn.name}": _lines(fn, docstring=False)
        for path in sorted((ROOT / "phases").glob("*.py"))
        for fn in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(fn, ast.FunctionDef) and fn.name in ENTRY_POINTS
    }
    assert len(runs) >= 10, runs  # every phase module with a run() is seen
    long = {name: n for name, n in runs.items() if n > MAX_PHASE_RUN_LINES}
    assert not long, f"a phase run() should read as its steps: {long}"
