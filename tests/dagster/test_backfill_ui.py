"""A backfill of the per-agent maintenance launched the way the UI launches it: through
``dagster dev``'s GraphQL API, run by its daemon (slow: a real webserver and daemon)."""

import importlib.util
import json
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy import select

from memory_pipelines.apps.demo import AGENTS, dagster_home, seed
from memory_pipelines.partitions import SHARED_PARTITION
from memory_pipelines.sources import manager_runs

ROOT = Path(__file__).resolve().parents[2]
#: a backfill's status (``instance.get_backfill(id).status``), by the value of its enum
REQUESTED, COMPLETED_SUCCESS = "REQUESTED", "COMPLETED_SUCCESS"
MAINTENANCE_ASSETS = [
    "note_importance",
    "consolidated_notes",
    "resolved_contradictions",
    "pruned_notes",
    "decayed_notes",
]


def _ui_helpers():
    spec = importlib.util.spec_from_file_location("screenshot_ui", ROOT / "scripts" / "screenshot_ui.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["screenshot_ui"] = module
    spec.loader.exec_module(module)
    return module


def _wait(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(2.0)
    raise AssertionError(f"timed out waiting for {what}")


def _start_sensor(ui, url: str, name: str) -> None:
    """Turn a sensor on as the UI's toggle does (every sensor starts stopped)."""
    repos = ui.graphql(
        url,
        "{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }",
        timeout=30,
    )
    repo = repos["data"]["repositoriesOrError"]["nodes"][0]
    selector = (
        f"repositoryLocationName: {json.dumps(repo['location']['name'])}, "
        f"repositoryName: {json.dumps(repo['name'])}, sensorName: {json.dumps(name)}"
    )
    reply = ui.graphql(
        url,
        f"mutation {{ startSensor(sensorSelector: {{{selector}}}) {{ __typename"
        " ... on PythonError { message } } }",
        timeout=30,
    )
    assert reply["data"]["startSensor"]["__typename"] == "Sensor", reply


@pytest.mark.slow
def test_a_ui_backfill_maintains_the_chosen_agent_partitions(tmp_path, monkeypatch, open_service):
    ui = _ui_helpers()
    home = tmp_path / "home"
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")  # the server and its runs inherit it
    with open_service(home, clock=None) as svc:
        seed(svc, progress_bar=False)
    folder = dagster_home(home)
    chosen = ["code-helper", "support-desk"]
    with ui.dagster_dev(home, timeout=180) as url:
        with dg.DagsterInstance.from_config(str(folder)) as instance:
            # the partitions sensor, once an operator turns it on, creates the partitions
            # from the agents table
            _start_sensor(ui, url, "memory_agent_partitions")
            keys = _wait(
                "the agent partitions",
                lambda: instance.get_dynamic_partitions("memory_agents"),
                timeout=150,
            )
            assert sorted(keys) == sorted([*AGENTS, SHARED_PARTITION])
            selection = ", ".join(
                "{path: " + json.dumps(["by_agent", name]) + "}" for name in MAINTENANCE_ASSETS
            )
            reply = ui.graphql(
                url,
                "mutation { launchPartitionBackfill(backfillParams: {"
                f"assetSelection: [{selection}], partitionNames: {json.dumps(chosen)}"
                "}) { __typename ... on LaunchBackfillSuccess { backfillId }"
                " ... on PythonError { message } } }",
                timeout=30,
            )
            launched = reply["data"]["launchPartitionBackfill"]
            assert launched["__typename"] == "LaunchBackfillSuccess", reply
            backfill_id = launched["backfillId"]

            def finished():
                backfill = instance.get_backfill(backfill_id)
                done = backfill.status.value != REQUESTED
                return backfill if done else None

            backfill = _wait("the backfill", finished, timeout=420)
            assert backfill.status.value == COMPLETED_SUCCESS, backfill.status
            runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
            assert {r.tags.get("dagster/partition") for r in runs} == set(chosen)
            statuses = instance.get_status_by_partition(
                dg.AssetKey(["by_agent", "decayed_notes"]),
                partition_keys=sorted(keys),
                partitions_def=dg.DynamicPartitionsDefinition(name="memory_agents"),
            )
            assert {k for k, v in statuses.items() if v == dg.AssetPartitionStatus.MATERIALIZED} == set(chosen)
    with open_service(home, clock=None) as svc, svc.sources.begin() as conn:
        rows = conn.execute(
            select(manager_runs.c.counts).where(
                manager_runs.c.kind == "maintenance", manager_runs.c.status == "Completed"
            )
        ).scalars()
        maintained = {(counts or {}).get("partition") for counts in rows}
    # the chosen partitions recorded their own maintenance; no other partition did
    assert maintained - {None} == set(chosen)
