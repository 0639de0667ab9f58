"""``memory-pipelines demo`` end to end on a temporary home: seeds once, runs the jobs
through Dagster on a persistent instance, prints the summary; a second run reuses the
store. The fast smoke uses the hashing embedder; the slow test checks the outcomes with
the real one."""

from __future__ import annotations

import dagster as dg
import pytest

from memory_pipelines import MemoryService
from memory_pipelines.apps.cli import demo_command as main
from memory_pipelines.apps.demo import DAGSTER_DIR, SEEDED_KEY


def _runs(home):
    with dg.DagsterInstance.from_config(str(home / DAGSTER_DIR)) as instance:
        runs = instance.get_runs()
        config = instance.get_concurrency_config()
    return runs, config


def test_demo_smoke_seeds_once_and_records_dagster_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    monkeypatch.delenv("MEMORY_LLM_MODEL", raising=False)
    home = tmp_path / "demo"

    assert main(["--home", str(home)]) == 0
    first = capsys.readouterr().out
    assert first.startswith("Seeded: 3 agents, 2 companies, 4 users, 6 conversations")
    for section in (
        "## Dagster runs",
        "## What each phase did",
        "## Asset checks",
        "## Notes",
        "## Injected for alice",
    ):
        assert section in first
    assert "memory_manager_cycle" in first and "extracted_notes" in first

    runs, config = _runs(home)
    assert {r.job_name for r in runs} >= {"memory_manager_cycle"}
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    assert config.pool_config.default_pool_limit == 1
    with MemoryService.open(home) as svc:
        seeded_at = svc.sources.get_state(SEEDED_KEY)
        agents = len(svc.sources.list_agents())
        notes = len(svc.notes())

    assert main(["--home", str(home)]) == 0
    second = capsys.readouterr().out
    assert second.startswith("Reusing the demo store seeded at")
    again, _ = _runs(home)
    assert len(again) == len(runs) + 1 and again[0].job_name == "memory_manager_cycle"
    with MemoryService.open(home) as svc:
        assert svc.sources.get_state(SEEDED_KEY) == seeded_at
        assert len(svc.sources.list_agents()) == agents and len(svc.notes()) == notes


@pytest.mark.slow
def test_demo_with_the_real_embedder(tmp_path, monkeypatch, capsys, minilm):
    monkeypatch.delenv("MEMORY_EMBEDDING_MODEL", raising=False)
    monkeypatch.delenv("MEMORY_LLM_MODEL", raising=False)
    home = tmp_path / "demo"
    assert main(["--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert "memory_maintenance" in out and "📝" in out
    with MemoryService.open(home) as svc:
        notes = svc.notes()
    by_text = notes.set_index("note")
    assert by_text.loc["Alice prefers dark mode in all her dashboards", "status"] == "Archived"
    assert by_text.loc["Team uses Python 3.10 for every service.", "status"] == "Revoked"
    extracted = notes[notes["author_type"] == "MemoryManager"]
    assert len(extracted) >= 8 and set(extracted["agent_id"]) == {
        "code-helper",
        "support-desk",
        "travel-planner",
    }
    assert not notes["note"].str.contains("taxi", case=False).any()  # one-off request
    assert (notes["type"] == "Issue").sum() == 1  # the failed run's lesson
