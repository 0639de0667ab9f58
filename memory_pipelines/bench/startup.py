"""``memory-pipelines bench startup``: how fast each entry point starts, as medians of fresh
processes.

Rows: ``import memory_pipelines``; ``memory-pipelines --help`` and every subcommand's
``--help``; ``mcp`` from spawn to its answer to ``initialize``; ``serve`` from spawn to its
first answer of ``/healthz`` (503 ``starting`` while the home opens) and to its first 200;
and, in one process per repetition, ``MemoryService.open``, the first ``inject`` (the
offline model is loaded then: model load included) and the second; then the same after
``MemoryService.warm_up()`` (the model loaded at start-up, as ``serve`` and ``mcp`` do in
the background). Targets: ``--help`` and import <= 0.3 s, mcp initialize <= 1 s, serve's
first ``/healthz`` answer <= 1.5 s, first inject after warm-up <= 3x the second.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tabulate import tabulate

CLI = [sys.executable, "-m", "memory_pipelines.apps.cli"]
AGENT = "bench-agent"

INJECT_SCRIPT = """
import json, sys, time, uuid
t0 = time.perf_counter()
from memory_pipelines import MemoryService
with MemoryService.open(sys.argv[1]) as svc:
    if sys.argv[3] == "warm":
        svc.warm_up()  # what serve and mcp start in the background
    t1 = time.perf_counter()
    ctx = {"agent_id": sys.argv[2], "user_id": "u1", "run_id": "bench"}
    nonce = uuid.uuid4().hex  # new texts: the home's embedding cache cannot answer them
    svc.inject(ctx, f"what does the user drink in the morning? {nonce}")
    t2 = time.perf_counter()
    svc.inject(ctx, f"which city does the user live in? {nonce}")
    t3 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "first": t2 - t1, "second": t3 - t2}))
"""

SEED_SCRIPT = """
import sys
from memory_pipelines import MemoryService
with MemoryService.open(sys.argv[1]) as svc:
    svc.configure_agent(sys.argv[2])
    notes = ["The user drinks green tea every morning.", "The user lives in Lisbon.",
             "The user prefers short answers.", "The user is learning Portuguese."]
    svc.write({"agent_id": sys.argv[2], "user_id": "u1", "run_id": "seed"}, [{"note": n} for n in notes])
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(cmd: list[str], cwd: str | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh process running ``cmd``."""
    c0, t0 = _child_cpu(), time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   cwd=cwd, env=_env())  # fmt: skip
    return time.perf_counter() - t0, _child_cpu() - c0


def _with_cpu(measure: Callable[[], float]) -> tuple[float, float]:
    """``measure()``'s seconds and the CPU seconds of the process it started (and waited)."""
    c0 = _child_cpu()
    elapsed = measure()
    return elapsed, _child_cpu() - c0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mcp_initialize(home: str, timeout: float = 60.0) -> float:
    """Seconds from spawning ``memory-pipelines mcp`` to its answer to ``initialize``."""
    init = {
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "0"}},
    }  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*CLI, "mcp", "--home", home, "--agent", AGENT], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
    )  # fmt: skip
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(init).encode() + b"\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            raise SystemExit("mcp did not answer initialize")
        line = proc.stdout.readline()
        elapsed = time.perf_counter() - t0
        if not line:
            proc.wait(30)
            assert proc.stderr is not None
            raise SystemExit(f"mcp exited before answering:\n{proc.stderr.read().decode()[-2000:]}")
        answer = json.loads(line)
        if "result" not in answer:
            raise SystemExit(f"mcp answered {answer}")
        return elapsed
    finally:
        proc.kill()
        proc.wait(30)


def serve_healthz(home: str, timeout: float = 60.0) -> tuple[float, float]:
    """Seconds from spawning ``memory-pipelines serve`` to its first answer of ``/healthz``
    (503 ``starting`` while the home opens) and to its first 200 (the home open)."""
    port = _free_port()
    t0 = time.perf_counter()
    first: float | None = None
    proc = subprocess.Popen(
        [*CLI, "serve", "--home", home, "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
    )  # fmt: skip
    try:
        while time.perf_counter() - t0 < timeout:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                    if r.status == 200:
                        done = time.perf_counter() - t0
                        return (done if first is None else first), done
            except urllib.error.HTTPError as e:  # 503 starting: answered, not open yet
                if first is None and e.code == 503:
                    first = time.perf_counter() - t0
                time.sleep(0.01)
            except OSError:
                time.sleep(0.01)
            if proc.poll() is not None:
                raise SystemExit(f"serve exited with {proc.returncode}")
        raise SystemExit("serve did not answer /healthz")
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory-pipelines bench startup", description=__doc__)
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per row (default 5)")
    parser.add_argument("--skip-subcommands", action="store_true",
                        help="time only the top-level --help, not each subcommand's")  # fmt: skip
    args = parser.parse_args(argv)
    from memory_pipelines.apps.cli import COMMANDS

    rows: list[list[object]] = []

    def row(name: str, samples: list[tuple[float, float | None]], target: float | None) -> None:
        median = statistics.median(w for w, _ in samples)
        cpus = [c for _, c in samples if c is not None]
        cpu = f"{statistics.median(cpus):.3f}" if cpus else ""
        ok = "" if target is None else ("yes" if median <= target else "NO")
        rows.append([name, f"{median:.3f}", cpu, f"{target:.3f}" if target else "", ok])

    n = args.repeat
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        import_cmd = [sys.executable, "-c", "import memory_pipelines"]
        row("import memory_pipelines", [_timed(import_cmd, cwd=tmp) for _ in range(n)], 0.3)
        row("memory-pipelines --help", [_timed([*CLI, "--help"], cwd=tmp) for _ in range(n)], 0.3)
        if not args.skip_subcommands:
            for name in COMMANDS:
                samples = [_timed([*CLI, name, "--help"], cwd=tmp) for _ in range(n)]
                row(f"  {name} --help", samples, 0.3)
        home = str(Path(tmp) / "home")
        subprocess.run([sys.executable, "-c", SEED_SCRIPT, home, AGENT], check=True, env=_env())
        samples = [_with_cpu(lambda: mcp_initialize(home)) for _ in range(n)]
        row("mcp: spawn -> initialize answered", samples, 1.0)
        served = [_with_cpu(lambda: serve_healthz(home)) for _ in range(n)]
        row("serve: spawn -> /healthz answered", [(a, c) for (a, _), c in served], 1.5)
        row("serve: spawn -> /healthz 200 (home open)", [(b, c) for (_, b), c in served], None)
        for mode in ("cold", "warm"):
            runs = []
            for _ in range(n):
                out = subprocess.run([sys.executable, "-c", INJECT_SCRIPT, home, AGENT, mode],
                                     check=True, capture_output=True, text=True, env=_env())  # fmt: skip
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            second = statistics.median(r["second"] for r in runs)
            if mode == "cold":
                row("import + MemoryService.open", [(r["open"], None) for r in runs], None)
                row("first inject, model load included", [(r["first"], None) for r in runs], None)
            else:
                row("import + open + warm_up()", [(r["open"], None) for r in runs], None)
                row("first inject after warm_up()", [(r["first"], None) for r in runs], 3 * second)
            row("second inject", [(r["second"], None) for r in runs], None)
    print("wall: median seconds of fresh processes; cpu: their median CPU seconds (user+sys),")
    print("which a busy machine does not inflate")
    print(tabulate(rows, headers=["entry point", "wall", "cpu", "target (wall)", "ok"],
                   tablefmt="github"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
