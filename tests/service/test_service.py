"""MemoryService as a library: opening and closing a home, the public names, the clock,
agent configuration, manual notes and examples, status changes and the embedding cache."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from factories import CountingEmbedder

import memory_pipelines
from memory_pipelines import errors as errors_module
from memory_pipelines.clock import FakeClock
from memory_pipelines.embeddings import CachedEmbedder, HashEmbedder
from memory_pipelines.errors import (
    ConfigError,
    MemoryPipelineError,
    NotFoundError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.notes import Note, append_comment
from memory_pipelines.service import MemoryService

# --------------------------------------------------------------------------- names


CONTRACT_NAMES = [
    "MemoryService",
    "RunContext",
    "MemoryWrite",
    "WriteResult",
    "WriteConfig",
    "Injection",
    "Note",
    "Example",
    "MemoryPipelineError",
    "UnknownAgentError",
]


@pytest.mark.parametrize("name", CONTRACT_NAMES)
def test_contract_names_are_importable_from_the_package(name):
    assert getattr(memory_pipelines, name) is not None
    assert name in memory_pipelines.__all__


def test_every_exported_name_resolves():
    for name in memory_pipelines.__all__:
        assert hasattr(memory_pipelines, name), name


def test_every_project_error_derives_from_memory_pipeline_error():
    classes = [
        obj
        for _, obj in inspect.getmembers(errors_module, inspect.isclass)
        if obj.__module__ == errors_module.__name__
    ]
    assert len(classes) >= 8
    for cls in classes:
        assert issubclass(cls, MemoryPipelineError), cls
        assert cls.__name__ != "MemoryError"
    assert issubclass(UnknownAgentError, LookupError)
    assert issubclass(ValidationError, ValueError)
    assert issubclass(ConfigError, ValueError)


# --------------------------------------------------------------------------- open and close


def test_open_creates_the_home_and_is_a_context_manager(tmp_path, clock):
    home = tmp_path / "a" / "b"
    with MemoryService.open(home, embedder=HashEmbedder(dim=16), clock=clock) as svc:
        assert isinstance(svc, MemoryService)
        assert svc.home == home and home.is_dir()
        assert (home / "lance").is_dir()
        assert (home / "memory.sqlite3").is_file()
        assert svc.embedder.dim == 16 and svc.embedder.model_id == "hash-16"
        assert isinstance(svc.embedder, CachedEmbedder)
        svc.configure_agent("a1")
    svc.close()  # closing twice is harmless
    with MemoryService.open(home, embedder=HashEmbedder(dim=16), clock=clock) as again:
        assert again.get_agent("a1").agent_id == "a1"


def test_home_defaults_to_memory_home_then_dot_memory(tmp_path, monkeypatch, clock):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMORY_HOME", str(tmp_path / "from-env"))
    with MemoryService.open(embedder=HashEmbedder(dim=8), clock=clock) as svc:
        assert svc.home == tmp_path / "from-env"
    assert (tmp_path / "from-env" / "memory.sqlite3").is_file()
    monkeypatch.delenv("MEMORY_HOME")
    with MemoryService.open(embedder=HashEmbedder(dim=8), clock=clock) as svc:
        assert svc.home == Path(".memory")
    assert (tmp_path / ".memory" / "lance").is_dir()


def test_lance_uri_and_sql_url_overrides(tmp_path, clock):
    sql_file = tmp_path / "elsewhere.sqlite3"
    with MemoryService.open(
        tmp_path / "home",
        lance_uri="memory://",
        sql_url=f"sqlite:///{sql_file}",
        embedder=HashEmbedder(dim=8),
        clock=clock,
    ) as svc:
        svc.add_user("u1")
        svc.add_note("in memory only", user_id="u1")
        assert len(svc.notes()) == 1
    assert sql_file.is_file()
    assert not (tmp_path / "home" / "lance").exists()
    assert not (tmp_path / "home" / "memory.sqlite3").exists()


def test_from_env_reads_urls_and_explicit_arguments_win(tmp_path, monkeypatch, clock):
    monkeypatch.setenv("MEMORY_LANCE_URI", str(tmp_path / "env-lance"))
    monkeypatch.setenv("MEMORY_SQL_URL", f"sqlite:///{tmp_path / 'env.sqlite3'}")
    monkeypatch.setenv("MEMORY_LLM_MODEL", "openai/gpt-4o-mini")
    with MemoryService.from_env(tmp_path / "h", embedder=HashEmbedder(dim=8), clock=clock) as svc:
        assert svc.store.uri == str(tmp_path / "env-lance")
        assert svc.llm == "openai/gpt-4o-mini"
    assert (tmp_path / "env.sqlite3").is_file()
    with MemoryService.from_env(
        tmp_path / "h", lance_uri="memory://", llm=None, embedder=HashEmbedder(dim=8), clock=clock
    ) as svc:
        assert svc.store.uri == "memory://" and svc.llm is None


def test_embedder_without_the_protocol_is_a_config_error(tmp_path, clock):
    class NoDim:
        model_id = "x"

        def embed(self, texts):
            return np.zeros((len(texts), 4), dtype=np.float32)

    with pytest.raises(ConfigError, match="dim"):
        MemoryService.open(tmp_path / "h", embedder=NoDim(), clock=clock)


# --------------------------------------------------------------------------- clock


def test_naive_clock_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="timezone-aware"):
        MemoryService.open(
            tmp_path / "h", embedder=HashEmbedder(dim=8), clock=lambda: datetime(2026, 1, 1)
        )


def test_clock_turning_naive_later_is_rejected(tmp_path):
    values = iter([datetime(2026, 1, 1, tzinfo=UTC)] + [datetime(2026, 1, 2)] * 10)
    with MemoryService.open(
        tmp_path / "h", embedder=HashEmbedder(dim=8), clock=lambda: next(values)
    ) as svc:
        with pytest.raises(ConfigError, match="naive"):
            svc.now()


def test_now_is_the_clock_in_utc(tmp_path):
    plus2 = timezone(timedelta(hours=2))
    with MemoryService.open(
        tmp_path / "h",
        embedder=HashEmbedder(dim=8),
        clock=lambda: datetime(2026, 1, 1, 14, tzinfo=plus2),
    ) as svc:
        now = svc.now()
        assert now == datetime(2026, 1, 1, 12, tzinfo=UTC) and now.tzinfo is UTC
        assert svc.clock() == now


def test_default_clock_is_aware_utc(tmp_path):
    with MemoryService.open(tmp_path / "h", embedder=HashEmbedder(dim=8)) as svc:
        now = svc.now()
        assert now.utcoffset() == timedelta(0)
        assert abs((datetime.now(UTC) - now).total_seconds()) < 60


# --------------------------------------------------------------------------- agents


def test_configure_agent_defaults_and_updates(svc):
    cfg = svc.configure_agent("a1")
    assert cfg.max_notes_to_inject == 5 and cfg.note_injection_strategy == "Relevant"
    assert cfg.inject_notes and not cfg.inject_examples and cfg.allow_memory_write
    svc.configure_agent("a1", max_notes_to_inject=8, scope_config={"dimensions": [{"name": "region"}]})
    cfg = svc.configure_agent("a1", name="Bot")  # earlier fields are kept
    assert cfg.max_notes_to_inject == 8 and cfg.scope_config == {"dimensions": [{"name": "region"}]}
    assert svc.get_agent("a1").name == "Bot"


def test_configure_agent_unknown_field_names_the_field(svc):
    with pytest.raises(ValidationError, match="max_notes"):
        svc.configure_agent("a1", max_notes=3)
    with pytest.raises(UnknownAgentError):
        svc.get_agent("a1")  # nothing was saved


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("note_injection_strategy", "Semantic"),
        ("example_injection_strategy", "Relevant"),
        ("max_notes_to_inject", -1),
        ("max_examples_to_inject", "many"),
        ("inject_notes", "perhaps"),
        ("scope_config", "not a dict"),
    ],
)
def test_configure_agent_rejects_bad_values_naming_the_field(svc, field, value):
    with pytest.raises(ValidationError, match=field):
        svc.configure_agent("a1", **{field: value})


@pytest.mark.parametrize("agent_id", ["", "   ", None, 5])
def test_configure_agent_needs_an_agent_id(svc, agent_id):
    with pytest.raises(ValidationError, match="agent_id"):
        svc.configure_agent(agent_id)


def test_unknown_agent_and_deactivation(svc):
    with pytest.raises(UnknownAgentError, match="ghost"):
        svc.get_agent("ghost")
    with pytest.raises(UnknownAgentError):
        svc.deactivate_agent("ghost")
    svc.configure_agent("a1")
    svc.deactivate_agent("a1")
    assert svc.get_agent("a1").status == "Inactive" and not svc.get_agent("a1").active


# --------------------------------------------------------------------------- notes


def test_add_note_stamps_from_the_clock_and_keeps_given_fields(svc, clock):
    note = svc.add_note("  The user prefers tea.  ", agent_id="a1", user_id="u1")
    assert note.note == "The user prefers tea."
    assert note.type == "Preference" and note.status == "Active"
    assert note.author_type == "User" and note.protection_tier == "Standard"
    assert note.created_at == clock() == note.updated_at
    assert note.embedding_model_id == svc.embedder.model_id
    assert svc.get_note(note.id) == note
    old = datetime(2026, 1, 1, tzinfo=UTC)
    kept = svc.add_note(
        "Old context", type="Context", status="Pending", created_at=old, importance_score=0.7,
        expires_at=old + timedelta(days=3), secondary_scopes={"region": "emea"},
    )  # fmt: skip
    back = svc.get_note(kept.id)
    assert back.created_at == old and back.updated_at == clock()
    assert back.importance_score == 0.7 and back.secondary_scopes == {"region": "emea"}
    assert back.status == "Pending" and back.type == "Context"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"note": ""},
        {"note": "   "},
        {"note": "x", "type": "Opinion"},
        {"note": "x", "status": "Deleted"},
        {"note": "x", "no_such_field": 1},
        {"note": "x", "created_at": datetime(2026, 1, 1)},
    ],
)
def test_add_note_rejects_invalid_input(svc, kwargs):
    with pytest.raises(ValidationError):
        svc.add_note(**kwargs)
    assert len(svc.notes()) == 0


def test_notes_dataframe_filters(svc):
    svc.add_note("a1 u1 active", agent_id="a1", user_id="u1")
    svc.add_note("a1 agent-wide", agent_id="a1")
    svc.add_note("a2 archived", agent_id="a2", status="Archived", type="Context")
    svc.add_note("it's quoted", agent_id="o'brien")
    df = svc.notes()
    assert isinstance(df, pd.DataFrame) and len(df) == 4
    assert set(Note.model_fields) <= set(df.columns) and "vector" not in df.columns
    assert sorted(svc.notes(agent_id="a1")["note"]) == ["a1 agent-wide", "a1 u1 active"]
    assert list(svc.notes(agent_id="a1", user_id=None)["note"]) == ["a1 agent-wide"]
    assert list(svc.notes(status="Archived")["note"]) == ["a2 archived"]
    assert len(svc.notes(status=["Active", "Provisional"])) == 3
    assert len(svc.notes(agent_id=("a2", "o'brien"))) == 2
    assert list(svc.notes(agent_id="o'brien")["note"]) == ["it's quoted"]
    assert len(svc.notes(agent_id="' OR 1=1 --")) == 0
    assert len(svc.notes(agent_id=[])) == 0
    with pytest.raises(ValidationError, match="colour"):
        svc.notes(colour="red")


def test_add_example_and_examples_dataframe(svc):
    ex = svc.add_example(
        "a1", "How do I reset?", "Settings > Reset", success_score=90, user_id="u1"
    )
    assert ex.created_at == svc.now() and svc.get_example(ex.id) == ex
    svc.add_example("a2", "Other", "Out")
    assert list(svc.examples(agent_id="a1")["id"]) == [ex.id]
    assert len(svc.examples()) == 2
    for bad in ({"success_score": 101}, {"success_score": -1}):
        with pytest.raises(ValidationError, match="success_score"):
            svc.add_example("a1", "in", "out", **bad)
    with pytest.raises(ValidationError, match="example_output"):
        svc.add_example("a1", "in", "  ")
    with pytest.raises(ValidationError):
        svc.add_example("a1", "in", "out", status="Provisional")  # examples are never provisional


def test_set_note_status_appends_comments(svc, clock):
    note = svc.add_note("The user likes tea", comments="[created by test]")
    clock.advance(days=1)
    svc.set_note_status(note.id, "Archived", "[archived: stale]")
    clock.advance(days=1)
    updated = svc.set_note_status(note.id, "Active", "[restored]")
    back = svc.get_note(note.id)
    assert back == updated
    assert back.status == "Active"
    assert back.comments == "[created by test] [archived: stale] [restored]"
    assert back.created_at == note.created_at and back.updated_at == clock()
    svc.set_note_status(note.id, "Revoked")  # no comment: comments unchanged
    assert svc.get_note(note.id).comments == "[created by test] [archived: stale] [restored]"
    assert len(svc.notes()) == 1


def test_set_note_status_errors(svc):
    note = svc.add_note("x")
    with pytest.raises(ValidationError, match="Deleted"):
        svc.set_note_status(note.id, "Deleted")
    with pytest.raises(NotFoundError, match="missing"):
        svc.set_note_status("missing", "Archived")
    assert issubclass(NotFoundError, MemoryPipelineError)


def test_append_comment_never_replaces():
    assert append_comment(None, " [a] ") == "[a]"
    assert append_comment("", "[a]") == "[a]"
    assert append_comment("[a]  ", "[b]") == "[a] [b]"


def test_update_notes_validates_changes(svc):
    note = svc.add_note("x")
    with pytest.raises(ValidationError, match="status"):
        svc.update_notes([(note, {"status": "Bogus"})])
    with pytest.raises(ValidationError, match="colour"):
        svc.update_notes([(note, {"colour": "red"})])
    with pytest.raises(ValidationError):
        svc.update_notes([(note, {"expires_at": datetime(2026, 1, 1)})])
    assert svc.get_note(note.id).status == "Active"
    (saved,) = svc.update_notes([(note, {"importance_score": 0.5, "access_count": 3})])
    assert svc.get_note(note.id).importance_score == 0.5 and saved.access_count == 3


# --------------------------------------------------------------------------- embeddings


def test_unchanged_note_text_is_embedded_once(tmp_path):
    counting = CountingEmbedder(dim=32)
    clock = FakeClock()
    with MemoryService.open(tmp_path / "h", embedder=counting, clock=clock) as svc:
        note = svc.add_note("The user prefers tea over coffee")
        svc.set_note_status(note.id, "Archived", "[a]")
        svc.set_note_status(note.id, "Active", "[b]")
        svc.update_notes([(svc.get_note(note.id), {"importance_score": 0.9})])
        assert counting.seen == ["The user prefers tea over coffee"]
        svc.update_notes([(svc.get_note(note.id), {"note": "The user prefers green tea"})])
        assert counting.seen[-1] == "The user prefers green tea" and len(counting.seen) == 2
        vec = svc.embed(["The user prefers tea over coffee"])
        assert len(counting.seen) == 2
        assert vec.shape == (1, 32) and vec.dtype == np.float32
        assert np.isclose(np.linalg.norm(vec[0]), 1.0, atol=1e-5)
    # The cache is a file in the home: a new service on the same home does not re-embed.
    with MemoryService.open(tmp_path / "h", embedder=counting, clock=clock) as svc:
        svc.add_note("The user prefers tea over coffee", agent_id="again")
        assert len(counting.seen) == 2
