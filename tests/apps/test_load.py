"""Load: a real ``memory-pipelines serve`` subprocess, 8 client processes writing and
injecting for a bounded time while another process runs forced Memory Manager cycles.
Afterwards every ``written`` note is in the store exactly once, no request got a 5xx, and
no run exceeded its write cap. Prints p95 latencies (no timed assertions)."""

from __future__ import annotations

import multiprocessing
import subprocess

import numpy as np
import pytest
from reliability_helpers import PYTHON, load_client, start_server, stop_process, subprocess_env

pytestmark = pytest.mark.slow

CLIENTS = 8
SECONDS = 15.0
CAP = 5

MAINTENANCE = """
import sys, time
from memory_pipelines import MemoryService
deadline = time.monotonic() + float(sys.argv[2])
cycles = 0
with MemoryService.from_env(sys.argv[1]) as svc:
    while time.monotonic() < deadline:
        svc.manager.run_cycle(force_maintenance=True)
        cycles += 1
print("cycles", cycles)
"""


def test_concurrent_writes_injects_and_maintenance(tmp_path, open_service):
    home = tmp_path / "home"
    with open_service(home, clock=None) as svc:
        svc.configure_agent("load-agent", note_injection_strategy="Relevant")
    env = subprocess_env()
    server, url = start_server(
        lambda port: [PYTHON, "-m", "memory_pipelines.apps.cli", "serve", "--home", str(home),
                      "--port", str(port), "--log-level", "warning"],
        log=tmp_path / "server.log", env=env, text=True, timeout=90,
    )
    try:
        maint = subprocess.Popen([PYTHON, "-c", MAINTENANCE, str(home), str(SECONDS)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ctx = multiprocessing.get_context("spawn")
        pool = ctx.Pool(CLIENTS)
        try:
            # each client stops by itself after SECONDS; the bound only guards a hang
            outs = pool.map_async(
                load_client, [(url, k, SECONDS, CAP) for k in range(CLIENTS)]
            ).get(timeout=600)
        except BaseException:
            pool.terminate()
            pool.join()
            raise
        pool.close()  # the workers exit on the pool's sentinel, not on a signal
        pool.join()
        m_out, m_err = maint.communicate(timeout=600)
        assert maint.returncode == 0, m_err[-3000:]
    finally:
        stop_process(server)
    server_log = (tmp_path / "server.log").read_text()
    errors = [e for o in outs for e in o["errors"]]
    assert not errors, (errors, server_log[-4000:])

    statuses: dict[int, int] = {}
    for o in outs:
        for code, n in o["statuses"].items():
            statuses[code] = statuses.get(code, 0) + n
    assert not [c for c in statuses if c >= 500], statuses
    assert set(statuses) == {200}, statuses
    written = [i for o in outs for i in o["written"]]
    assert written and len(written) == len(set(written))
    per_run = {r: n for o in outs for r, n in o["per_run"].items()}
    assert max(per_run.values()) == CAP  # capped runs were exercised and held
    with open_service(home, clock=None) as svc:
        df = svc.store.notes.scan(None, ["id", "source_run_id"])
    counts = df["id"].value_counts()
    missing = [i for i in written if i not in counts.index]
    assert not missing, f"{len(missing)} written notes missing"
    assert int(counts.max()) == 1, counts[counts > 1]
    stored_per_run = df[df["source_run_id"].notna()].groupby("source_run_id").size()
    assert int(stored_per_run.max()) <= CAP
    w = np.array([x for o in outs for x in o["write_ms"]])
    j = np.array([x for o in outs for x in o["inject_ms"]])
    print(
        f"\nload: {CLIENTS} clients x {SECONDS:.0f}s, {m_out.strip()}, {len(w)} write batches "
        f"({len(written)} notes written), {len(j)} injects; "
        f"write p50 {np.percentile(w, 50):.0f} ms p95 {np.percentile(w, 95):.0f} ms; "
        f"inject p50 {np.percentile(j, 50):.0f} ms p95 {np.percentile(j, 95):.0f} ms"
    )
