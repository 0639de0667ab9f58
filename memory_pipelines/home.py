"""Checks of a memory home: the folder holding the LanceDB database (``lance/``), the SQL
sources (``memory.sqlite3``) and the embedding cache (``embedding-cache.sqlite3``).

``MemoryService.open`` runs them before it touches anything, so a broken home is one
``HomeError`` naming the path instead of a traceback from deep inside SQLite or LanceDB:

- :func:`existing_home`: refuse a home that does not exist (commands that only read or
  change one);
- :func:`prepare_home`: create the folder if needed; refuse a file where it should be,
  or a folder no file can be created in;
- :func:`check_sqlite_file`: refuse an existing SQLite file that is not one (garbage);
- :func:`note_references`: how many SQL rows name notes of the note store (write
  ledger, injection events, Memory Manager runs), so a deleted note store is refused
  rather than silently recreated empty.

``/healthz`` asks :func:`write_problem` whether the home and the SQL database can
still be written.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from memory_pipelines.errors import HomeError, first_line
from memory_pipelines.sources import Sources

#: files of a home that must stay writable when they exist (the service writes them)
WRITABLE_FILES = ("memory.sqlite3", "embedding-cache.sqlite3")


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def home_problem(home: Path) -> str | None:
    """Why ``home`` cannot be written (a probe file cannot be created in it, or one of
    its database files cannot be opened for writing); None when it can."""
    if not home.is_dir():
        return f"memory home {home} is not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=home, prefix=".write-probe-"):
            pass
    except OSError as e:
        return f"memory home {home} is not writable ({_reason(e)})"
    for name in WRITABLE_FILES:
        path = home / name
        # never open() a database file SQLite may hold: closing any descriptor of it
        # drops every POSIX lock SQLite holds on it in this process (see check_sqlite_file)
        if path.is_file() and not os.access(path, os.W_OK):
            return f"memory home {home} is not writable: {path} (permission denied)"
    return None


#: what a home holds once the service has opened it (the SQL sources, the note tables)
HOME_MARKERS = ("memory.sqlite3", "lance")


def existing_home(home: str | Path | None) -> Path:
    """The home a command that reads or changes one names (``None``: ``$MEMORY_HOME`` or
    ``./.memory``); ``HomeError`` naming the path when there is none there, so a typo
    is refused instead of opening a new, empty home. A home whose SQL database and note
    tables live elsewhere (``MEMORY_SQL_URL`` and ``MEMORY_LANCE_URI``) only needs its
    folder."""
    path = Path(home) if home is not None else Path(os.environ.get("MEMORY_HOME") or ".memory")
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise HomeError(
            f"memory home {path} {what}; check --home or MEMORY_HOME"
            " (commands that create a home: demo, serve, proxy, mcp, import, keys create, agents set)"
        )
    external = os.environ.get("MEMORY_SQL_URL") and os.environ.get("MEMORY_LANCE_URI")
    if not external and not any((path / name).exists() for name in HOME_MARKERS):
        raise HomeError(
            f"memory home {path} holds no memory (no {' or '.join(HOME_MARKERS)});"
            " check --home or MEMORY_HOME"
        )
    return path


def prepare_home(home: Path) -> None:
    """Create ``home`` (and its parents) if needed; ``HomeError`` when it is a file or
    cannot be created or written."""
    if home.exists() and not home.is_dir():
        raise HomeError(f"memory home {home} is not a folder (a file is in its place)")
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HomeError(f"cannot create memory home {home} ({_reason(e)})") from None
    problem = home_problem(home)
    if problem:
        raise HomeError(problem)


def sqlite_file(sql_url: str) -> Path | None:
    """The local file of a ``sqlite`` URL (plain or ``file:`` URI form); None for
    another backend or an in-memory database."""
    try:
        url = make_url(sql_url)
    except ArgumentError:
        return None
    if url.get_backend_name() != "sqlite" or not url.database:
        return None
    database = url.database
    if database.startswith("file:"):
        database = database[len("file:") :].split("?", 1)[0]
    if database in ("", ":memory:"):
        return None
    return Path(database)


def check_sqlite_file(path: Path | None) -> None:
    """``HomeError`` when ``path`` exists, is not empty and is not a SQLite database."""
    if path is None or not path.is_file():
        return
    if path.stat().st_size == 0:
        return
    # Read the header through SQLite, never with open(): closing a descriptor of a
    # database file drops every POSIX lock SQLite holds on it in this process (a second
    # service on one home, /healthz), so another process would delete the WAL this
    # process still writes to, and its commits would be lost.
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            conn.execute("PRAGMA schema_version").fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        if "not a database" not in str(e):
            raise HomeError(f"cannot read the SQLite file {path} ({e})") from None
        raise HomeError(
            f"{path} is not a SQLite database (corrupted or another kind of file);"
            " restore it from a backup or move it away"
        ) from None


def note_references(sources: Sources) -> int:
    """SQL rows that only exist once the note store held notes: write-ledger entries,
    recorded injections of notes and Memory Manager runs (0 for a fresh database)."""
    return sources.note_references()


def sql_problem(sources: Sources) -> str | None:
    """Why the SQL database cannot be written (a no-op update is refused); None when it
    can. Nothing is changed: the update matches no row and is rolled back."""
    try:
        sources.probe_write()
    except Exception as e:  # any driver error means "cannot write"
        reason = first_line(getattr(e, "orig", None) or e)
        return f"SQL database {display_url(sources.url)} is not writable ({reason})"
    return None


def write_problem(home: Path | None, sources: Sources) -> str | None:
    """Why an open home and its SQL database cannot be written; None when they can."""
    problem = home_problem(Path(home)) if home is not None else None
    return problem or sql_problem(sources)


def display_url(sql_url: str) -> str:
    """The SQL URL without its password (a SQLite URL as its file path)."""
    path = sqlite_file(sql_url)
    if path is not None:
        return str(path)
    try:
        return make_url(sql_url).render_as_string(hide_password=True)
    except ArgumentError:
        return sql_url


__all__ = [
    "check_sqlite_file",
    "display_url",
    "existing_home",
    "first_line",
    "home_problem",
    "note_references",
    "prepare_home",
    "sql_problem",
    "sqlite_file",
    "write_problem",
]
