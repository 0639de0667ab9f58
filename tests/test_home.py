"""Broken memory homes: a file where the folder should be, a home that cannot be written,
a corrupted SQLite file and a deleted note store. Opening refuses each with a
``HomeError`` naming the path, the CLI prints one line and exits non-zero (no
traceback), and ``/healthz`` reports a home it cannot write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from reliability_helpers import running

import memory_pipelines
from memory_pipelines.apps import cli
from memory_pipelines.apps.http import create_app
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import HomeError, MemoryPipelineError, ValidationError
from memory_pipelines.home import write_problem
from memory_pipelines.notes import RunContext
from memory_pipelines.service import MemoryService

AGENT = "agent-1"

#: every command that opens a home, with the arguments it needs besides ``--home``
COMMANDS = {
    "inventory": [],
    "why": ["tea", "--agent", AGENT],
    "cycle": [],
    "serve": [],
    "purge-user": ["user-1"],
    "mcp": [],
}
#: commands that finish on their own even when the home opens (serve and mcp would serve)
FINITE = ["inventory", "why", "cycle", "purge-user"]


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    for name in ("MEMORY_HOME", "MEMORY_LANCE_URI", "MEMORY_SQL_URL", "MEMORY_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)


def _open(home: Path, clock) -> MemoryService:
    return MemoryService.open(home, embedder=HashEmbedder(dim=64), clock=clock)


def _cli_fails_in_one_line(capsys, command: str, home: Path, *needles: str) -> str:
    """Run ``memory-pipelines COMMAND --home HOME`` in process; it must exit non-zero with
    one line on stderr naming the home (and each needle), and no traceback."""
    capsys.readouterr()
    rc = cli.main([command, *COMMANDS[command], "--home", str(home)])
    err = capsys.readouterr().err
    assert rc != 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in (str(home), *needles):
        assert needle in lines[0], err
    return lines[0]


def _seeded(home: Path, clock) -> None:
    """A home with a written note (so the SQL ledger names it) and an injection."""
    with _open(home, clock) as svc:
        svc.configure_agent(AGENT)
        ctx = RunContext(agent_id=AGENT, run_id="run-1", user_id="user-1")
        res = svc.write(ctx, [{"note": "User prefers tea over coffee", "type": "Preference"}])
        assert res[0].disposition == "written"
        assert svc.inject(ctx, "tea").notes


def test_home_error_is_exported_and_a_project_error():
    assert memory_pipelines.HomeError is HomeError
    assert "HomeError" in memory_pipelines.__all__
    assert issubclass(HomeError, MemoryPipelineError)


# --------------------------------------------------------------------------- a file


def test_open_refuses_a_home_that_is_a_file(tmp_path, clock):
    home = tmp_path / "home"
    home.write_text("not a folder")
    with pytest.raises(HomeError, match="not a folder") as info:
        _open(home, clock)
    assert str(home) in str(info.value)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_cli_reports_a_home_that_is_a_file_in_one_line(tmp_path, capsys, command):
    home = tmp_path / "home"
    home.write_text("not a folder")
    _cli_fails_in_one_line(capsys, command, home, "not a folder")


def test_cli_main_prints_any_project_error_in_one_line(monkeypatch, capsys):
    def boom(argv):
        raise ValidationError("first line\nsecond line")

    monkeypatch.setitem(cli.COMMANDS, "inventory", (boom, ""))
    assert cli.main(["inventory"]) == 2
    assert capsys.readouterr().err == "memory-pipelines: error: first line\n"


# --------------------------------------------------------------------------- read-only


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """Make ``folder`` refuse new files. A normal user gets ``chmod 0555``; root ignores
    modes, so as root the folder gets the immutable attribute (``chattr +i``). Skips
    when neither stops a write here."""
    chattr = shutil.which("chattr")
    if os.geteuid() != 0:
        folder.chmod(0o555)

        def undo() -> None:
            folder.chmod(0o755)
    elif chattr is None:
        pytest.skip("running as root without chattr: nothing makes a folder read-only")
    else:
        done = subprocess.run([chattr, "+i", str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"running as root and `chattr +i` is refused here: {done.stderr.strip()}")

        def undo() -> None:
            subprocess.run([chattr, "-i", str(folder)], check=True)
    try:
        probe = folder / ".write-probe"
        try:
            probe.touch()
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip(f"{folder} stays writable after chmod/chattr on this file system")
        yield
    finally:
        undo()


def test_open_refuses_a_home_it_cannot_write(tmp_path, clock):
    home = tmp_path / "home"
    _seeded(home, clock)
    with read_only(home):
        with pytest.raises(HomeError, match="not writable") as info:
            _open(home, clock)
    assert str(home) in str(info.value)
    _open(home, clock).close()  # writable again: opens


@pytest.mark.parametrize("command", FINITE)
def test_cli_reports_a_home_it_cannot_write_in_one_line(tmp_path, clock, capsys, command):
    home = tmp_path / "home"
    _seeded(home, clock)
    with read_only(home):
        _cli_fails_in_one_line(capsys, command, home, "not writable")


def test_healthz_reports_a_home_it_cannot_write(svc):
    svc.configure_agent(AGENT)
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        with read_only(svc.home):
            r = client.get("/healthz")
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "degraded"
        assert "not writable" in body["reason"] and str(svc.home) in body["reason"]
        assert client.get("/healthz").status_code == 200  # writable again


def test_healthz_reports_a_read_only_sql_database(tmp_path, clock, open_service):
    home = tmp_path / "home"
    _seeded(home, clock)
    db = (home / "memory.sqlite3").resolve()
    with open_service(
        home,
        sql_url=f"sqlite:///file:{db}?mode=ro&uri=true",
    ) as svc, running(create_app(svc)) as url:
        r = httpx.get(url + "/healthz", timeout=60)
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "degraded" and "SQL database" in body["reason"]


# --------------------------------------------------------------------------- corrupted SQL


@pytest.mark.parametrize("name", ["memory.sqlite3", "embedding-cache.sqlite3"])
def test_open_refuses_a_corrupted_sqlite_file(tmp_path, clock, name):
    home = tmp_path / "home"
    _seeded(home, clock)
    bad = home / name
    for extra in home.glob(name + "-*"):  # -wal, -shm
        extra.unlink()
    bad.write_bytes(b"\x00garbage\xff" * 512)
    with pytest.raises(HomeError, match="not a SQLite database") as info:
        _open(home, clock)
    assert str(bad) in str(info.value)


@pytest.mark.parametrize("command", FINITE)
def test_cli_reports_a_corrupted_sqlite_file_in_one_line(tmp_path, clock, capsys, command):
    home = tmp_path / "home"
    _seeded(home, clock)
    (home / "memory.sqlite3").write_bytes(os.urandom(8192))
    _cli_fails_in_one_line(capsys, command, home, "memory.sqlite3", "not a SQLite database")


# --------------------------------------------------------------------------- deleted notes


def test_open_refuses_a_deleted_note_store_the_sql_still_references(tmp_path, clock):
    home = tmp_path / "home"
    _seeded(home, clock)
    shutil.rmtree(home / "lance")
    for _ in range(2):  # the refusal creates no empty table that a second open would accept
        with pytest.raises(HomeError, match="note store") as info:
            _open(home, clock)
        message = str(info.value)
        assert str(home / "lance") in message and "missing" in message
        assert "\n" not in message


def test_a_new_home_and_an_unreferenced_note_store_are_still_created(tmp_path, clock):
    home = tmp_path / "home"
    with _open(home, clock) as svc:  # brand new: created as before
        svc.configure_agent(AGENT)
    shutil.rmtree(home / "lance")
    with _open(home, clock) as svc:  # no SQL row names a note: nothing was lost
        assert svc.store.notes.count() == 0


@pytest.mark.parametrize("command", FINITE)
def test_cli_reports_a_deleted_note_store_in_one_line(tmp_path, clock, capsys, command):
    home = tmp_path / "home"
    _seeded(home, clock)
    shutil.rmtree(home / "lance")
    _cli_fails_in_one_line(capsys, command, home, "note store", "missing")


# --------------------------------------------------------------------------- SQLite locks

LIST_AGENTS = """
import sys
from memory_pipelines import MemoryService
from memory_pipelines.embeddings import HashEmbedder
with MemoryService.open(sys.argv[1], embedder=HashEmbedder(dim=8)) as s:
    if len(sys.argv) > 2:
        s.configure_agent(sys.argv[2])
    print(",".join(sorted(a.agent_id for a in s.sources.list_agents())))
"""


def _other_process(home, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", LIST_AGENTS, str(home), *args],
        capture_output=True, text=True, check=True, timeout=300,
    )
    return out.stdout.strip()


@pytest.mark.parametrize("check", ["healthz", "second open"])
def test_home_checks_keep_the_sqlite_locks_of_open_connections(tmp_path, check):
    """Opening and closing a database file with plain file calls drops every POSIX lock
    SQLite holds on it in this process; another process then believes it is alone,
    deletes the WAL on close, and this process's later commits go to an orphaned WAL:
    invisible to others and lost at close. The home checks must not do that."""
    home = tmp_path / "home"
    svc = MemoryService.open(home, embedder=HashEmbedder(dim=8))
    try:
        svc.configure_agent("a")
        if check == "healthz":
            assert write_problem(svc.home, svc.sources) is None
        else:
            MemoryService.open(home, embedder=HashEmbedder(dim=8)).close()
        assert _other_process(home, "b") == "a,b"
        svc.configure_agent("c")
        assert _other_process(home) == "a,b,c"  # this process's commit is visible
    finally:
        svc.close()
    assert _other_process(home) == "a,b,c"  # and durable
