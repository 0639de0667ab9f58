"""Per-agent partitions: every phase restricted to one partition, the union of the
partition runs equal to a whole-pool run, cursors that survive switching modes, and the
partitioned Dagster assets, jobs, sensor and schedule (real LanceDB, SQLite, Dagster)."""

import multiprocessing
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from factories import DIM, RecordingJudge, add_events, direction, near

from memory_pipelines import MemoryService, phases
from memory_pipelines.assets import by_agent
from memory_pipelines.assets.common import (
    AGENT_PARTITIONS,
    CYCLE_BY_AGENT_GROUP,
    MAINTENANCE_BY_AGENT_GROUP,
)
from memory_pipelines.clock import FakeClock
from memory_pipelines.config import ImportanceConfig, MaintenanceConfig
from memory_pipelines.definitions import defs
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import ValidationError
from memory_pipelines.notes import Note
from memory_pipelines.partitions import (
    SHARED_PARTITION,
    agents_in,
    is_valid_key,
    note_filter,
    partition_keys,
    partition_of,
    state_key,
)
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.sensors.partitions import (
    memory_agent_partitions,
    memory_maintenance_by_agent,
    memory_maintenance_by_agent_trigger,
    memory_manager_cycle_by_agent,
    memory_manager_cycle_by_agent_schedule,
)

AGENTS = ("alpha", "beta", "gamma")
#: the uniqueness promotion compares against the cohort's 95th percentile, which is per
#: partition in a partitioned run; the equivalence tests switch that path off
NO_OUTLIERS = MaintenanceConfig(importance=ImportanceConfig(outlier_promotion_min_cohort=10**6))


# --------------------------------------------------------------------------- helpers


def test_partition_helpers():
    assert partition_of("alpha") == "alpha" and partition_of(None) == SHARED_PARTITION
    assert partition_of("") == SHARED_PARTITION
    assert partition_keys(["beta", "alpha", "beta", "bad...id", SHARED_PARTITION]) == [
        "alpha",
        "beta",
        SHARED_PARTITION,
    ]
    assert not is_valid_key("a\nb") and not is_valid_key("") and is_valid_key("a.b")
    assert note_filter(None) is None
    assert note_filter(SHARED_PARTITION).sql == "`agent_id` IS NULL"
    assert note_filter("o'brien").sql == "`agent_id` = 'o''brien'"
    assert agents_in(None, ["a", "b"]) == ["a", "b"] and agents_in("b", ["a", "b"]) == ["b"]
    assert agents_in(SHARED_PARTITION, ["a"]) == []
    assert state_key("k", None) == "k" and state_key("k", "a") == "k@partition:a"


def test_the_shared_partition_key_is_not_an_agent_id(svc):
    with pytest.raises(ValidationError, match="reserved"):
        svc.configure_agent(SHARED_PARTITION)
    assert svc.sources.get_agent(SHARED_PARTITION) is None


# --------------------------------------------------------------------------- equivalence


def build_pool(svc: MemoryService) -> None:
    """The same pool in every home: per agent and for shared notes, a consolidation
    cluster, a contradicting pair, a stale note, an expired note and a decaying note; plus
    injection events. Ids, vectors and times are explicit, so two homes are identical."""
    now = svc.now()
    for agent in AGENTS:
        svc.configure_agent(agent, auto_archive_enabled=True)
    svc.configure_agent("retired")
    for user in ("u1", "u2"):
        svc.add_user(user)
    notes: list[tuple[Note, np.ndarray]] = []
    owners = [*AGENTS, None]
    for k, agent in enumerate(owners):
        tag = agent or "shared"
        base = direction(100 + k)
        common = {"agent_id": agent, "user_id": "u1", "is_auto_generated": True}
        old = now - timedelta(days=20)
        for j in range(3):
            notes.append(
                (
                    Note(id=f"{tag}-c{j}", note=f"{tag} likes tea {j}", created_at=old, **common),
                    near(base, 10 * k + j, 0.2),
                )
            )
        other = direction(200 + k)
        notes.append(
            (
                Note(id=f"{tag}-p0", note=f"{tag} drinks coffee", created_at=old, **common),
                other,
            )
        )
        notes.append(
            (
                Note(id=f"{tag}-p1", note=f"{tag} drinks no coffee", created_at=now, **common),
                near(other, 500 + k, 0.25),
            )
        )
        notes.append(
            (
                Note(
                    id=f"{tag}-x",
                    note=f"{tag} expired fact",
                    expires_at=now - timedelta(hours=1),
                    **common,
                ),
                direction(300 + k),
            )
        )
        notes.append(
            (
                Note(
                    id=f"{tag}-d",
                    note=f"{tag} fading fact",
                    importance_score=1.0,
                    created_at=now - timedelta(days=60),
                    **{**common, "user_id": "u2"},
                ),
                direction(400 + k),
            )
        )
    notes.append(
        (
            Note(id="retired-s", note="retired agent fact", agent_id="retired", is_auto_generated=True),
            direction(600),
        )
    )
    svc.save_notes([n for n, _ in notes], vectors=np.asarray([v for _, v in notes]))
    svc.deactivate_agent("retired")  # its notes are stale
    injected = ("alpha-c0", "alpha-c0", "beta-p0", "shared-c1", "shared-d")
    add_events(svc, [("note", item) for item in injected], now - timedelta(hours=2))


def comparable(svc: MemoryService) -> pd.DataFrame:
    cols = [
        "id",
        "agent_id",
        "status",
        "protection_tier",
        "comments",
        "consolidated_into_note_id",
        "access_count",
        "importance_score",
        "note",
    ]
    df = svc.notes()[cols].sort_values("id").reset_index(drop=True)
    df["importance_score"] = df["importance_score"].round(9)
    return df


@pytest.fixture
def two_pools(tmp_path, clock):
    """Two identical pools in two homes, on one clock, with the recording judge."""
    services = []
    for name in ("whole", "parts"):
        svc = MemoryService.open(
            tmp_path / name,
            embedder=HashEmbedder(dim=DIM),
            clock=clock,
            maintenance_config=NO_OUTLIERS,
        )
        svc.judge = RecordingJudge()
        build_pool(svc)
        services.append(svc)
    yield services
    for svc in services:
        svc.close()


def test_partitioned_maintenance_equals_a_whole_pool_run(two_pools):
    whole, parts = two_pools
    assert comparable(whole).equals(comparable(parts))
    report = phases.maintenance_run.run_maintenance(whole, "forced", "m-whole")
    keys = partition_keys(a.agent_id for a in parts.sources.list_agents())
    assert keys == ["alpha", "beta", "gamma", "retired", SHARED_PARTITION]
    totals: dict[str, int] = {}
    for key in keys:
        part = phases.maintenance_run.run_maintenance(parts.context, "forced", f"m-{key}", partition=key)
        for name, value in part.items():
            if isinstance(value, int) and not isinstance(value, bool):
                totals[name] = totals.get(name, 0) + value
    # every phase did something in the fixture, and the same things in both modes
    for name in (
        "notesScored",
        "consolidatedClusters",
        "sourceNotesRevoked",
        "contradictionsResolved",
        "staleNotesPruned",
        "notesExpired",
        "decayArchivedNotes",
    ):
        assert report[name] > 0, name
        assert totals[name] == report[name], name
    pd.testing.assert_frame_equal(comparable(whole), comparable(parts))


def test_a_partition_run_touches_only_its_partition(two_pools):
    _, parts = two_pools
    before = comparable(parts).set_index("id")
    phases.maintenance_run.run_maintenance(parts.context, "forced", "m-beta", partition="beta")
    after = comparable(parts).set_index("id")
    new_ids = after.index.difference(before.index)
    assert len(new_ids) == 1 and after.loc[new_ids[0], "agent_id"] == "beta"  # consolidated
    common = before.index.intersection(after.index)
    changed = [i for i in common if not before.loc[i].equals(after.loc[i])]
    assert changed and all(before.loc[i, "agent_id"] == "beta" for i in changed)
    # the partition's record and trigger are its own; the whole pool was never maintained
    assert phases.triggers.last_maintenance_at(parts.context, "beta") is not None
    assert phases.triggers.last_maintenance_at(parts.context) is None
    assert phases.triggers.last_maintenance_at(parts.context, "alpha") is None
    # a whole-pool maintenance counts for every partition
    phases.maintenance_run.run_maintenance(parts.context, "forced", "m-all")
    assert phases.triggers.last_maintenance_at(parts.context, "alpha") == phases.triggers.last_maintenance_at(parts.context)


def test_partition_trigger_counts_its_own_notes(two_pools, clock):
    _, parts = two_pools
    parts.maintenance_config = replace(NO_OUTLIERS, note_count_trigger=4)
    for key in partition_keys(AGENTS):
        phases.maintenance_run.record_maintenance(parts.context, f"m-{key}", "time", parts.now(), {}, partition=key)
    clock.advance(hours=1)  # under a day: only the event trigger can fire
    now = parts.now()
    fresh = [
        Note(id=f"beta-new{i}", note=f"beta new fact {i}", agent_id="beta", is_auto_generated=True, created_at=now)
        for i in range(4)
    ]  # fmt: skip
    parts.save_notes(fresh, vectors=np.asarray([direction(700 + i) for i in range(4)]))
    assert phases.triggers.maintenance_trigger(parts.context, partition="beta") == (True, "event")
    assert phases.triggers.maintenance_trigger(parts.context, partition="alpha") == (False, "not-triggered")


def test_interleaved_partition_runs_keep_their_own_run_state(two_pools):
    """Consolidation of one partition, then of another, then the first one's
    contradiction phase: it still knows which notes its own consolidation made (the
    record is per partition, not one key the second run overwrites)."""
    _, parts = two_pools
    alpha = phases.consolidation.run(parts.context, "run-a", partition="alpha")
    beta = phases.consolidation.run(parts.context, "run-b", partition="beta")
    assert alpha["newConsolidatedNoteIds"] and beta["newConsolidatedNoteIds"]
    assert phases.contradictions.this_cycle_consolidated(parts, "run-a", "alpha") == set(
        alpha["newConsolidatedNoteIds"]
    )
    assert phases.contradictions.this_cycle_consolidated(parts, "run-b", "beta") == set(
        beta["newConsolidatedNoteIds"]
    )


def _maintain_partitions(home: str, keys: list[str]) -> None:
    """A separate process maintaining some partitions of ``home`` (same clock and judge)."""
    with MemoryService.open(
        home, embedder=HashEmbedder(dim=DIM), clock=FakeClock(), maintenance_config=NO_OUTLIERS
    ) as svc:
        svc.judge = RecordingJudge()
        for key in keys:
            phases.maintenance_run.run_maintenance(svc.context, "forced", f"m-{key}", partition=key)


def test_partitions_maintained_by_two_processes_at_once(two_pools, tmp_path):
    """Two processes maintain disjoint partitions of one home at the same time: nothing
    is lost to concurrent commits and the result equals a whole-pool run."""
    whole, parts = two_pools
    phases.maintenance_run.run_maintenance(whole, "forced", "m-whole")
    home = str(tmp_path / "parts")
    context = multiprocessing.get_context("spawn")
    procs = [
        context.Process(target=_maintain_partitions, args=(home, keys))
        for keys in (["alpha", "gamma", SHARED_PARTITION], ["beta", "retired"])
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=180)
        assert proc.exitcode == 0
    with MemoryService.open(home, embedder=HashEmbedder(dim=DIM), clock=FakeClock()) as fresh:
        pd.testing.assert_frame_equal(comparable(whole), comparable(fresh))
        assert fresh.notes()["id"].is_unique  # no row committed twice


# --------------------------------------------------------------------------- fold cursors


def _events(svc: MemoryService, items: list[str]) -> None:
    add_events(svc, [("note", item) for item in items], svc.now())


def test_fold_per_partition_then_whole_counts_every_event_once(two_pools):
    whole, parts = two_pools
    for svc in (whole, parts):
        _events(svc, ["alpha-p0", "beta-p0", "shared-p0", "alpha-p0"])
    whole.manager.fold_injection_events("f")
    first = parts.manager.fold_injection_events("f-alpha", "alpha")
    assert first["notesTouched"] == 2  # alpha-c0 (fixture events) and alpha-p0
    assert parts.get_note("beta-p0").access_count == 0  # not alpha's
    again = parts.manager.fold_injection_events("f-alpha2", "alpha")
    assert again["notesTouched"] == 0
    parts.manager.fold_injection_events("f-all")  # the rest, without alpha's again
    pd.testing.assert_frame_equal(comparable(whole), comparable(parts))
    # more events after a whole-pool fold: a partition starts from the whole-pool cursor
    for svc in (whole, parts):
        _events(svc, ["gamma-p0"])
    whole.manager.fold_injection_events("g")
    parts.manager.fold_injection_events("g-gamma", "gamma")
    parts.manager.fold_injection_events("g-alpha", "alpha")
    pd.testing.assert_frame_equal(comparable(whole), comparable(parts))
    assert parts.get_note("gamma-p0").access_count == 1


# --------------------------------------------------------------------------- the cycle


def test_partitioned_cycles_equal_a_whole_cycle(tmp_path, clock):
    """Extraction (offline judge) and hardening per partition give the notes a whole
    cycle gives, and a second round mines nothing again."""
    results = []
    for name, partitioned in (("whole", False), ("parts", True)):
        with MemoryService.open(tmp_path / name, embedder=HashEmbedder(dim=DIM), clock=clock) as svc:
            for agent in ("alpha", "beta"):
                svc.configure_agent(agent)
            svc.add_user("u1")
            svc.add_conversation("ca", "alpha", "u1")
            svc.add_message("ca", "m1", "user", "I prefer answers in French, always.", rating=9)
            svc.add_conversation("cb", "beta", "u1")
            svc.add_message("cb", "m2", "user", "Our team deploys on Fridays only.", rating=9)
            svc.add_note(
                "User likes short answers", agent_id="beta", user_id="u1",
                status="Provisional", author_type="Agent",
            )  # fmt: skip
            keys = partition_keys(["alpha", "beta"]) if partitioned else [None]
            for key in keys:
                svc.manager.run_cycle(run_id=f"c-{key}", partition=key)
            for key in keys:  # nothing new the second time
                again = svc.manager.run_cycle(run_id=f"c2-{key}", partition=key)
                assert again.get("notesCreated", 0) == 0 and again.get("hardened", 0) == 0
            df = svc.notes()
            results.append(
                sorted(zip(df["agent_id"], df["note"], df["status"], df["author_type"], strict=True))
            )
    assert results[0] == results[1]
    assert any(status == "Active" and author == "Agent" for _, _, status, author in results[0])
    assert len(results[0]) > 1


# --------------------------------------------------------------------------- Dagster


def test_partitioned_twins_mirror_the_phase_assets():
    twins = [
        by_agent.extracted_notes,
        by_agent.extracted_examples,
        by_agent.hardened_notes,
        by_agent.note_importance,
        by_agent.consolidated_notes,
        by_agent.resolved_contradictions,
        by_agent.pruned_notes,
        by_agent.decayed_notes,
    ]
    for twin in twins:
        assert twin.key.path[0] == "by_agent"
        assert twin.partitions_def == AGENT_PARTITIONS
        assert "Partitioned by agent" in (twin.descriptions_by_key[twin.key] or "")
    groups = {twin.group_names_by_key[twin.key] for twin in twins}
    assert groups == {CYCLE_BY_AGENT_GROUP, MAINTENANCE_BY_AGENT_GROUP}
    deps = {d.to_user_string() for d in by_agent.consolidated_notes.asset_deps[by_agent.consolidated_notes.key]}
    assert deps == {"by_agent/note_importance"}


@pytest.fixture
def dagster_home(tmp_path, open_service):
    """A pool in a home the resource opens (real clock), with the offline judge."""
    home = tmp_path / "home"
    with open_service(home, maintenance_config=NO_OUTLIERS, clock=None) as svc:
        build_pool(svc)
        svc.add_conversation("ca", "alpha", "u1")
        svc.add_message("ca", "m1", "user", "I prefer answers in French, always.", rating=9)
    return home


def _resource(home) -> MemoryApiResource:
    return MemoryApiResource(home=str(home), embedding_model="hash")


def test_sensor_keeps_partitions_in_sync_with_the_agents(dagster_home, open_service):
    resource = _resource(dagster_home)
    with dg.DagsterInstance.ephemeral() as instance:

        def tick():
            with dg.build_sensor_context(instance=instance, resources={"memory": resource}) as ctx:
                result = memory_agent_partitions(ctx)
            if isinstance(result, dg.SensorResult):
                for request in result.dynamic_partitions_requests or []:
                    if isinstance(request, dg.AddDynamicPartitionsRequest):
                        instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
                    else:
                        for key in request.partition_keys:
                            instance.delete_dynamic_partition(request.partitions_def_name, key)
            return result

        first = tick()
        assert isinstance(first, dg.SensorResult)
        assert instance.get_dynamic_partitions("memory_agents") == [
            "alpha", "beta", "gamma", "retired", SHARED_PARTITION,
        ]  # fmt: skip
        assert isinstance(tick(), dg.SkipReason)  # in sync
        with open_service(dagster_home, clock=None) as svc:
            svc.configure_agent("delta")
        tick()
        assert "delta" in instance.get_dynamic_partitions("memory_agents")
        instance.add_dynamic_partitions("memory_agents", ["ghost"])  # no agent, no notes
        tick()
        assert "ghost" not in instance.get_dynamic_partitions("memory_agents")


def test_partitioned_jobs_run_one_agent(dagster_home, open_service):
    resource = _resource(dagster_home)
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("memory_agents", partition_keys([*AGENTS, "retired"]))
        with open_service(dagster_home, clock=None) as svc:
            before = comparable(svc).set_index("id")
        job = defs.resolve_job_def(memory_manager_cycle_by_agent.name)
        result = job.execute_in_process(
            partition_key="alpha", instance=instance, resources={"memory": resource}
        )
        assert result.success
        mats = result.get_asset_materialization_events()
        assert {m.partition for m in mats} == {"alpha"}
        assert {m.asset_key.to_user_string() for m in mats} == {
            "by_agent/extracted_notes", "by_agent/extracted_examples", "by_agent/hardened_notes",
        }  # fmt: skip
        job = defs.resolve_job_def(memory_maintenance_by_agent.name)
        result = job.execute_in_process(
            partition_key="alpha",
            instance=instance,
            resources={"memory": resource},
            tags={"memory/maintenance_trigger": "time"},
        )
        assert result.success
        with open_service(dagster_home, clock=None) as svc:
            after = comparable(svc).set_index("id")
            assert phases.triggers.last_maintenance_at(svc.context, "alpha") is not None
            assert phases.triggers.last_maintenance_at(svc.context, "beta") is None
        new = after.index.difference(before.index)
        assert len(new) and set(after.loc[new, "agent_id"]) == {"alpha"}
        common = before.index.intersection(after.index)
        changed = [i for i in common if not before.loc[i].equals(after.loc[i])]
        assert changed and {before.loc[i, "agent_id"] for i in changed} == {"alpha"}
        statuses = instance.get_status_by_partition(
            dg.AssetKey(["by_agent", "decayed_notes"]),
            partition_keys=instance.get_dynamic_partitions("memory_agents"),
            partitions_def=AGENT_PARTITIONS,
        )
        assert statuses["alpha"] == dg.AssetPartitionStatus.MATERIALIZED
        assert statuses["beta"] is None


def test_partitioned_schedule_and_trigger_sensor(dagster_home, tmp_path, open_service):
    resource = _resource(dagster_home)
    assert memory_manager_cycle_by_agent_schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert memory_maintenance_by_agent_trigger.default_status == dg.DefaultSensorStatus.STOPPED
    assert memory_maintenance_by_agent.partitions_def == AGENT_PARTITIONS
    (tmp_path / "dagster").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "dagster")) as instance:
        tick = datetime(2026, 6, 1, 12, 15, tzinfo=UTC)
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=tick) as ctx:
            assert isinstance(memory_manager_cycle_by_agent_schedule(ctx), dg.SkipReason)
        instance.add_dynamic_partitions("memory_agents", ["alpha", "beta"])
        with dg.build_schedule_context(instance=instance, scheduled_execution_time=tick) as ctx:
            requests = memory_manager_cycle_by_agent_schedule(ctx)
        assert [r.partition_key for r in requests] == ["alpha", "beta"]
        assert len({r.run_key for r in requests}) == 2
        with open_service(dagster_home, clock=None) as svc:
            phases.maintenance_run.record_maintenance(svc.context, "m-beta", "time", svc.now(), {}, partition="beta")
        with dg.build_sensor_context(instance=instance, resources={"memory": resource}) as sctx:
            runs = memory_maintenance_by_agent_trigger(sctx)
        assert [r.partition_key for r in runs] == ["alpha"]  # beta was just maintained
        assert runs[0].tags["memory/maintenance_trigger"] == "time"
        assert runs[0].run_key.startswith("maintenance:alpha:never:time:")
