"""The maintenance assets, job, schedule and sensor through Dagster, on a temporary home,
with the offline judge (no network, hashing embedder)."""

import re
from datetime import timedelta

import dagster as dg
import numpy as np
import pytest
from sqlalchemy import select

from memory_pipelines import phases
from memory_pipelines.assets.common import MAINTENANCE_GROUP, NOTE_TABLE_POOL
from memory_pipelines.assets.compaction import compacted_note_tables
from memory_pipelines.assets.consolidation import consolidated_notes
from memory_pipelines.assets.contradictions import resolved_contradictions
from memory_pipelines.assets.decay import decayed_notes
from memory_pipelines.assets.importance import note_importance
from memory_pipelines.assets.inventory import note_inventory
from memory_pipelines.assets.note_changes import note_changes
from memory_pipelines.assets.pruning import pruned_notes
from memory_pipelines.inventory import dangling_lineage
from memory_pipelines.notes import Note
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.sensors.maintenance_trigger import (
    TRIGGER_TAG,
    memory_maintenance,
    memory_maintenance_trigger,
)
from memory_pipelines.sources import manager_runs

MAINTENANCE_ASSETS = [
    note_importance,
    consolidated_notes,
    resolved_contradictions,
    pruned_notes,
    decayed_notes,
    compacted_note_tables,
]
DIM = 64


def _dir(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM)
    return v / np.linalg.norm(v)


def _near(base: np.ndarray, seed: int, spread: float) -> np.ndarray:
    u = _dir(1000 + seed)
    u = u - (u @ base) * base
    v = base + spread * u / np.linalg.norm(u)
    return v / np.linalg.norm(v)


@pytest.fixture
def seeded(home, open_service):
    """A home with a consolidation cluster, a contradiction, a stale note and an
    expired note, written with the real clock (the resource's service uses it too)."""
    with open_service(clock=None) as svc:
        now = svc.now()
        svc.configure_agent("agent")
        for user in ("u1", "u2"):
            svc.add_user(user)
        tea, deploy = _dir(1), _dir(2)
        rows = [
            (
                "The user prefers green tea.",
                _near(tea, 1, 0.2),
                {"created_at": now - timedelta(days=2)},
            ),
            (
                "The user prefers tea in the morning.",
                _near(tea, 2, 0.2),
                {"created_at": now - timedelta(days=1)},
            ),
            ("The user prefers tea without sugar.", _near(tea, 3, 0.2), {}),
            (
                "The deploy day is Friday.",
                _near(deploy, 1, 0.5),
                {"created_at": now - timedelta(days=10)},
            ),
            ("The deploy day is Monday.", _near(deploy, 2, 0.5), {}),
            ("The user lives in Lisbon.", _dir(3), {"user_id": "u2"}),
            (
                "Temporary: the user is travelling.",
                _dir(4),
                {
                    "status": "Provisional",
                    "author_type": "Agent",
                    "expires_at": now - timedelta(hours=1),
                },
            ),
        ]
        notes, vecs = [], []
        for text, vec, fields in rows:
            fields = {
                "agent_id": "agent",
                "user_id": "u1",
                "is_auto_generated": True,
                "access_count": 1,
                **fields,
            }
            notes.append(Note(note=text, **fields))
            vecs.append(vec)
        svc.save_notes(notes, vectors=np.asarray(vecs))
        svc.delete_user("u2")
    return home


def _resource(home) -> MemoryApiResource:
    return MemoryApiResource(home=str(home), embedding_model="hash")


def test_assets_are_wired_as_one_ordered_group():
    graph = dg.Definitions(
        assets=[*MAINTENANCE_ASSETS, note_inventory],
        resources={"memory": MemoryApiResource(home="unused")},
    ).resolve_asset_graph()
    for asset in MAINTENANCE_ASSETS:
        node = graph.get(asset.key)
        assert node.group_name == MAINTENANCE_GROUP
        assert asset.get_asset_spec().owners == ["team:memory"]
        assert {"lancedb", "python"} <= set(asset.get_asset_spec().kinds)
        assert asset.op.pool == NOTE_TABLE_POOL
        description = asset.get_asset_spec().description  # the docstring: summary, then details
        assert description and "\n\n" in description and "Reads" in description
    chain = [a.key for a in MAINTENANCE_ASSETS]
    for upstream, downstream in zip(chain, chain[1:], strict=False):
        assert graph.get(downstream).parent_keys == {upstream}
    assert graph.get(note_inventory.key).group_name == "memory_analytics"


def test_materialize_the_maintenance_chain(seeded, open_service):
    result = dg.materialize(
        [*MAINTENANCE_ASSETS, note_inventory, note_changes],
        resources={"memory": _resource(seeded)},
        tags={TRIGGER_TAG: "forced"},
    )
    assert result.success
    # the analyst's view of the run: every change, and the one to review
    changes = result.output_for_node("note_changes")
    assert set(changes["phase"]) >= {"consolidation", "contradictions", "pruning", "decay"}
    revoked = changes[changes["note"] == "The deploy day is Friday."]
    assert list(revoked["review"]) == ["resolved by recency alone"]
    assert revoked["status_before"].item() == "Active" and revoked["status_after"].item() == "Revoked"
    assert revoked["confidence"].item() == 85.0
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "notes_to_review" and not check.passed
    assert check.severity == dg.AssetCheckSeverity.WARN
    assert check.metadata["resolved_by_recency_alone"].value == 1
    meta = {
        e.asset_key.path[-1]: e.step_materialization_data.materialization.metadata
        for e in result.get_asset_materialization_events()
    }
    assert meta["note_importance"]["notes_scored"].value == 6
    for asset, metadata in meta.items():  # what an analyst reads: snake_case, no nan/None
        assert all(re.fullmatch(r"[a-z0-9_]+(/[a-z0-9_]+)?", k) for k in metadata), asset
        for value in metadata.values():
            if isinstance(value, dg.MarkdownMetadataValue) and "|" in value.value:
                cells = re.findall(r"\|\s*([^|\n]*?)\s*(?=\|)", value.value)
                assert "nan" not in cells and "None" not in cells, (asset, value.value)
    assert meta["consolidated_notes"]["consolidated_cluster_count"].value == 1
    assert meta["consolidated_notes"]["source_notes_archived"].value == 3
    assert meta["resolved_contradictions"]["contradictions_resolved"].value == 1
    assert meta["pruned_notes"]["orphaned_users"].value == 1
    assert meta["decayed_notes"]["notes_expired"].value == 1
    assert meta["decayed_notes"]["maintenance_status"].value == "Completed"
    assert "note_table_version" in meta["decayed_notes"]
    assert "consolidated" in meta["consolidated_notes"]["preview"].value
    assert "last_maintenance" in meta["note_inventory"]

    with open_service(seeded, clock=None) as svc:
        df = svc.notes()
        friday = df[df["note"] == "The deploy day is Friday."].iloc[0]
        assert friday["status"] == "Revoked"
        assert "[Contradiction resolved: superseded by note" in friday["comments"]
        merged = df[df["consolidation_count"] == 1].iloc[0]
        assert merged["status"] == "Active" and merged["user_id"] == "u1"
        assert "tea" in merged["note"].lower()
        assert dangling_lineage(svc).empty
        with svc.sources.begin() as conn:
            rows = (
                conn.execute(select(manager_runs).where(manager_runs.c.kind == "maintenance"))
                .mappings()
                .all()
            )
        assert [r["status"] for r in rows] == ["Completed"]
        assert rows[0]["counts"]["triggerType"] == "forced"
        assert phases.triggers.maintenance_trigger(svc.context) == (False, "not-triggered")


def test_a_partial_materialization_is_not_a_completed_maintenance(seeded, open_service):
    result = dg.materialize(
        [decayed_notes], resources={"memory": _resource(seeded)}, selection=[decayed_notes]
    )
    assert result.success
    with open_service(seeded, clock=None) as svc:
        assert phases.triggers.last_maintenance_at(svc.context) is None
        assert phases.triggers.maintenance_trigger(svc.context) == (True, "time")


def test_the_job_from_the_definitions(seeded, monkeypatch, open_service):
    monkeypatch.setenv("MEMORY_HOME", str(seeded))
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    from memory_pipelines.definitions import defs

    dg.Definitions.validate_loadable(defs)
    job = defs.resolve_job_def("memory_maintenance")
    keys = {k.path[-1] for k in job.asset_layer.executable_asset_keys}
    assert keys == {a.key.path[-1] for a in MAINTENANCE_ASSETS} | {"note_inventory", "note_changes"}
    result = job.execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), tags={TRIGGER_TAG: "time"}
    )
    assert result.success
    with open_service(seeded, clock=None) as svc:
        assert phases.triggers.last_maintenance_at(svc.context) is not None
        assert svc.sources.get_state(phases.triggers.STATE_LAST)["trigger"] == "time"


def test_sensor_requests_a_run_when_the_trigger_fires(seeded, open_service):
    resource = _resource(seeded)

    def tick(instance, cursor=None):
        with dg.build_sensor_context(
            instance=instance, cursor=cursor, resources={"memory": resource}
        ) as ctx:
            return memory_maintenance_trigger(ctx), ctx.cursor

    with dg.DagsterInstance.ephemeral() as instance:
        request, cursor = tick(instance)
        assert isinstance(request, dg.RunRequest)
        assert request.tags[TRIGGER_TAG] == "time"
        assert request.run_key.startswith("maintenance:never:time:")
        assert cursor == request.run_key
        again, _ = tick(instance, cursor)  # the same state asks once
        assert isinstance(again, dg.SkipReason)
        with open_service(seeded, clock=None) as svc:
            phases.maintenance_run.record_maintenance(svc.context, "m1", "time", svc.now(), {})
        skipped, _ = tick(instance, cursor)  # after a maintenance the trigger is quiet
        assert isinstance(skipped, dg.SkipReason)
        assert "not-triggered" in skipped.skip_message


def test_the_maintenance_job_has_one_trigger_and_it_starts_stopped():
    """The trigger sensor is the maintenance job's only trigger (its frequency gate
    covers the daily run), and it is off until an operator turns it on."""
    assert memory_maintenance_trigger.job_name == memory_maintenance.name == "memory_maintenance"
    assert memory_maintenance_trigger.default_status == dg.DefaultSensorStatus.STOPPED
    from memory_pipelines.definitions import defs

    schedules = [s for s in defs.schedules or [] if s.job_name == "memory_maintenance"]
    sensors = [s for s in defs.sensors or [] if s.has_jobs and "memory_maintenance" in {j.name for j in s.jobs}]
    assert schedules == [] and [s.name for s in sensors] == ["memory_maintenance_trigger"]
