"""The retry policies (memory_pipelines.retries): what each retries, how often, how long it
waits, and what it raises once it gives up; and the callers that use them."""

from __future__ import annotations

import dataclasses
import sqlite3
import sys

import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.exc import OperationalError as SQLOperationalError

from memory_pipelines import retries
from memory_pipelines.errors import SourceError, StoreError
from memory_pipelines.retries import (
    COMPACTION_CONFLICT,
    SQL_SCHEMA_RACE,
    SQLITE_LOCKED,
    STORE_COMMIT_CONFLICT,
    STORE_VERSION_LISTING_RACE,
)


class Flaky:
    """Raises ``errors`` in turn, then returns ``"ok"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.args = (args, kwargs)
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def _run(policy, fn, *args, **kwargs):
    slept: list[float] = []
    told: list[tuple[int, str, float]] = []
    result = policy.call(
        fn, *args, sleep=slept.append,
        before_sleep=lambda n, e, s: told.append((n, str(e), s)), **kwargs,
    )
    return result, slept, told


def test_a_commit_conflict_is_retried_and_then_succeeds_with_the_policy_waits():
    fn = Flaky(RuntimeError("Commit conflict for version 7"), RuntimeError("retryable commit"))
    result, slept, told = _run(STORE_COMMIT_CONFLICT, fn, "data", mode="append")
    assert result == "ok" and fn.calls == 3
    assert fn.args == (("data",), {"mode": "append"})
    assert slept == pytest.approx([0.02, 0.04])
    assert [n for n, _, _ in told] == [1, 2] and "conflict" in told[0][1].lower()


def test_an_error_that_is_not_a_conflict_is_raised_at_once():
    fn = Flaky(ValueError("schema mismatch: column x"))
    with pytest.raises(ValueError, match="schema mismatch"):
        _run(STORE_COMMIT_CONFLICT, fn)
    assert fn.calls == 1


def test_the_first_attempt_that_succeeds_does_not_import_tenacity(monkeypatch):
    monkeypatch.setitem(sys.modules, "tenacity", None)  # an import would raise
    assert STORE_COMMIT_CONFLICT.call(lambda: 42) == 42


@pytest.mark.parametrize(
    ("policy", "error", "attempts", "waits"),
    [
        (STORE_COMMIT_CONFLICT, RuntimeError("commit conflict"), 8,
         [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]),
        (STORE_VERSION_LISTING_RACE, RuntimeError("Not found: _versions/3.manifest"), 8,
         [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07]),
        (COMPACTION_CONFLICT, StoreError("notes: optimize failed: conflict"), 3, [0.05, 0.10]),
        (SQL_SCHEMA_RACE, SQLOperationalError("CREATE", {}, Exception("table x already exists")),
         10, [0.05 * n for n in range(1, 10)]),
    ],
    ids=lambda v: getattr(v, "name", None),
)
def test_exhaustion_raises_the_last_error_after_the_policy_attempts(policy, error, attempts, waits):
    fn = Flaky(*[error] * 20)
    with pytest.raises(type(error)) as raised:
        _run(policy, fn)
    assert raised.value is error
    assert fn.calls == attempts
    slept: list[float] = []
    with pytest.raises(type(error)):
        policy.call(Flaky(*[error] * 20), sleep=slept.append)
    assert slept == pytest.approx(waits)


def test_the_compaction_policy_retries_only_a_store_conflict():
    fn = Flaky(RuntimeError("conflict"))  # not a StoreError: not from the table
    with pytest.raises(RuntimeError):
        _run(COMPACTION_CONFLICT, fn)
    assert fn.calls == 1
    fn = Flaky(StoreError("notes: optimize failed: disk full"))
    with pytest.raises(StoreError):
        _run(COMPACTION_CONFLICT, fn)
    assert fn.calls == 1


def test_the_sqlite_policy_retries_a_locked_file_for_its_seconds_only():
    fn = Flaky(sqlite3.OperationalError("database is locked"), sqlite3.OperationalError("locked"))
    result, slept, _ = _run(SQLITE_LOCKED, fn)
    assert result == "ok" and slept == pytest.approx([0.005, 0.01])
    fn = Flaky(sqlite3.OperationalError("no such table: x"))
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        _run(SQLITE_LOCKED, fn)
    assert fn.calls == 1
    fn = Flaky(*[sqlite3.OperationalError("database is locked")] * 1000)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        SQLITE_LOCKED.with_seconds(0.0).call(fn)
    assert fn.calls == 1  # past its deadline after the first attempt
    # the waits double up to their cap
    slept: list[float] = []
    fn = Flaky(*[sqlite3.OperationalError("database is locked")] * 10)
    assert SQLITE_LOCKED.with_seconds(3600).call(fn, sleep=slept.append) == "ok"
    assert slept == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.2, 0.2, 0.2, 0.2])


def test_every_policy_is_named_once():
    assert set(retries.POLICIES) == {
        "store commit conflict", "store version listing race", "compaction conflict",
        "SQL schema race", "SQLite locked",
    }


def test_a_sql_home_whose_schema_creation_keeps_failing_raises_a_source_error(tmp_path, monkeypatch):
    from memory_pipelines.sources import tables
    from memory_pipelines.sources.base import SourcesBase

    calls = []

    def always_racing(engine):
        calls.append(engine)
        raise SQLOperationalError("CREATE TABLE", {}, Exception("table notes already exists"))

    monkeypatch.setattr(tables, "_create_and_migrate", always_racing)
    monkeypatch.setattr(
        tables, "SQL_SCHEMA_RACE", dataclasses.replace(SQL_SCHEMA_RACE, first_wait=0.0)
    )
    with pytest.raises(SourceError, match="already exists"):
        SourcesBase(f"sqlite:///{tmp_path / 'm.db'}", clock=None)
    assert len(calls) == 10


def test_a_schema_created_under_the_policy_has_every_table(tmp_path):
    from memory_pipelines.sources.tables import create_schema, metadata

    engine = create_engine(f"sqlite:///{tmp_path / 'm.db'}")
    create_schema(engine)
    create_schema(engine)  # a second opener finds every table
    assert set(metadata.tables) <= set(inspect(engine).get_table_names())
    engine.dispose()


# -- the note table's writes and version listing ----------------------------------------------


class _Wrapped:
    """A LanceDB table whose ``name`` method raises ``errors`` in turn before it runs."""

    def __init__(self, table, name: str, *errors: BaseException) -> None:
        self._inner, self._name, self.errors, self.calls = table, name, list(errors), 0

    def __getattr__(self, attr):
        real = getattr(self._inner, attr)
        if attr != self._name:
            return real

        def flaky(*args, **kwargs):
            self.calls += 1
            if self.errors:
                raise self.errors.pop(0)
            return real(*args, **kwargs)

        return flaky


class _FlakyAppend:
    """pylance's append as the table's dataset calls it, raising ``errors`` in turn
    before it runs."""

    def __init__(self, *errors: BaseException) -> None:
        from memory_pipelines.store.lance_internals import append_rows

        self._real, self.errors, self.calls = append_rows, list(errors), 0

    def __call__(self, ds, data):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self._real(ds, data)


def _failing_appends(notes, monkeypatch, *errors: BaseException):
    """Make the table's appends raise ``errors`` in turn, on the path it takes: the
    dataset's append, or LanceDB's ``add`` where the dataset cannot append (the
    ``notes`` fixture's two parameters). Returns what counts the calls."""
    if notes._reads.available:
        flaky = _FlakyAppend(*errors)
        monkeypatch.setattr("memory_pipelines.store.dataset.append_rows", flaky)
        return flaky
    notes._t = _Wrapped(notes._t, "add", *errors)
    return notes._t


@pytest.fixture(params=["dataset", "lancedb"])
def notes(request, tmp_path, monkeypatch):
    from memory_pipelines.store import NoteStore

    monkeypatch.setattr(  # the policy's schedule, without its waits
        "memory_pipelines.store.rowtable.STORE_COMMIT_CONFLICT",
        dataclasses.replace(STORE_COMMIT_CONFLICT, first_wait=0.0),
    )
    monkeypatch.setattr(
        "memory_pipelines.store.rowtable.STORE_VERSION_LISTING_RACE",
        dataclasses.replace(STORE_VERSION_LISTING_RACE, first_wait=0.0),
    )
    table = NoteStore(str(tmp_path / "lance"), 4).notes
    table._reads.available = request.param == "dataset"
    return table


def _note(i: int):
    import numpy as np

    from memory_pipelines.notes import Note

    return [Note(id=f"n{i}", note=f"note {i}")], np.eye(4, dtype=np.float32)[[i % 4]]


def test_a_table_write_that_meets_a_commit_conflict_is_retried_and_lands(notes, monkeypatch):
    appends = _failing_appends(notes, monkeypatch, RuntimeError("Commit conflict for version 3: retry"))
    notes.add(*_note(1))
    assert appends.calls == 2
    assert [n.id for n in notes.get_many(["n1"])] == ["n1"]


def test_a_table_write_that_fails_otherwise_is_a_store_error_at_once(notes, monkeypatch):
    appends = _failing_appends(notes, monkeypatch, OSError("disk full"))
    with pytest.raises(StoreError, match="write failed: disk full"):
        notes.add(*_note(1))
    assert appends.calls == 1
    assert notes.get_many(["n1"]) == []


def test_a_table_write_whose_conflicts_outlast_the_policy_is_a_store_error(notes, monkeypatch):
    appends = _failing_appends(notes, monkeypatch, *[RuntimeError("commit conflict")] * 20)
    with pytest.raises(StoreError, match="write failed: commit conflict"):
        notes.add(*_note(1))
    assert appends.calls == STORE_COMMIT_CONFLICT.attempts


def test_a_version_listing_that_meets_a_cleaned_manifest_is_taken_again(notes):
    notes.add(*_note(1))
    notes._t = _Wrapped(notes._t, "list_versions", RuntimeError("Not found: 1.manifest"))
    assert notes.list_versions()
    notes._t = _Wrapped(notes._t._inner, "list_versions", *[RuntimeError("Not found")] * 9)
    with pytest.raises(StoreError, match="listing versions failed"):
        notes.list_versions()
    assert notes._t.calls == STORE_VERSION_LISTING_RACE.attempts
