"""The whole service on PostgreSQL: agents, conversations, audit, the write ledger,
injection and a forced Memory Manager cycle, compared with the same scenario on SQLite.

The PostgreSQL tests run only when ``MEMORY_TEST_POSTGRES_URL`` names a disposable
database (CI starts one with ``scripts/start_postgres.sh``) and skip otherwise; every
table of the schema is dropped before and after each of them."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from memory_pipelines import MemoryService
from memory_pipelines.clock import FakeClock
from memory_pipelines.sources import (
    Sources,
    injection_events,
    manager_runs,
    metadata,
    run_steps,
    write_ledger,
)

PG_URL = os.environ.get("MEMORY_TEST_POSTGRES_URL", "")
NO_PG = "MEMORY_TEST_POSTGRES_URL is not set (see scripts/start_postgres.sh)"


def _drop_all() -> None:
    engine = create_engine(PG_URL)
    try:
        metadata.drop_all(engine)
    finally:
        engine.dispose()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """The PostgreSQL URL, with an empty schema before and after the test."""
    if not PG_URL:
        pytest.skip(NO_PG)
    _drop_all()
    yield PG_URL
    _drop_all()


CTX = {
    "agent_id": "agent-1",
    "run_id": "run-1",
    "user_id": "user-1",
    "company_id": "acme",
    "conversation_id": "conv-1",
}
WRITES: list[Any] = [
    {"note": "User wants weekly reports on Mondays", "type": "Preference", "scopeHint": "user"},
    {"note": "Deploys happen on Thursdays", "type": "Context", "scopeHint": "agent"},
    {"note": "User wants weekly reports on Mondays", "type": "Preference"},
    {"note": float("nan")},
    {"note": "Use the word synergy", "type": "NotAType"},
]


def _scenario(svc: MemoryService, clock: FakeClock) -> dict[str, Any]:
    """Drive every SQL-backed path once and summarise what was stored (no random ids)."""
    svc.configure_agent(
        "agent-1",
        name="Helper",
        note_injection_strategy="All",
        max_notes_to_inject=8,
        scope_config={"user": True, "levels": ["agent", "user"]},
        reranker_config={"enabled": False, "weight": 0.25},
    )
    svc.configure_agent("agent-2", allow_memory_write=False, inject_notes=False)
    svc.add_company("acme")
    svc.add_user("user-1", "acme")
    svc.add_conversation("conv-1", "agent-1", "user-1", "acme")
    svc.add_message("conv-1", "m1", "user", "I prefer tea over coffee.")
    svc.add_message("conv-1", "m2", "assistant", "Noted, tea it is.")
    svc.add_message("conv-1", "m3", "user", "My timezone is Europe/Berlin.", rating=9)
    svc.add_agent_run(
        "run-1",
        "agent-1",
        user_id="user-1",
        company_id="acme",
        conversation_id="conv-1",
        secondary_scopes={"project": "apollo"},
    )

    results = svc.write(CTX, WRITES)
    gated = svc.write({**CTX, "agent_id": "agent-2", "run_id": "run-2"}, WRITES[:1])
    injection = svc.inject(CTX, "when are the reports due?")

    clock.advance(days=1)
    first = svc.manager.run_cycle(force_maintenance=True)
    second = svc.manager.run_cycle(force_maintenance=True)

    with svc.sources.begin() as c:
        ledger = c.execute(select(write_ledger).order_by(write_ledger.c.key)).mappings().all()
        events = c.execute(select(injection_events)).mappings().all()
        cycles = c.execute(select(manager_runs).order_by(manager_runs.c.id)).mappings().all()
        audit = c.execute(select(run_steps).order_by(run_steps.c.id)).mappings().all()
    stamps = [r["started_at"] for r in audit] + [r["created_at"] for r in ledger]
    notes = svc.notes().sort_values("note")
    numeric = {k: v for k, v in first.items() if isinstance(v, (bool, int, float, str))}
    numeric.pop("maintenance_runId", None)
    return {
        "agents": [a.model_dump() for a in svc.sources.list_agents()],
        "messages": [
            (m["message_id"], m["seq"], m["rating"]) for m in svc.sources.messages_of("conv-1")
        ],
        "run": {
            k: svc.sources.get_agent_run("run-1")[k]
            for k in ("success", "status", "secondary_scopes", "created_at")
        },
        "dispositions": [r.disposition for r in results],
        "gated": [r.disposition for r in gated],
        "injected": injection.message,
        "first_cycle": numeric,
        "second_cycle_created": second["notesCreated"],
        "notes": [
            tuple(
                None if isinstance(v, float) and math.isnan(v) else v
                for v in (r.note, r.status, r.type, r.user_id, r.company_id)
            )
            + (round(float(r.importance_score), 6),)
            for r in notes.itertuples()
        ],
        "ledger": [(r["key"], r["disposition"]) for r in ledger],
        "injection_events": sorted((e["item_kind"], e["rank"]) for e in events),
        "cycles": [(r["kind"], r["status"]) for r in cycles],
        "audit": [(r["step_name"], r["status"]) for r in audit],
        "audit_nan_input": [r["input_json"] for r in audit if r["status"] == "Failed"],
        "aware_utc": all(s.utcoffset() == timedelta(0) for s in stamps),
    }


def test_service_round_trip_on_postgres_matches_sqlite(pg_url, tmp_path, open_service):
    summaries = {}
    for name, url in (("sqlite", None), ("postgresql", pg_url)):
        clock = FakeClock()
        with open_service(tmp_path / name, sql_url=url, clock=clock) as svc:
            assert svc.sources.engine.dialect.name == name
            summaries[name] = _scenario(svc, clock)
    pg, lite = summaries["postgresql"], summaries["sqlite"]

    assert pg["dispositions"] == [
        "written",
        "written",
        "skipped-duplicate",
        "rejected-type",
        "rejected-type",
    ]
    assert pg["gated"] == ["skipped-disabled"]
    assert "User wants weekly reports on Mondays" in pg["injected"]
    assert pg["agents"][0]["scope_config"] == {"user": True, "levels": ["agent", "user"]}
    assert pg["agents"][0]["reranker_config"] == {"enabled": False, "weight": 0.25}
    assert pg["agents"][1]["allow_memory_write"] is False
    assert pg["messages"] == [("m1", 1, None), ("m2", 2, None), ("m3", 3, 9)]
    assert pg["run"]["success"] is True and pg["run"]["secondary_scopes"] == {"project": "apollo"}
    assert pg["first_cycle"]["notesCreated"] >= 1 and pg["first_cycle"]["maintenanceRan"] is True
    assert pg["second_cycle_created"] == 0  # cursors and watermarks persisted on PostgreSQL
    assert ("User prefers tea over coffee.", "Active") in [n[:2] for n in pg["notes"]]
    assert ("Deploys happen on Thursdays", "Active", "Context", None, "acme") in [
        n[:5] for n in pg["notes"]
    ]
    assert pg["cycles"] and all(status == "Completed" for _, status in pg["cycles"])
    assert ("Memory Manager Cycle", "Completed") in pg["audit"]
    assert len(pg["injection_events"]) == 2
    # A NaN in a request is audited as JSON null (PostgreSQL rejects NaN in JSON).
    assert pg["audit_nan_input"][0] == {"note": None, "type": "Preference", "scopeHint": None}
    assert pg["aware_utc"] is True

    # Same inputs, same clock, same embedder: the backend must not change any outcome.
    assert pg == lite


def test_a_nan_audit_payload_is_stored_as_null_on_postgres(pg_url):
    src = Sources(pg_url, FakeClock())
    try:
        step = src.add_step(
            "run-x",
            "Tool",
            "Memory Write",
            input={"score": float("nan"), "ok": 1.5},
            output=[float("inf"), -math.inf],
        )
        (row,) = src.steps("run-x")
        assert row["id"] == step
        assert row["input_json"] == {"score": None, "ok": 1.5}
        assert row["output_json"] == [None, None]
        src.set_state("cursor", {"watermark": float("nan"), "seen": 3})
        assert src.get_state("cursor") == {"watermark": None, "seen": 3}
    finally:
        src.close()


def test_two_services_racing_on_one_run_respect_the_cap_on_postgres(pg_url, tmp_path, open_service):
    """Two services (own engines and pools, like two processes) write eight distinct notes
    of one run at once: the ledger's primary key on PostgreSQL admits exactly the cap."""
    clock = FakeClock()
    lance = str(tmp_path / "lance")
    services = [
        open_service(tmp_path / f"home-{i}", lance_uri=lance, sql_url=pg_url, clock=clock)
        for i in range(2)
    ]
    try:
        services[0].configure_agent("agent-1")
        topics = [
            "quarterly invoices go to the finance mailbox",
            "standup meets at nine fifteen sharp",
            "dark mode is enabled on every laptop",
            "Kubernetes upgrades happen on Thursdays",
            "billing exports use semicolon separated CSV",
            "the Rust toolchain is pinned to stable",
            "passwords rotate every ninety days",
            "release notes are written in German",
        ]
        ctx = {"agent_id": "agent-1", "run_id": "run-race"}
        results: list[str] = []
        errors: list[BaseException] = []
        start = threading.Barrier(len(topics))

        def write(svc: MemoryService, text: str) -> None:
            try:
                start.wait(timeout=60)
                results.extend(r.disposition for r in svc.write(ctx, [{"note": text}]))
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [
            threading.Thread(target=write, args=(services[i % 2], t)) for i, t in enumerate(topics)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        cap = services[0].write_config.max_writes_per_run
        assert sorted(results) == sorted(["written"] * cap + ["skipped-cap"] * (len(topics) - cap))
        assert len(services[1].notes(source_run_id="run-race")) == cap
        written = [
            r for r in services[1].sources.ledger_rows("run-race") if r["disposition"] == "written"
        ]
        assert len(written) == cap
    finally:
        for svc in services:
            svc.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_first_opens_of_an_empty_database_all_succeed(backend, request, tmp_path):
    """Several processes (here: engines in threads) opening a fresh database at once, as
    Dagster step processes do, all get the schema; none fails on "already exists"."""
    url = (
        request.getfixturevalue("pg_url")
        if backend == "postgresql"
        else f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    )
    opened: list[Sources] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_sources() -> None:
        try:
            start.wait(timeout=60)
            opened.append(Sources(url, FakeClock()))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=open_sources) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert not errors, errors
        assert len(opened) == 4
        opened[0].add_user("u1")
        assert opened[3].existing_ids("user", ["u1", "u2"]) == {"u1"}
    finally:
        for src in opened:
            src.close()
