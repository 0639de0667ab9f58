"""The SQL sources (SQLAlchemy): agents, users, companies, conversations, messages, runs,
the append-only audit table and manager state, on SQLite and, when
``MEMORY_TEST_POSTGRES_URL`` names a disposable database, on PostgreSQL too."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import func, insert, select

from memory_pipelines import MemoryService
from memory_pipelines.clock import FakeClock
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import MemoryPipelineError, NotFoundError, ValidationError
from memory_pipelines.notes import AgentConfig
from memory_pipelines.sources import Sources, metadata, run_steps, users

_BACKENDS = ["sqlite"]
if os.environ.get("MEMORY_TEST_POSTGRES_URL"):
    _BACKENDS.append("postgresql")


@pytest.fixture(params=_BACKENDS)
def sql_url(request, tmp_path):
    """A fresh, empty source database URL for each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sources.sqlite3'}"
        return
    from sqlalchemy import create_engine

    url = os.environ["MEMORY_TEST_POSTGRES_URL"]
    engine = create_engine(url)
    metadata.drop_all(engine)
    engine.dispose()
    yield url
    engine = create_engine(url)
    metadata.drop_all(engine)
    engine.dispose()


@pytest.fixture
def src(sql_url, clock):
    s = Sources(sql_url, clock)
    yield s
    s.close()


def _aware_utc(value: datetime) -> bool:
    return value.tzinfo is not None and value.utcoffset() == timedelta(0)


# --------------------------------------------------------------------------- agents


def test_agent_defaults_match_the_contract(src):
    src.upsert_agent(AgentConfig(agent_id="a1"))
    got = src.get_agent("a1")
    assert got.model_dump() == {
        "agent_id": "a1",
        "name": None,
        "status": "Active",
        "inject_notes": True,
        "max_notes_to_inject": 5,
        "note_injection_strategy": "Relevant",
        "inject_examples": False,
        "max_examples_to_inject": 3,
        "example_injection_strategy": "Semantic",
        "allow_memory_write": True,
        "auto_archive_enabled": True,
        "scope_config": None,
        "reranker_config": None,
        "note_retention_days": 90,
        "example_retention_days": 180,
    }
    assert got.active


def test_agent_config_round_trips_every_field(src):
    config = AgentConfig(
        agent_id="a2",
        name="Support bot",
        status="Inactive",
        inject_notes=False,
        max_notes_to_inject=9,
        note_injection_strategy="All",
        inject_examples=True,
        max_examples_to_inject=1,
        example_injection_strategy="Rated",
        allow_memory_write=False,
        auto_archive_enabled=False,
        scope_config={"dimensions": ["region"], "strict": True},
        reranker_config={"type": "llm", "top_k": 4},
        note_retention_days=None,
        example_retention_days=30,
    )
    src.upsert_agent(config)
    assert src.get_agent("a2") == config
    src.upsert_agent(config.model_copy(update={"name": "Renamed", "max_notes_to_inject": 2}))
    got = src.get_agent("a2")
    assert (
        got.name == "Renamed"
        and got.max_notes_to_inject == 2
        and got.reranker_config == {"type": "llm", "top_k": 4}
    )
    assert src.get_agent("nope") is None


def test_list_agents_status_and_existing_ids(src):
    for a in ("b", "a", "c"):
        src.upsert_agent(AgentConfig(agent_id=a))
    src.set_agent_status("b", "Inactive")
    assert [a.agent_id for a in src.list_agents()] == ["a", "b", "c"]
    assert [a.agent_id for a in src.list_agents(active_only=True)] == ["a", "c"]
    assert src.existing_ids("agent", ["a", "b", "zz", None, ""]) == {"a"}
    with pytest.raises(NotFoundError):
        src.set_agent_status("zz", "Inactive")


# --------------------------------------------------------------------------- users, companies


def test_users_and_companies(src, clock):
    src.add_company("co1", name="Acme")
    src.add_company("co1", name="ignored on repeat")
    src.add_user("u1", company_id="co1", name="Ann")
    src.add_user("u2")
    src.add_user("u1", company_id="co2")  # re-adding updates the company
    with src.begin() as c:
        rows = {r.user_id: r for r in c.execute(select(users))}
    assert rows["u1"].company_id == "co2" and rows["u2"].company_id is None
    assert _aware_utc(rows["u1"].created_at) and rows["u1"].created_at == clock()
    assert src.existing_ids("user", ["u1", "u2", "u3"]) == {"u1", "u2"}
    assert src.existing_ids("company", ["co1", "co2"]) == {"co1"}
    assert src.delete_user("u1") == 1 and src.delete_user("u1") == 0
    assert src.delete_company("co1") == 1
    assert src.existing_ids("user", ["u1", "u2"]) == {"u2"}
    assert src.existing_ids("company", ["co1"]) == set()


def test_existing_ids_handles_large_batches(src):
    for i in range(0, 1200, 3):
        src.add_user(f"u{i}")
    wanted = [f"u{i}" for i in range(1200)]
    assert src.existing_ids("user", wanted) == {f"u{i}" for i in range(0, 1200, 3)}


# --------------------------------------------------------------------------- conversations


def test_conversations_and_messages(src, clock):
    src.add_conversation("c1", "a1", user_id="u1", company_id="co1")
    conv = src.get_conversation("c1")
    assert conv["agent_id"] == "a1" and conv["user_id"] == "u1" and conv["company_id"] == "co1"
    assert _aware_utc(conv["created_at"]) and conv["last_activity_at"] == clock()
    clock.advance(minutes=5)
    src.add_message("c1", "m1", "user", "I like tea", rating=None)
    clock.advance(minutes=1)
    src.add_message("c1", "m2", "assistant", "Noted", rating=9, rating_comment="good")
    src.add_message("c1", "m1", "user", "I like green tea")  # edit keeps its position
    msgs = src.messages_of("c1")
    assert [(m["message_id"], m["seq"], m["text"]) for m in msgs] == [
        ("m1", 1, "I like green tea"),
        ("m2", 2, "Noted"),
    ]
    assert msgs[1]["rating"] == 9 and msgs[1]["rating_comment"] == "good"
    assert all(_aware_utc(m["created_at"]) for m in msgs)
    assert [m["message_id"] for m in src.messages_of("c1", after_seq=1)] == ["m2"]
    assert src.get_conversation("c1")["last_activity_at"] == clock()
    when = datetime(2026, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    src.add_message("c1", "m3", "user", "explicit time", created_at=when)
    m3 = src.messages_of("c1", after_seq=2)[0]
    assert m3["created_at"] == datetime(2026, 5, 1, 12, 0, tzinfo=UTC) and _aware_utc(
        m3["created_at"]
    )
    assert m3["seq"] == 3


@pytest.mark.parametrize("rating", [0, 11, -1, 5.5, "7", "x", True, [5]])
def test_rating_outside_1_to_10_is_rejected(src, rating):
    src.add_conversation("c1", "a1")
    with pytest.raises(ValidationError, match="rating"):
        src.add_message("c1", "m1", "user", "hi", rating=rating)
    assert src.messages_of("c1") == []


@pytest.mark.parametrize("rating", [1, 10, 7.0])
def test_rating_bounds_are_accepted(src, rating):
    src.add_conversation("c1", "a1")
    src.add_message("c1", "m1", "user", "hi", rating=rating)
    assert src.messages_of("c1")[0]["rating"] == int(rating)


def test_message_needs_an_existing_conversation(src):
    with pytest.raises(NotFoundError, match="nope"):
        src.add_message("nope", "m1", "user", "hi")


def test_delete_conversation_removes_its_messages(src):
    src.add_conversation("c1", "a1")
    src.add_conversation("c2", "a1")
    src.add_message("c1", "m1", "user", "x")
    src.add_message("c2", "m2", "user", "y")
    assert src.delete_conversation("c1") == 1
    assert src.get_conversation("c1") is None and src.messages_of("c1") == []
    assert [m["message_id"] for m in src.messages_of("c2")] == ["m2"]
    assert src.delete_conversation("c1") == 0


def test_conversations_with_activity_since_and_agents(src, clock):
    start = clock()
    src.add_conversation("c1", "a1")
    clock.advance(minutes=1)
    src.add_conversation("c2", "a2")
    clock.advance(minutes=1)
    src.add_conversation("c3", "a1")
    clock.advance(minutes=1)
    src.add_message("c1", "m1", "user", "bump")  # c1 is now the most recent
    assert [c["conversation_id"] for c in src.conversations_with_activity(None)] == [
        "c2",
        "c3",
        "c1",
    ]
    got = src.conversations_with_activity(start + timedelta(seconds=30))
    assert [c["conversation_id"] for c in got] == ["c2", "c3", "c1"]
    got = src.conversations_with_activity(start + timedelta(seconds=90), agent_ids=["a1"])
    assert [c["conversation_id"] for c in got] == ["c3", "c1"]
    assert src.conversations_with_activity(None, agent_ids=[]) == []
    assert len(src.conversations_with_activity(None, limit=2)) == 2


# --------------------------------------------------------------------------- runs


def test_agent_runs(src, clock):
    src.add_agent_run("r1", "a1", user_id="u1", status="Completed", success=True)
    clock.advance(hours=1)
    src.add_agent_run(
        "r2", "a1", success=False, error_message="boom", secondary_scopes={"region": "emea"},
        summary="failed", finished_at=clock() + timedelta(seconds=3),
    )  # fmt: skip
    r1 = src.get_agent_run("r1")
    assert r1["agent_id"] == "a1" and r1["user_id"] == "u1" and r1["success"] is True
    assert r1["artifact_count"] == 0 and r1["status"] == "Completed"
    assert _aware_utc(r1["created_at"])
    r2 = src.get_agent_run("r2")
    assert r2["success"] is False and r2["error_message"] == "boom"
    assert r2["secondary_scopes"] == {"region": "emea"} and _aware_utc(r2["finished_at"])
    assert [r["run_id"] for r in src.agent_runs_since(None)] == ["r1", "r2"]
    assert [r["run_id"] for r in src.agent_runs_since(r1["created_at"])] == ["r2"]
    src.add_agent_run("r1", "a1", status="Failed")  # re-adding updates
    assert src.get_agent_run("r1")["status"] == "Failed"
    assert src.get_agent_run("zz") is None
    with pytest.raises(ValidationError, match="bogus"):
        src.add_agent_run("r3", "a1", bogus=1)


def test_naive_datetimes_are_rejected_as_validation_errors(src):
    src.add_conversation("c1", "a1")
    with pytest.raises(ValidationError, match="timezone-aware"):
        src.add_message("c1", "m1", "user", "hi", created_at=datetime(2026, 1, 1))
    with pytest.raises(ValidationError, match="timezone-aware"):
        src.add_agent_run("r1", "a1", created_at=datetime(2026, 1, 1))
    assert src.messages_of("c1") == [] and src.get_agent_run("r1") is None


# --------------------------------------------------------------------------- audit


def test_audit_steps_are_appended_in_order(src, clock):
    ids = []
    for i, name in enumerate(["guard", "save", "guard"]):
        ids.append(
            src.add_step(
                "run-1", "memory_write", name, input={"i": i, "when": clock()}, output=[i],
                status="Completed", agent_id="a1", user_id="u1",
                started_at=clock() - timedelta(minutes=10 - i),  # out of time order on purpose
            )
        )  # fmt: skip
        clock.advance(seconds=1)
    src.add_step("run-2", "phase", "extract", status="Failed", error_message="boom")
    assert ids == sorted(ids) and len(set(ids)) == 3
    steps = src.steps("run-1")
    assert [s["id"] for s in steps] == ids
    assert [s["step_name"] for s in steps] == ["guard", "save", "guard"]
    assert steps[0]["input_json"] == {"i": 0, "when": "2026-06-01 12:00:00+00:00"}
    assert steps[2]["output_json"] == [2]
    assert all(_aware_utc(s["started_at"]) and _aware_utc(s["finished_at"]) for s in steps)
    assert [s["id"] for s in src.steps("run-1", step_name="guard")] == [ids[0], ids[2]]
    failed = src.steps("run-2")[0]
    assert failed["status"] == "Failed" and failed["error_message"] == "boom"
    assert failed["input_json"] is None
    assert len(src.steps()) == 4


def test_begin_is_one_transaction(src):
    with pytest.raises(RuntimeError):
        with src.begin() as c:
            c.execute(
                insert(users).values(user_id="u1", created_at=datetime(2026, 1, 1, tzinfo=UTC))
            )
            raise RuntimeError("abort")
    assert src.existing_ids("user", ["u1"]) == set()
    with src.begin() as c:
        c.execute(insert(users).values(user_id="u1", created_at=datetime(2026, 1, 1, tzinfo=UTC)))
        assert c.execute(select(func.count()).select_from(users)).scalar_one() == 1
    assert src.existing_ids("user", ["u1"]) == {"u1"}
    with src.begin() as c:
        assert c.execute(select(func.count()).select_from(run_steps)).scalar_one() == 0


# --------------------------------------------------------------------------- state


def test_state_get_set(src):
    assert src.get_state("cursor") is None
    assert src.get_state("cursor", default={"n": 0}) == {"n": 0}
    src.set_state("cursor", {"since": "2026-06-01T12:00:00+00:00", "ids": [1, 2]})
    assert src.get_state("cursor") == {"since": "2026-06-01T12:00:00+00:00", "ids": [1, 2]}
    src.set_state("cursor", 5)
    assert src.get_state("cursor") == 5
    src.set_state("when", datetime(2026, 6, 1, tzinfo=UTC))  # stored as plain JSON text
    assert src.get_state("when") == "2026-06-01 00:00:00+00:00"


# --------------------------------------------------------------------------- through the service


def test_service_source_methods_delegate(sql_url, tmp_path):
    clock = FakeClock()
    with MemoryService.open(
        tmp_path / "home", sql_url=sql_url, embedder=HashEmbedder(dim=16), clock=clock
    ) as svc:
        svc.configure_agent("a1", name="Bot")
        svc.add_company("co1")
        svc.add_user("u1", company_id="co1")
        svc.add_conversation("c1", "a1", user_id="u1", company_id="co1")
        svc.add_message("c1", "m1", "user", "hello", rating=8)
        svc.add_agent_run("r1", "a1", user_id="u1", conversation_id="c1", success=None)
        src = svc.sources
        assert src.get_agent("a1").name == "Bot"
        assert src.existing_ids("company", ["co1"]) == {"co1"}
        assert src.existing_ids("user", ["u1"]) == {"u1"}
        assert src.messages_of("c1")[0]["rating"] == 8
        run = src.get_agent_run("r1")
        assert run["conversation_id"] == "c1" and run["success"] is None
        assert run["created_at"] == clock()
        with pytest.raises(MemoryPipelineError):
            svc.add_message("c1", "m2", "user", "x", rating=42)
        svc.deactivate_agent("a1")
        assert src.existing_ids("agent", ["a1"]) == set()
        svc.delete_conversation("c1")
        svc.delete_user("u1")
        svc.delete_company("co1")
        assert src.get_conversation("c1") is None
        assert src.existing_ids("user", ["u1"]) == set()
