"""``memory-pipelines cycle`` with DAGSTER_HOME set runs through that Dagster instance:
two CLI cycles are two runs of ``memory_manager_cycle`` in its run storage and the
catalog shows the latest; maintenance runs there when its gate fires; a DAGSTER_HOME that
is not a folder, or holds an instance Dagster cannot open, is refused in one line before
anything is written."""

from __future__ import annotations

import dagster as dg
import pytest
from factories import ALICE_NOTE, seed_acme

from memory_pipelines import phases
from memory_pipelines.apps.cli import cycle_command, main
from memory_pipelines.assets.sources import RATED_CONVERSATIONS


@pytest.fixture
def seeded(open_service):
    """A home with a rated conversation and an agent-written provisional note."""
    with open_service() as s:
        seed_acme(s, reply=False)
        s.add_note("Alice deploys on Tuesdays", **ALICE_NOTE)
        yield s


def _instance_dir(tmp_path):
    folder = tmp_path / "dagster_home"
    folder.mkdir()
    (folder / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return folder


def test_a_cli_cycle_is_recorded_in_the_dagster_home_instance(
    seeded, home, tmp_path, monkeypatch, capsys, open_service
):
    folder = _instance_dir(tmp_path)
    with open_service(clock=None) as svc:  # the real clock
        phases.maintenance_run.record_maintenance(svc.context, "m0", "time", svc.now(), {})
    monkeypatch.setenv("DAGSTER_HOME", str(folder))
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    assert cycle_command(["--home", str(home)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "maintenance: not triggered (not-triggered)" in out
    assert "STEP_START" not in captured.err + out  # the console shows warnings, not DEBUG
    assert "| hardened_notes" in out and "notes_created" in out
    with dg.DagsterInstance.from_config(str(folder)) as instance:
        [run] = instance.get_runs()
        assert run.job_name == "memory_manager_cycle" and run.status == dg.DagsterRunStatus.SUCCESS
        for key in ("extracted_notes", "hardened_notes", "note_table"):
            assert instance.get_latest_materialization_event(dg.AssetKey(key)).run_id == run.run_id
        observed = instance.get_latest_data_version_record(RATED_CONVERSATIONS)
        assert observed.run_id == run.run_id


@pytest.mark.slow
def test_cli_cycles_are_recorded_in_the_dagster_home_instance(
    seeded, home, tmp_path, monkeypatch, capsys
):
    folder = _instance_dir(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(folder))
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    assert cycle_command(["--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert "memory_manager_cycle: run" in out and "succeeded" in out
    assert "maintenance: triggered (time)" in out  # never maintained: the gate fires
    assert str(folder) in out
    assert cycle_command(["--home", str(home)]) == 0
    with dg.DagsterInstance.from_config(str(folder)) as instance:
        cycles = instance.get_runs(filters=dg.RunsFilter(job_name="memory_manager_cycle"))
        assert len(cycles) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in cycles)
        assert all(r.tags["memory/trigger"] == "cli" for r in cycles)
        # the catalog shows the latest CLI cycle, not an older materialization
        latest = instance.get_latest_materialization_event(dg.AssetKey("hardened_notes"))
        assert latest.run_id == cycles[0].run_id
        table = instance.get_latest_materialization_event(dg.AssetKey("note_table"))
        assert table.run_id == cycles[0].run_id
        maintenance = instance.get_runs(filters=dg.RunsFilter(job_name="memory_maintenance"))
        assert len(maintenance) == 1  # the second cycle's gate did not fire again
        assert maintenance[0].tags["memory/maintenance_trigger"] == "time"
        assert instance.get_latest_data_version_record(RATED_CONVERSATIONS) is not None


@pytest.mark.parametrize("problem", ["missing", "broken yaml"])
def test_cli_cycle_refuses_an_unusable_dagster_home(
    seeded, home, tmp_path, monkeypatch, capsys, problem
):
    folder = tmp_path / "dagster_home"
    if problem == "broken yaml":
        folder.mkdir()
        (folder / "dagster.yaml").write_text("run_storage: [oops\n")
    monkeypatch.setenv("DAGSTER_HOME", str(folder))
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    assert main(["cycle", "--home", str(home)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memory-pipelines: error: DAGSTER_HOME=") and err.count("\n") == 1
    assert ("is not a directory" if problem == "missing" else "cannot open this instance") in err
    assert folder.exists() == (problem == "broken yaml")  # a missing folder is not created
    provisional = seeded.notes(status="Provisional")
    assert list(provisional["note"]) == ["Alice deploys on Tuesdays"]  # no cycle ran
