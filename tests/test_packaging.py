"""Packaging and start-up: what the wheel installs, what importing the package and running
``--help`` load, and that the package sets no environment variable of its host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
DAGSTER_FOLDERS = ("assets", "resources", "sensors", "jobs")
HEAVY = ("dagster", "lancedb", "litellm", "pandas", "lance", "pyarrow", "uvicorn", "onnxruntime")


def _run_python(code: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object."""
    base = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_wheel_package_list_names_every_package_folder():
    """pyproject lists the packages explicitly (the Dagster folders are remapped): a new
    subpackage missing from the list would be missing from the wheel."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set(find_packages(str(ROOT), include=["memory_pipelines", "memory_pipelines.*"]))
    for folder in DAGSTER_FOLDERS:
        found |= {f"memory_pipelines.{p}" for p in find_packages(str(ROOT), include=[folder, f"{folder}.*"])}
    assert found == listed, f"missing: {sorted(found - listed)}, stale: {sorted(listed - found)}"
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert mapped == {f"memory_pipelines.{f}": f for f in DAGSTER_FOLDERS}


def test_no_generic_top_level_package_is_installed():
    listed = PYPROJECT["tool"]["setuptools"]["packages"]
    assert {p.split(".")[0] for p in listed} == {"memory_pipelines"}


def test_the_dagster_folders_import_under_the_package_name_from_the_checkout():
    out = _run_python(
        "import json, sys, memory_pipelines.resources.memory_api as m, memory_pipelines.jobs.runs;"
        "print(json.dumps({'file': m.__file__, 'generic': sorted(n for n in sys.modules"
        " if n.split('.')[0] in ('assets', 'resources', 'sensors', 'jobs'))}))"
    )
    assert Path(out["file"]) == ROOT / "resources" / "memory_api.py"
    assert out["generic"] == []


def test_import_loads_nothing_heavy_and_sets_no_environment_variable():
    out = _run_python(
        "import json, os, sys; before = dict(os.environ); import memory_pipelines;"
        "print(json.dumps({'heavy': sorted({n.split('.')[0] for n in sys.modules}"
        " & set(os.environ['HEAVY'].split())), 'env': sorted(set(os.environ) ^ set(before))}))",
        env={"HEAVY": " ".join(HEAVY)},
        cwd=ROOT.parent,
    )
    assert out == {"heavy": [], "env": []}


def test_every_public_name_resolves_and_version_is_the_distribution_version():
    import importlib.metadata

    import memory_pipelines

    assert set(memory_pipelines.__all__) == set(memory_pipelines._EXPORTS)
    for name in memory_pipelines.__all__:
        assert getattr(memory_pipelines, name) is not None, name
    assert set(memory_pipelines.__all__) <= set(dir(memory_pipelines))
    assert memory_pipelines.__version__ == importlib.metadata.version("memory-pipelines")
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        memory_pipelines.NoSuchName  # noqa: B018
    from memory_pipelines import MemoryService, RunContext  # noqa: F401


def _help_argvs() -> list[list[str]]:
    from memory_pipelines.apps.cli import BENCHMARKS, COMMANDS

    # `bench NAME --help` loads that benchmark's module (it is the benchmark's own parser)
    assert BENCHMARKS
    return [["--help"], ["bench", "--help"]] + [[name, "--help"] for name in COMMANDS]


def test_help_of_every_command_imports_no_heavy_module():
    """``memory-pipelines --help``, ``bench --help`` and every subcommand's ``--help`` load
    none of Dagster, LanceDB, litellm, pandas ... (one fresh process runs them in turn and
    names the first command after which a heavy module is loaded)."""
    code = (
        "import contextlib, io, json, sys\n"
        "from memory_pipelines.apps.cli import main\n"
        "HEAVY, ARGVS = json.loads(sys.argv[1])\n"
        "report = []\n"
        "for argv in ARGVS:\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            rc = main(argv)\n"
        "        except SystemExit as e:\n"
        "            rc = e.code\n"
        "    heavy = sorted({n.split('.')[0] for n in sys.modules} & set(HEAVY))\n"
        "    report.append([argv, rc, 'usage' in buf.getvalue().lower(), heavy])\n"
        "print(json.dumps(report))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps([HEAVY, _help_argvs()])], cwd=ROOT.parent, capture_output=True, text=True,
        timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report) > 15
    bad_rc = [(argv, rc) for argv, rc, _, _ in report if rc not in (0, None)]
    no_usage = [argv for argv, _, usage, _ in report if not usage]
    first_leak = next(((argv, heavy) for argv, _, _, heavy in report if heavy), None)
    assert not bad_rc, bad_rc
    assert not no_usage, no_usage
    assert first_leak is None, f"after {first_leak[0]}: {first_leak[1]} imported"


def test_litellm_is_imported_with_the_bundled_cost_map_unless_the_host_chose():
    """The package sets LITELLM_LOCAL_MODEL_COST_MAP only right before importing litellm, and
    leaves a value the host set alone."""
    code = (
        "import json, os, sys\n"
        "import memory_pipelines.judge.litellm_judge, memory_pipelines.apps.proxy.app\n"
        "before = os.environ.get('LITELLM_LOCAL_MODEL_COST_MAP')\n"
        "loaded_early = 'litellm' in sys.modules\n"
        "from memory_pipelines.litellm_loader import import_litellm\n"
        "import_litellm()\n"
        "print(json.dumps([before, loaded_early, os.environ.get('LITELLM_LOCAL_MODEL_COST_MAP')]))"
    )
    assert _run_python(code, cwd=ROOT.parent) == [None, False, "True"]
    kept = _run_python(code, cwd=ROOT.parent, env={"LITELLM_LOCAL_MODEL_COST_MAP": "TRUE"})
    assert kept == ["TRUE", False, "TRUE"]
