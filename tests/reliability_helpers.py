"""Shared helpers of the suites that start servers and processes (purge, properties,
isolation, faults, crash, load, HTTP, Dask): a real uvicorn server on loopback, a server
subprocess on a free port that retries when another process took the port first, a
reader of a child's output that cannot lose lines, a snapshot of the notes table, and the
environment of ``memory-pipelines`` subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from memory_pipelines.apps.http import serving_in_thread

ROOT = Path(__file__).resolve().parents[1]

#: columns whose change means "something stored changed"
SNAPSHOT_COLUMNS = [
    "id", "note", "type", "status", "agent_id", "user_id", "company_id", "access_count",
    "last_accessed_at", "updated_at", "comments", "consolidated_into_note_id",
]


#: a real uvicorn server on loopback in a background thread for the block; yields its URL
running = serving_in_thread


def snapshot(svc: Any) -> list[tuple]:
    """The notes table as sorted tuples of ``SNAPSHOT_COLUMNS`` (for before/after checks)."""
    df = svc.store.notes.scan(None, SNAPSHOT_COLUMNS)
    rows = [tuple(str(v) for v in r) for r in df.itertuples(index=False)]
    return sorted(rows)


def restore_default_signals() -> list[str]:
    """Let SIGINT and SIGTERM stop this process and every child it starts again, if the
    process was started with them ignored; returns the names it restored.

    A shell starts a background job (``cmd &``, ``nohup``) with SIGINT ignored, and
    Dagster's in-process execution maps SIGTERM onto SIGINT's handler, so after one
    in-process job SIGTERM is ignored too. Ignored signals are inherited across fork and
    exec: every child started later (Dask workers, ``dagster job execute`` and its
    ``tail -F`` compute-log readers, multiprocessing pool workers) then ignores
    ``terminate()``, and whatever waits for it to end hangs until a timeout.
    """
    import signal

    restored = []
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        restored.append("SIGINT")
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        restored.append("SIGTERM")
    return restored


def assert_nothing_lost_or_half_applied(svc: Any, before_ids: set[str]) -> Any:
    """The note table's invariants after an interrupted or untrusted change: no note of
    ``before_ids`` lost, every lineage link resolves, a note is consolidated only into a
    live note, and a live consolidated note never stands beside a live source (a whole
    cluster or none). Returns the notes frame for further checks."""
    notes = svc.notes()
    ids = set(notes["id"])
    assert before_ids <= ids, f"notes lost: {before_ids - ids}"
    by_id = {r.id: r for r in notes.itertuples(index=False)}
    for r in by_id.values():
        derived = list(r.derived_from_note_ids) if r.derived_from_note_ids is not None else []
        for src in derived:
            assert src in ids, f"{r.id} derives from missing {src}"
        if isinstance(r.consolidated_into_note_id, str):
            target = by_id.get(r.consolidated_into_note_id)
            assert target is not None, f"{r.id} consolidated into a missing note"
            assert target.status in ("Active", "Provisional"), (r.note, target.status)
        if derived and r.status in ("Active", "Provisional"):  # a whole cluster, never half
            for src in derived:
                assert by_id[src].status not in ("Active", "Provisional") or src == r.id, (
                    f"cluster half-applied: {by_id[src].note!r} still {by_id[src].status}")
    return notes


def free_port() -> int:
    """A loopback port nobody listened on a moment ago. Another process may take it
    before the caller binds it: servers started on it go through :func:`start_server`,
    which retries; a port that must stay unanswered comes from :func:`refused_port`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port held bound (not listening) for the block: connecting to it is
    refused, and no other process can start listening on it meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


#: What a server prints when its port was taken between :func:`free_port` and its bind.
PORT_TAKEN = ("address already in use", "errno 98")


def wait_for_output(
    proc: subprocess.Popen, path: Path, done: Callable[[str], bool], timeout: float
) -> str:
    """Poll ``path`` (where ``proc`` writes its output) until ``done(text)`` holds, and
    return the whole text. Reading the file whole each time cannot lose a line, unlike
    ``readline`` on a pipe followed by ``communicate``. Fails if the process exits first."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text(errors="replace")
        if done(text):
            return text
        if proc.poll() is not None:
            text = path.read_text(errors="replace")
            if done(text):
                return text
            raise AssertionError(f"process exited with {proc.returncode}:\n{text[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no expected output in {timeout:.0f}s:\n{text[-3000:]}")
        time.sleep(0.05)


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def start_server(
    argv: Callable[[int], Sequence[str]],
    *,
    log: Path,
    ready_path: str = "/healthz",
    timeout: float = 120,
    attempts: int = 5,
    **popen: Any,
) -> tuple[subprocess.Popen, str]:
    """Start ``argv(port)`` on a free loopback port and wait until ``GET ready_path``
    answers 200; returns the process and its base URL. Its stdout and stderr go to
    ``log``. When another process took the port between choosing and binding it, the
    server exits saying so, and a new port is tried (up to ``attempts`` times)."""
    for _ in range(attempts):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("w") as out:
            proc = subprocess.Popen(
                list(argv(port)), stdout=out, stderr=subprocess.STDOUT, **popen
            )
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if _answers(url + ready_path):
                return proc, url
            time.sleep(0.2)
        if proc.poll() is None:
            stop_process(proc)
            raise AssertionError(
                f"server did not answer in {timeout:.0f}s:\n{log.read_text()[-3000:]}"
            )
        text = log.read_text(errors="replace")
        if not any(sign in text.lower() for sign in PORT_TAKEN):
            raise AssertionError(f"server exited with {proc.returncode}:\n{text[-3000:]}")
    raise AssertionError(f"no free port after {attempts} attempts")


def run_bounded(
    args: Sequence[str], *, timeout: float, **popen: Any
) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True)`` in a session of its own.

    ``timeout`` is a guard against a hang, not a performance bound: choose it well above
    the slowest expected run. On expiry the whole process group is killed (a Dask cluster,
    Dagster's compute-log readers or pool workers the command started would otherwise
    outlive it and slow every later test) and the test fails with the output so far.
    """
    import signal

    proc = subprocess.Popen(
        list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(map(str, args))[:300]} did not finish in {timeout:.0f}s:\n"
            f"{out[-2000:]}\n{err[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(list(args), proc.returncode, out, err)


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> int:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child ``python``: the hash embedder, offline litellm, this repo."""
    env = dict(os.environ)
    env.update(
        MEMORY_EMBEDDING_MODEL="hash",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        DAGSTER_DISABLE_TELEMETRY="1",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


PYTHON = sys.executable


def run_scripts_at_once(script: str, arg_lists: list[list[str]], timeout: float = 300) -> list[str]:
    """Run ``python -c script *args`` once per argument list, all at the same time; assert
    each exits 0 and return their outputs (``timeout`` is a hang guard)."""
    procs = [
        subprocess.Popen(
            [PYTHON, "-c", script, *args],
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in arg_lists
    ]
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-2000:]
        outputs.append(out)
    return outputs


def load_client(args: tuple[str, int, float, int]) -> dict[str, Any]:
    """One load-test client process: write then inject in a loop until ``seconds`` pass.

    Each iteration is a new run of user ``u<k % 4>``; every fifth run, starting with the
    first (so a slow machine still exercises the cap), sends more writes than the per-run
    cap. Returns latencies (ms), status codes, the written note ids and,
    per run, how many writes came back ``written``.
    """
    import httpx

    url, client_no, seconds, cap = args
    write_ms: list[float] = []
    inject_ms: list[float] = []
    statuses: dict[int, int] = {}
    written: list[str] = []
    per_run: dict[str, int] = {}
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    i = 0
    # a hang guard, not a time limit: a loaded machine may take long for one request
    with httpx.Client(base_url=url, timeout=600) as http:
        while time.monotonic() < deadline:
            run_id = f"load-{client_no}-{i}"
            ctx = {"agent_id": "load-agent", "run_id": run_id, "user_id": f"u{client_no % 4}",
                   "company_id": "co"}
            n = cap + 2 if i % 5 == 0 else 2  # the first run of each client is over the cap
            writes = [
                {"note": f"Client {client_no} run {i} fact {j} about topic {(i + j) % 7}",
                 "type": "Preference" if j % 2 else "Context"}
                for j in range(n)
            ]
            t0 = time.perf_counter()
            try:
                r = http.post("/v1/memory-writes", json={"context": ctx, "writes": writes})
            except httpx.HTTPError as e:
                errors.append(f"write {run_id} after {time.perf_counter() - t0:.1f}s: {e!r}")
                break
            write_ms.append((time.perf_counter() - t0) * 1000)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 200:
                results = r.json()["results"]
                ids = [x["note_id"] for x in results if x["disposition"] == "written"]
                written.extend(ids)
                per_run[run_id] = len(ids)
            t0 = time.perf_counter()
            try:
                r = http.post("/v1/inject", json={"context": ctx, "current_input": f"topic {i % 7}"})
            except httpx.HTTPError as e:
                errors.append(f"inject {run_id} after {time.perf_counter() - t0:.1f}s: {e!r}")
                break
            inject_ms.append((time.perf_counter() - t0) * 1000)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            i += 1
    return {"write_ms": write_ms, "inject_ms": inject_ms, "statuses": statuses,
            "written": written, "per_run": per_run, "errors": errors}
