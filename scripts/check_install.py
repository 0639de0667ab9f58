"""Install checks, as a user would install the package (run by CI through `make check-install`).

1. ``python -m build`` gives a wheel and an sdist that ``twine check`` passes; the wheel's
   only top-level package is ``memory_pipelines``.
2. The wheel *without extras* in a fresh venv outside the repository: ``--help`` and
   ``import memory_pipelines`` work, Dagster is not installed, and the README's first Python
   example runs from another folder.
3. The wheel with ``[dagster]`` in a fresh venv, beside a user project with its own
   ``assets/``, ``resources/`` and ``jobs/`` packages: the project's definitions merge ours
   and load.
4. The lowest and the newest allowed lancedb/pylance pair (with the lowest allowed litellm
   and tenacity beside the lowest pair) in fresh venvs: the store, compaction and judge tests pass.

Each venv installs with ``constraints.txt`` (what CI tests), less the packages a check
varies. Sizes and package counts are printed. Usage: ``python scripts/check_install.py
[--only build,core,dagster,bounds] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\s*$")
#: what the bounds check varies (everything else stays as constraints.txt pins it);
#: litellm 1.109 wants huggingface-hub < 2, so that one is left free as well
VARIED = {
    "lancedb", "pylance", "lance-namespace", "lance-namespace-urllib3-client", "litellm",
    "huggingface-hub", "tenacity",
}  # fmt: skip
LOWEST = ["lancedb==0.40.0", "pylance==13.0.0", "litellm==1.109.0", "tenacity==8.2.0"]
BOUNDS_TESTS = [
    "tests/store/test_store.py",
    "tests/store/test_tail_compaction.py",
    "tests/judge/test_judge.py",
    "tests/test_retries.py",
]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def venv(path: Path) -> Path:
    run([sys.executable, "-m", "venv", str(path)])
    py = path / "bin" / "python"
    run([str(py), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    return py


def size_and_count(venv_dir: Path) -> tuple[float, int]:
    site = next((venv_dir / "lib").glob("python3*/site-packages"))
    total = sum(f.stat().st_size for f in site.rglob("*") if f.is_file() and not f.is_symlink())
    return total / 1e6, len(list(site.glob("*.dist-info")))


def first_python_block(page: Path) -> str:
    """The first ```python block of a page (the README's quick start)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        m = FENCE.match(line.strip())
        if m and m.group("lang") == "python":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            return "\n".join(lines[i + 1 : end]) + "\n"
    raise SystemExit(f"{page} has no python block")


def clean_env() -> dict[str, str]:
    """The environment without this checkout's variables (a user's shell)."""
    drop = ("MEMORY_", "VIRTUAL_ENV", "PYTHONPATH", "DAGSTER_HOME", "LITELLM_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def check_build(work: Path) -> tuple[Path, Path]:
    dist = work / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)])
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, (wheels, sdists)
    run([sys.executable, "-m", "twine", "check", "--strict", str(wheels[0]), str(sdists[0])])
    with zipfile.ZipFile(wheels[0]) as zf:
        tops = {n.split("/")[0] for n in zf.namelist() if not n.split("/")[0].endswith(".dist-info")}
        names = set(zf.namelist())
    assert tops == {"memory_pipelines"}, f"wheel top-level names: {sorted(tops)}"
    for module in ("assets/__init__.py", "resources/memory_api.py", "sensors/cycle.py", "jobs/runs.py"):
        assert f"memory_pipelines/{module}" in names, f"{module} missing from the wheel"
    for weights in ("judge/selector.json", "injection/ranker.json"):  # the shipped models
        assert f"memory_pipelines/{weights}" in names, f"{weights} missing from the wheel"
    return wheels[0], sdists[0]


def check_core(work: Path, wheel: Path) -> dict:
    env_dir = work / "core-venv"
    py = venv(env_dir)
    run([str(py), "-m", "pip", "install", "--quiet", "-c", str(CONSTRAINTS), str(wheel)])
    size, count = size_and_count(env_dir)
    elsewhere = work / "user-app"
    elsewhere.mkdir()
    env = clean_env()
    run([str(env_dir / "bin" / "memory-pipelines"), "--help"], cwd=elsewhere, env=env,
        stdout=subprocess.DEVNULL)  # fmt: skip
    probe = (
        "import importlib.util, json, memory_pipelines as mp;"
        "print(json.dumps({'version': mp.__version__, 'file': mp.__file__,"
        " 'dagster': importlib.util.find_spec('dagster') is not None}))"
    )
    out = json.loads(run([str(py), "-c", probe], cwd=elsewhere, env=env, capture_output=True,
                         text=True).stdout)  # fmt: skip
    assert out["file"].startswith(str(env_dir)), out
    assert not out["dagster"], "the core install brought Dagster"
    example = elsewhere / "example.py"
    example.write_text(first_python_block(ROOT / "README.md"), encoding="utf-8")
    proc = run([str(py), str(example)], cwd=elsewhere, env=env, capture_output=True, text=True)
    print(proc.stdout[-2000:])
    assert proc.stdout.strip(), "the README example printed nothing"
    return {"core_mb": round(size), "core_packages": count, "version": out["version"]}


USER_PROJECT = {
    "assets/__init__.py": "from assets.greetings import greeting\n",
    "assets/greetings.py": (
        "import dagster as dg\n\n\n@dg.asset\ndef greeting() -> str:\n    return 'hello'\n"
    ),
    "resources/__init__.py": "GREETING_RESOURCE = 'the user project own resources package'\n",
    "jobs/__init__.py": "import dagster as dg\n\ngreet_job = dg.define_asset_job('greet_job', selection=['greeting'])\n",
    "definitions.py": (
        "import dagster as dg\n"
        "import resources\n"
        "from assets import greeting\n"
        "from jobs import greet_job\n"
        "from memory_pipelines.definitions import defs as memory_defs\n\n"
        "assert resources.GREETING_RESOURCE.startswith('the user project')\n"
        "defs = dg.Definitions.merge(memory_defs, dg.Definitions(assets=[greeting], jobs=[greet_job]))\n"
    ),
    "check.py": (
        "import json, sys\n"
        "import dagster as dg\n"
        "import definitions\n"
        "dg.Definitions.validate_loadable(definitions.defs)\n"
        "repo = definitions.defs.get_repository_def()\n"
        "jobs = sorted(j.name for j in repo.get_all_jobs())\n"
        "assert 'greet_job' in jobs and len(jobs) > 2, jobs\n"
        "print(json.dumps({'jobs': jobs, 'resources_file': sys.modules['resources'].__file__}))\n"
    ),
}


def check_dagster(work: Path, wheel: Path) -> dict:
    env_dir = work / "dagster-venv"
    py = venv(env_dir)
    run([str(py), "-m", "pip", "install", "--quiet", "-c", str(CONSTRAINTS), f"{wheel}[dagster]"])
    size, count = size_and_count(env_dir)
    project = work / "my-dagster-project"
    for rel, text in USER_PROJECT.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text, encoding="utf-8")
    env = {**clean_env(), "MEMORY_HOME": str(work / "dagster-home"), "DAGSTER_DISABLE_TELEMETRY": "1"}
    proc = run([str(py), "check.py"], cwd=project, env=env, capture_output=True, text=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["resources_file"].startswith(str(project)), out
    return {"dagster_mb": round(size), "dagster_packages": count, "jobs": len(out["jobs"])}


def check_bounds(work: Path, wheel: Path, which: str) -> dict:
    """The store, compaction and judge tests against the lowest or newest allowed pair."""
    pinned = [
        line for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
        and re.sub(r"[-_.]+", "-", line.split("==")[0]).lower() not in VARIED
    ]  # fmt: skip
    varied = work / f"constraints-{which}.txt"
    varied.write_text("\n".join(pinned) + "\n", encoding="utf-8")
    env_dir = work / f"{which}-venv"
    py = venv(env_dir)
    wanted = LOWEST if which == "lowest" else []
    run([str(py), "-m", "pip", "install", "--quiet", "-c", str(varied), f"{wheel}[dagster]",
         "pytest", "pytest-timeout", "hypothesis", *wanted])  # fmt: skip
    versions = run(
        [str(py), "-c", "import importlib.metadata as m, json; print(json.dumps({d: m.version(d) "
         "for d in ('lancedb', 'pylance', 'litellm', 'tenacity')}))"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    print(which, versions, flush=True)
    # the checkout's tests against the installed package and the varied versions
    tests = work / f"{which}-tests"
    shutil.copytree(ROOT / "tests", tests)
    env = {**clean_env(), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "--rootdir", str(tests), *[str(tests / Path(t).relative_to("tests")) for t in BOUNDS_TESTS]],
        cwd=work, env=env)  # fmt: skip
    return {f"{which}_versions": json.loads(versions)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="build,core,dagster,bounds")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    steps = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="memory-pipelines-install-"))
    figures: dict = {}
    started = time.monotonic()
    try:
        wheel, _ = check_build(work)
        if "core" in steps:
            figures.update(check_core(work, wheel))
            shutil.rmtree(work / "core-venv", ignore_errors=True)
        if "dagster" in steps:
            figures.update(check_dagster(work, wheel))
            shutil.rmtree(work / "dagster-venv", ignore_errors=True)
        if "bounds" in steps:
            for which in ("lowest", "newest"):
                figures.update(check_bounds(work, wheel, which))
                shutil.rmtree(work / f"{which}-venv", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    figures["seconds"] = round(time.monotonic() - started)
    print("check-install:", json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
