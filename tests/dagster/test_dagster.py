"""The Dagster side: the one Definitions loads, the cycle assets materialize over a
temporary home with the real executor, checks hold (and block), the schedule targets the
cycle job."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from factories import ALICE_NOTE, seed_acme
from sqlalchemy import select

from memory_pipelines.assets import checks
from memory_pipelines.assets.common import CYCLE_GROUP, NOTE_TABLE_POOL
from memory_pipelines.assets.extraction import extracted_examples, extracted_notes
from memory_pipelines.assets.hardening import hardened_notes
from memory_pipelines.definitions import defs
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.sensors.cycle import memory_manager_cycle_schedule
from memory_pipelines.sources import manager_runs

ROOT = Path(__file__).resolve().parents[2]
CYCLE_ASSETS = [extracted_notes, extracted_examples, hardened_notes]
CYCLE_CHECKS = [
    checks.injectable_notes_have_vectors,
    checks.hardened_notes_have_no_expiry,
    checks.lineage_points_at_existing_notes,
]


@pytest.fixture
def seeded(clock, open_service):
    """A seeded home (hashing embedder: the resource opens it with ``embedding_model='hash'``)."""
    with open_service() as s:
        seed_acme(s)
        s.add_note("Alice deploys on Tuesdays", **ALICE_NOTE, expires_at=clock().replace(year=2027))
        yield s


def resource(home) -> MemoryApiResource:
    return MemoryApiResource(home=str(home), embedding_model="hash")


def test_definitions_load_and_validate():
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"extracted_notes", "extracted_examples", "hardened_notes"} <= keys
    for asset in CYCLE_ASSETS:
        spec = next(iter(asset.specs))
        assert spec.group_name == CYCLE_GROUP
        assert spec.kinds == {"lancedb", "python"} and spec.owners
        assert spec.description and spec.description == asset.op.description
        assert asset.op.pool == NOTE_TABLE_POOL
    hardened_deps = {d.asset_key.to_user_string() for d in next(iter(hardened_notes.specs)).deps}
    assert hardened_deps == {"extracted_notes", "extracted_examples"}
    check_keys = {k.name for k in graph.asset_check_keys}
    assert {s.name for c in CYCLE_CHECKS for s in c.check_specs} <= check_keys
    blocking = {s.name: s.blocking for c in CYCLE_CHECKS for s in c.check_specs}
    assert blocking == {
        "injectable_notes_have_vectors": True,
        "hardened_notes_have_no_expiry": True,
        "lineage_points_at_existing_notes": False,
    }


def test_jobs_schedules_and_sensors_are_defined():
    cycle = defs.resolve_job_def("memory_manager_cycle")
    assert cycle.executor_def is dg.in_process_executor
    selected = {k.to_user_string() for k in cycle.asset_layer.selected_asset_keys}
    assert selected == {
        "extracted_notes", "extracted_examples", "hardened_notes", "note_table", "note_changes"
    }  # fmt: skip
    assert "memory_maintenance" in {j.name for j in defs.resolve_all_job_defs()}
    schedule = defs.resolve_schedule_def("memory_manager_cycle_every_15_minutes")
    assert schedule.cron_schedule == "*/15 * * * *" and schedule.job_name == "memory_manager_cycle"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert not [s for s in defs.sensors or [] if s.has_jobs and "memory_manager_cycle" in {j.name for j in s.jobs}]


def test_asset_keys_do_not_depend_on_the_environment(monkeypatch, tmp_path):
    import memory_pipelines.definitions as module

    before = sorted(
        k.to_user_string() for k in module.defs.resolve_asset_graph().get_all_asset_keys()
    )
    monkeypatch.setenv("MEMORY_HOME", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("MEMORY_LLM_MODEL", "openai/gpt-4o-mini")
    reloaded = importlib.reload(module)
    try:
        after = sorted(
            k.to_user_string() for k in reloaded.defs.resolve_asset_graph().get_all_asset_keys()
        )
    finally:
        monkeypatch.undo()
        importlib.reload(module)
    assert before == after


def test_cycle_materializes_over_a_temporary_home(seeded, home):
    result = dg.materialize(
        [*CYCLE_ASSETS, *CYCLE_CHECKS], resources={"memory": resource(home)}, raise_on_error=False
    )
    assert result.success
    meta = {
        e.asset_key.to_user_string(): e.materialization.metadata
        for e in result.get_asset_materialization_events()
    }
    assert meta["extracted_notes"]["notes_created"].value == 1
    assert meta["extracted_notes"]["conversations_processed"].value == 1
    assert meta["hardened_notes"]["hardened"].value == 1
    assert meta["hardened_notes"]["note_table_version"].value >= 1
    assert "preview" in meta["hardened_notes"]
    assert all(c.passed for c in result.get_asset_check_evaluations())
    with seeded.sources.begin() as c:
        row = c.execute(select(manager_runs)).mappings().one()
    assert row["kind"] == "cycle" and row["status"] == "Completed"
    assert row["counts"]["run_id"] == result.run_id
    assert set(row["counts"]) >= {"extract_notes", "extract_examples", "harden"}
    steps = {s["step_name"] for s in seeded.sources.steps(result.run_id)}
    assert {"Extract Notes from Conversations", "Harden Provisional Notes"} <= steps


def test_blocking_check_stops_the_run_when_a_hardened_note_keeps_its_expiry(seeded, home, clock):
    seeded.add_note(
        "Alice likes Rust", status="Active", author_type="Agent", agent_id="helper",
        expires_at=clock().replace(year=2027),
    )  # fmt: skip
    result = dg.materialize(
        [hardened_notes, checks.hardened_notes_have_no_expiry],
        resources={"memory": resource(home)},
        raise_on_error=False,
    )
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.metadata["notes_with_expiry"].value == 1
    assert not result.success


def test_cycle_job_executes_in_process(seeded, home):
    result = defs.resolve_job_def("memory_manager_cycle").execute_in_process(
        resources={"memory": resource(home)}
    )
    assert result.success
    assert {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()} == {
        "extracted_notes",
        "extracted_examples",
        "hardened_notes",
        "note_table",
        "note_changes",
    }


def test_schedule_requests_the_cycle_job():
    ctx = dg.build_schedule_context(scheduled_execution_time=None)
    data = memory_manager_cycle_schedule.evaluate_tick(ctx)
    assert len(data.run_requests) == 1


def test_workspace_validates(tmp_path):
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "dagster"),
            "definitions",
            "validate",
            "-w",
            "workspace.yaml",
        ],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DAGSTER_HOME": str(dagster_home), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "All code locations passed validation" in proc.stderr + proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    not shutil.which("chromium") and not Path("/usr/bin/chromium").exists(), reason="no chromium"
)
@pytest.mark.parametrize(
    "group", ["memory_manager", "memory_maintenance", "memory_maintenance_by_agent"]
)
def test_screenshot_of_the_asset_graph(tmp_path, group):
    """The phase groups render in the UI (the cycle's three assets, the maintenance
    chain, and its per-agent partitioned twin); the PNGs are left in the test's temp dir
    for a person to look at."""
    png = tmp_path / f"{group}.png"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "screenshot_ui.py"),
            str(png),
            "--home",
            str(tmp_path / "home"),
            "--path",
            f"/locations/memory_pipelines/asset-groups/{group}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # the script's own waits (server 120 s, runs 120 s, chromium 120 s) end first
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
