"""Registration by use and deletion records in the SQL sources (CONTRACT §2.9)."""

from __future__ import annotations

import os
import threading

import pytest
from reliability_helpers import run_scripts_at_once
from sqlalchemy import create_engine, select

from memory_pipelines.admin import Registry
from memory_pipelines.clock import FakeClock
from memory_pipelines.sources import Sources, companies, metadata, users

PG_URL = os.environ.get("MEMORY_TEST_POSTGRES_URL", "")


def _sources(tmp_path) -> Sources:
    return Sources(f"sqlite:///{tmp_path / 'm.sqlite3'}", FakeClock())


def _rows(src: Sources):
    with src.begin() as c:
        return (
            sorted(tuple(r) for r in c.execute(select(users.c.user_id, users.c.company_id))),
            sorted(r[0] for r in c.execute(select(companies.c.company_id))),
        )


def test_register_people_inserts_only_what_is_missing(tmp_path):
    src = _sources(tmp_path)
    src.register_people("u1", "acme")
    src.register_people("u1", "other")  # an existing user keeps its company
    src.register_people(None, "globex")
    src.register_people("u2", None)
    assert _rows(src) == ([("u1", "acme"), ("u2", None)], ["acme", "globex", "other"])
    src.close()


def test_the_registry_asks_the_database_once_per_pair(tmp_path):
    src = _sources(tmp_path)
    calls = []
    real = src.register_people
    src.register_people = lambda u, c: (calls.append((u, c)), real(u, c))  # type: ignore[method-assign]
    reg = Registry(src)
    for _ in range(100):
        reg.register("u1", "acme")
        reg.register(None, None)
    assert calls == [("u1", "acme")]
    reg.forget(user_id="u1")
    reg.register("u1", "acme")
    assert len(calls) == 2
    src.close()


def test_deletion_records_only_for_registered_rows(tmp_path):
    src = _sources(tmp_path)
    src.register_people("u1", "acme")
    assert src.delete_user("u1") == 1 and src.delete_user("u1") == 0
    assert src.delete_company("acme") == 1 and src.delete_company("never") == 0
    src.add_conversation("c1", "a1")
    src.delete_conversation("c1")
    assert {(r["kind"], r["id"]) for r in src.deletions()} == {
        ("user", "u1"), ("company", "acme"), ("conversation", "c1")
    }
    assert set(src.deleted_ids("user", ["U1", "u2"])) == {"u1"}
    src.close()


def test_threads_registering_one_id_at_once_do_not_fail(tmp_path):
    src = _sources(tmp_path)
    errors = []

    def work():
        try:
            for i in range(20):
                src.register_people(f"u{i}", f"c{i % 3}")
        except Exception as e:  # pragma: no cover - the failure being tested
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(_rows(src)[0]) == 20
    src.close()


CHILD = """
import sys
from memory_pipelines.sources import Sources
from memory_pipelines.clock import FakeClock
src = Sources(sys.argv[1], FakeClock())
for i in range(40):
    src.register_people(f"u{i}", "acme")
src.close()
print("ok")
"""


def test_two_processes_registering_the_same_ids_do_not_fail(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    Sources(url, FakeClock()).close()  # the schema exists before the race
    outs = run_scripts_at_once(CHILD, [[url], [url]], timeout=120)
    assert [o.strip() for o in outs] == ["ok", "ok"]
    src = Sources(url, FakeClock())
    assert len(_rows(src)[0]) == 40 and _rows(src)[1] == ["acme"]
    src.close()


@pytest.mark.skipif(not PG_URL, reason="MEMORY_TEST_POSTGRES_URL is not set")
def test_registration_and_deletion_records_on_postgres():
    engine = create_engine(PG_URL)
    metadata.drop_all(engine)
    try:
        run_scripts_at_once(CHILD, [[PG_URL], [PG_URL]], timeout=120)
        src = Sources(PG_URL, FakeClock())
        src.register_people("u1", "acme")
        assert src.delete_user("u1") == 1
        assert set(src.deleted_ids("user", ["u1"])) == {"u1"}
        assert len(_rows(src)[0]) == 39
        src.close()
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def test_purging_a_user_removes_its_deletion_records(svc):
    svc.add_user("u-gone")
    svc.delete_user("u-gone")
    svc.add_user("u-other")
    svc.delete_user("u-other")
    svc.purge_user("u-gone")
    assert [(r["kind"], r["id"]) for r in svc.sources.deletions()] == [("user", "u-other")]
