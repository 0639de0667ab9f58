"""What an operator and an analyst read in Dagster: the asset graph as data flow (SQL
sources -> extraction -> hardening -> note table -> maintenance), source data versions
that move with new rated messages and runs, one trigger per job and none running by default, snake_case metadata with
no ``nan``/``None`` placeholders. Real Dagster executor and instances throughout."""

from __future__ import annotations

import re

import dagster as dg
import pytest
from factories import ALICE_NOTE, seed_acme

from memory_pipelines.assets.common import preview_markdown, snake_case
from memory_pipelines.assets.sources import AGENT_RUNS, RATED_CONVERSATIONS
from memory_pipelines.definitions import defs
from memory_pipelines.resources.memory_api import MemoryApiResource

#: The asset keys every deployment relies on (they never change names).
PHASE_KEYS = [
    "extracted_notes",
    "extracted_examples",
    "hardened_notes",
    "note_importance",
    "consolidated_notes",
    "resolved_contradictions",
    "pruned_notes",
    "decayed_notes",
    "compacted_note_tables",
    "note_inventory",
]
SNAKE = re.compile(r"^[a-z0-9_]+(/[a-z0-9_]+)?$")


@pytest.fixture
def seeded(open_service):
    """A home with a rated conversation, an agent-written provisional note and a
    company-wide provisional note (no agent, no user: the preview must not say nan)."""
    with open_service() as s:
        seed_acme(s)
        s.add_note("Alice deploys on Tuesdays", **ALICE_NOTE)
        s.add_note(
            "Acme's offices close on Fridays", status="Provisional", author_type="Agent",
            company_id="acme",
        )  # fmt: skip
        yield s


def _resource(home) -> MemoryApiResource:
    return MemoryApiResource(home=str(home), embedding_model="hash")


def _path_exists(graph, start: str, end: str) -> bool:
    """Whether ``end`` is downstream of ``start`` in the asset graph."""
    seen, todo = set(), [dg.AssetKey.from_user_string(start)]
    while todo:
        key = todo.pop()
        if key == dg.AssetKey.from_user_string(end):
            return True
        if key not in seen:
            seen.add(key)
            todo.extend(graph.get(key).child_keys)
    return False


def test_the_asset_graph_reads_as_data_flow():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert set(PHASE_KEYS) <= keys
    for source in (RATED_CONVERSATIONS, AGENT_RUNS):
        node = graph.get(source)
        assert node.is_observable and not node.is_materializable
        assert node.group_name == "memory_sources" and node.kinds == {"sql"}
        assert node.description and "data version" in " ".join(node.description.split())
    parents = {k: {p.to_user_string() for p in graph.get(dg.AssetKey(k)).parent_keys} for k in
               ("extracted_notes", "extracted_examples", "note_table", "note_importance")}  # fmt: skip
    assert parents == {
        "extracted_notes": {"rated_conversations", "agent_runs"},
        "extracted_examples": {"rated_conversations"},
        "note_table": {"hardened_notes"},
        "note_importance": {"note_table"},
    }
    table = graph.get(dg.AssetKey("note_table"))
    assert table.kinds == {"lancedb", "table"} and table.group_name == "memory_manager"
    # sources -> extraction -> hardening -> note table -> maintenance -> inventory
    chain = ["agent_runs", "extracted_notes", "hardened_notes", "note_table",
             "note_importance", "decayed_notes", "note_inventory"]  # fmt: skip
    for upstream, downstream in zip(chain, chain[1:], strict=False):
        assert _path_exists(graph, upstream, downstream), (upstream, downstream)
    # the per-agent family reads the same sources and has its own maintenance chain
    assert _path_exists(graph, "rated_conversations", "by_agent/hardened_notes")
    assert _path_exists(graph, "by_agent/hardened_notes", "by_agent/decayed_notes")
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"memory_manager_cycle", "memory_maintenance"} <= jobs


def _observe(home, instance: dg.DagsterInstance) -> dict[dg.AssetKey, str]:
    """Observe both sources through a real job run; their data versions."""
    job = dg.Definitions(
        assets=[a for a in defs.assets if getattr(a, "key", None) in (RATED_CONVERSATIONS, AGENT_RUNS)],
        jobs=[dg.define_asset_job("observe", dg.AssetSelection.assets(RATED_CONVERSATIONS, AGENT_RUNS))],
        resources={"memory": _resource(home)},
    ).resolve_job_def("observe")  # fmt: skip
    assert job.execute_in_process(instance=instance).success
    return {
        key: instance.get_latest_data_version_record(key).asset_observation.tags[
            "dagster/data_version"
        ]
        for key in (RATED_CONVERSATIONS, AGENT_RUNS)
    }


def test_source_data_versions_move_with_new_rated_messages_and_runs(seeded, home, clock):
    instance = dg.DagsterInstance.ephemeral()
    first = _observe(home, instance)
    assert _observe(home, instance) == first  # nothing new: the same versions
    clock.advance(minutes=1)
    seeded.add_message("c1", "m3", "assistant", "Anything else?")  # unrated: not mined
    assert _observe(home, instance) == first
    seeded.add_message("c1", "m4", "user", "Thanks, perfect.", rating=10)
    second = _observe(home, instance)
    assert second[RATED_CONVERSATIONS] != first[RATED_CONVERSATIONS]
    assert second[AGENT_RUNS] == first[AGENT_RUNS]
    seeded.add_agent_run("r1", "helper", user_id="alice", company_id="acme")
    third = _observe(home, instance)
    assert third[AGENT_RUNS] != second[AGENT_RUNS]
    record = instance.get_latest_data_version_record(RATED_CONVERSATIONS)
    meta = record.asset_observation.metadata
    assert meta["rated_messages"].value == 2 and meta["rated_conversations"].value == 1


def test_the_cycle_job_observes_its_sources_and_records_the_note_table(seeded, home):
    instance = dg.DagsterInstance.ephemeral()
    result = defs.resolve_job_def("memory_manager_cycle").execute_in_process(
        instance=instance, resources={"memory": _resource(home)}
    )
    assert result.success
    observed = {e.asset_key for e in result.get_asset_observation_events()}
    assert observed == {RATED_CONVERSATIONS, AGENT_RUNS}
    assert instance.get_latest_data_version_record(RATED_CONVERSATIONS) is not None
    table = instance.get_latest_materialization_event(dg.AssetKey("note_table"))
    meta = table.asset_materialization.metadata
    assert meta["dagster/row_count"].value == 3  # two hardened + one extracted note
    assert meta["note_table_version"].value >= 1
    statuses = {r.data["status"]: r.data["notes"] for r in meta["notes_by_status"].records}
    assert statuses == {"Active": 3}


def test_metadata_is_snake_case_and_previews_show_no_nan(seeded, home):
    result = defs.resolve_job_def("memory_manager_cycle").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), resources={"memory": _resource(home)}
    )
    assert result.success
    events = result.get_asset_materialization_events() + result.get_asset_observation_events()
    for event in events:
        data = event.event_specific_data
        metadata = (data.materialization if hasattr(data, "materialization") else
                    data.asset_observation).metadata  # fmt: skip
        bad = [k for k in metadata if not SNAKE.match(k)]
        assert not bad, (event.asset_key, bad)
        for key, value in metadata.items():
            if isinstance(value, dg.MarkdownMetadataValue):
                cells = re.findall(r"\|\s*([^|\n]*?)\s*(?=\|)", value.value)
                assert "nan" not in cells and "None" not in cells, (key, value.value)
    hardened = next(
        e.materialization.metadata
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey("hardened_notes")
    )
    assert hardened["hardened"].value == 2 and hardened["provisional_count"].value == 2
    assert "Acme's offices close on Fridays" in hardened["preview"].value


def test_snake_case_and_blank_cells():
    assert snake_case("notesFragmentsAfter") == "notes_fragments_after"
    assert snake_case("provisionalCount") == "provisional_count"
    assert snake_case("fold_eventsFolded") == "fold_events_folded"
    assert snake_case("note_table_version") == "note_table_version"
    text = preview_markdown([{"id": "n1", "agent_id": None, "user_id": float("nan"), "note": "x"}])
    assert "nan" not in text and "None" not in text and "| n1 " in text


def test_one_trigger_per_job_and_none_runs_by_default():
    triggers: dict[str, list[str]] = {}
    for schedule in defs.schedules or []:
        triggers.setdefault(schedule.job_name, []).append(schedule.name)
        assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED, schedule.name
    for sensor in defs.sensors or []:
        assert sensor.default_status == dg.DefaultSensorStatus.STOPPED, sensor.name
        for job in sensor.jobs if sensor.has_jobs else []:
            triggers.setdefault(job.name, []).append(sensor.name)
    assert triggers["memory_manager_cycle"] == ["memory_manager_cycle_every_15_minutes"]
    assert triggers["memory_maintenance"] == ["memory_maintenance_trigger"]
    assert all(len(names) == 1 for names in triggers.values()), triggers
    # no asset asks the automation daemon to run it either
    graph = defs.resolve_asset_graph()
    assert all(graph.get(k).automation_condition is None for k in graph.get_all_asset_keys())


def test_pyproject_and_workspace_name_the_same_code_location():
    """`dagster dev` (reads [tool.dagster]), `dg dev` ([tool.dg]) and `dagster dev -w
    workspace.yaml` load the same module, attribute and location name."""
    import tomllib
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]
    [entry] = yaml.safe_load((root / "workspace.yaml").read_text())["load_from"]
    workspace = entry["python_module"]
    assert tool["dagster"] == {
        "module_name": workspace["module_name"],
        "attribute": workspace["attribute"],
        "code_location_name": workspace["location_name"],
    }
    assert tool["dg"]["directory_type"] == "project"
    project = tool["dg"]["project"]
    assert project["code_location_target_module"] == workspace["module_name"]
    assert project["code_location_name"] == workspace["location_name"]
