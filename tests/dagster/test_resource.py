"""MemoryApiResource inside real Dagster executions (an op job and an asset
materialization) and from plain Python outside Dagster."""

from __future__ import annotations

import dagster as dg
import pytest

from memory_pipelines import Injection, MemoryService, WriteResult
from memory_pipelines.embeddings import CachedEmbedder
from memory_pipelines.resources import MemoryApiResource, memory_api_from_env

AGENT = "agent-1"
WRITE_CTX = {"agent_id": AGENT, "run_id": "run-1", "user_id": "user-1"}
NOTE = "User prefers tea over coffee"


def _seed(home: str) -> None:
    """Configure the agent the way an operator would, before any agent runs."""
    with MemoryApiResource(home=home, embedding_model="hash").open() as svc:
        svc.configure_agent(AGENT, note_injection_strategy="Recent")


@dg.op
def agent_turn(memory: MemoryApiResource) -> dict:
    results = memory.write(WRITE_CTX, [{"note": NOTE, "type": "Preference", "scopeHint": "user"}])
    feedback = memory.format_write_feedback(results)
    injection = memory.inject(
        {"agent_id": AGENT, "run_id": "run-2", "user_id": "user-1"}, "drinks?"
    )
    svc = memory.get_service()
    assert memory.get_service() is svc  # one service for the whole execution
    return {
        "dispositions": [r.disposition for r in results],
        "feedback": feedback,
        "message": injection.message,
        "note_ids": [n.id for n in injection.notes],
        "embedder": svc.embedder.model_id,
        "instructions": memory.write_instructions(AGENT),
    }


@dg.job
def agent_job():
    agent_turn()


@dg.asset
def injected_message(memory: MemoryApiResource) -> dg.MaterializeResult:
    """The injection for user-1, written by the asset after a memory write."""
    memory.write({**WRITE_CTX, "run_id": "asset-run"}, [{"note": NOTE, "scopeHint": "user"}])
    injection = memory.inject({"agent_id": AGENT, "user_id": "user-1"})
    return dg.MaterializeResult(
        metadata={"message": injection.message, "notes": len(injection.notes)}
    )


def test_resource_in_an_op_job_writes_then_injects(tmp_path):
    home = str(tmp_path / "home")
    _seed(home)
    resource = MemoryApiResource(home=home, embedding_model="hash")
    result = agent_job.execute_in_process(resources={"memory": resource})
    assert result.success
    out = result.output_for_node("agent_turn")
    assert out["dispositions"] == ["written"]
    assert out["feedback"].startswith("Memory write result:")
    assert NOTE in out["message"] and len(out["note_ids"]) == 1
    assert out["embedder"] == "hash-64"
    assert "Durable Memory" in out["instructions"]
    assert resource._service is None  # Dagster opened (and closed) its own copy
    with resource.open() as svc:  # the write is durable in the home
        assert svc.get_note(out["note_ids"][0]).note == NOTE


def test_resource_in_an_asset_materialization(tmp_path):
    home = str(tmp_path / "home")
    _seed(home)
    result = dg.materialize(
        [injected_message],
        resources={"memory": MemoryApiResource(home=home, embedding_model="hash")},
    )
    assert result.success
    (mat,) = result.asset_materializations_for_node("injected_message")
    assert NOTE in mat.metadata["message"].value
    assert mat.metadata["notes"].value == 1


def test_resource_from_env_binds_memory_home_and_tolerates_unset_options(tmp_path, monkeypatch):
    home = tmp_path / "env-home"
    monkeypatch.setenv("MEMORY_HOME", str(home))
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    for name in ("MEMORY_LANCE_URI", "MEMORY_SQL_URL", "MEMORY_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    _seed(str(home))
    result = agent_job.execute_in_process(resources={"memory": memory_api_from_env()})
    assert result.success
    assert result.output_for_node("agent_turn")["dispositions"] == ["written"]
    assert (home / "lance").is_dir()


def test_resource_optional_urls_come_from_env_when_unset(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MEMORY_LANCE_URI", str(tmp_path / "elsewhere-lance"))
    monkeypatch.setenv("MEMORY_SQL_URL", f"sqlite:///{tmp_path / 'elsewhere.sqlite3'}")
    resource = MemoryApiResource(home=str(home), embedding_model="hash")
    with resource.open() as svc:
        assert svc.store.uri == str(tmp_path / "elsewhere-lance")
        svc.configure_agent(AGENT)
    assert (tmp_path / "elsewhere.sqlite3").is_file()
    explicit = MemoryApiResource(
        home=str(home), lance_uri="memory://", sql_url=f"sqlite:///{tmp_path / 'x.sqlite3'}",
        embedding_model="hash", llm_model="openai/gpt-4o-mini",
    )  # fmt: skip
    with explicit.open() as svc:
        assert svc.store.uri == "memory://" and svc.llm == "openai/gpt-4o-mini"
        assert (tmp_path / "x.sqlite3").is_file()


def test_memory_home_envvar_is_resolved_at_launch(monkeypatch):
    monkeypatch.delenv("MEMORY_HOME", raising=False)
    resource = memory_api_from_env()  # building the definitions needs no environment
    with pytest.raises(dg.DagsterInvalidConfigError, match="MEMORY_HOME"):
        agent_job.execute_in_process(resources={"memory": resource})


def test_resource_outside_dagster_with_open(tmp_path):
    resource = MemoryApiResource(home=str(tmp_path / "home"), embedding_model="hash")
    with resource.open() as svc:
        assert isinstance(svc, MemoryService)
        assert isinstance(svc.embedder, CachedEmbedder)
        svc.configure_agent(AGENT, note_injection_strategy="Recent")
        results = resource.write(WRITE_CTX, [{"note": NOTE, "scopeHint": "user"}])
        assert all(isinstance(r, WriteResult) for r in results)
        assert [r.disposition for r in results] == ["written"]
        injection = resource.inject({"agent_id": AGENT, "user_id": "user-1"}, "tea?")
        assert isinstance(injection, Injection) and NOTE in injection.message
        assert resource.get_service() is svc
    assert resource._service is None


def test_resource_outside_dagster_lazily_and_close(tmp_path):
    resource = MemoryApiResource(home=str(tmp_path / "home"), embedding_model="hash")
    svc = resource.get_service()
    svc.configure_agent(AGENT)
    assert resource.write(WRITE_CTX, [{"note": NOTE}])[0].disposition == "written"
    resource.close()
    resource.close()  # idempotent
    again = resource.get_service()
    assert again is not svc and len(again.notes(agent_id=AGENT)) == 1
    with resource.open() as inner:  # already open: open() leaves it open
        assert inner is again
    assert resource._service is again
    resource.close()


def test_resource_remembers_a_conversation(tmp_path):
    resource = MemoryApiResource(home=str(tmp_path / "home"), embedding_model="hash")
    with resource.open() as svc:
        svc.configure_agent(AGENT, note_injection_strategy="Recent")
        said = [{"role": "user", "content": "I prefer answers in metric units."}]
        (kept,) = resource.remember(WRITE_CTX, said)
        assert kept.note == "User prefers answers in metric units." and kept.status == "Provisional"
        assert resource.remember(WRITE_CTX, said) == []
        assert kept.note in resource.inject({"agent_id": AGENT, "user_id": "user-1"}).message


CLOSED: list[str] = []


class TrackingResource(MemoryApiResource):
    """Records when Dagster's teardown closes the service."""

    def close(self) -> None:
        if self._service is not None:
            CLOSED.append(self.home)
        super().close()


def test_dagster_teardown_closes_the_service(tmp_path):
    home = str(tmp_path / "home")
    _seed(home)
    CLOSED.clear()
    result = agent_job.execute_in_process(
        resources={"memory": TrackingResource(home=home, embedding_model="hash")}
    )
    assert result.success
    assert CLOSED == [home]
