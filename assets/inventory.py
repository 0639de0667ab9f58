"""Inventory asset: a pandas view of the note pool and of what the last maintenance did."""

import base64
from pathlib import Path

import dagster as dg

from memory_pipelines.assets.common import ANALYST_GROUP, OWNERS, frame_markdown
from memory_pipelines.assets.decay import decayed_notes
from memory_pipelines.phases.maintenance_run import maintenance_inventory
from memory_pipelines.plots import agent_breakdown, decay_curves, importance_histogram, plot_dir
from memory_pipelines.resources.memory_api import MemoryApiResource


@dg.asset(
    group_name=ANALYST_GROUP,
    kinds={"lancedb", "pandas"},
    owners=OWNERS,
    tags={"phase": "inventory", "writes": "nothing"},
    deps=[decayed_notes],
)
def note_inventory(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """The note pool at a glance, for analysts: read-only.

    Counts of notes by status, protection tier, type, author and agent (and the agent x
    status matrix), the importance distribution of injectable notes, and per
    maintenance phase the run, time, counts and actions of the last maintenance and the
    lifecycle events it recorded by phase and kind, each as a markdown table in the
    materialization metadata; plus the per-agent status/type
    breakdown and two plots (the importance histogram of Active notes and the decay
    curves per tier), each inlined as a markdown image so an operator on another machine
    sees it in the UI (the PNG files stay in ``<home>/plots``). Missing values show as
    blank cells.
    """
    svc = memory.get_service()
    frames = maintenance_inventory(svc.context)
    metadata: dict[str, dg.MetadataValue] = {}
    for name, frame in frames.items():
        metadata[name] = dg.MetadataValue.md(frame_markdown(frame, index=name == "agent_status"))
    by_status = frames["by_status"]
    total = int(by_status["notes"].sum()) if not by_status.empty else 0
    metadata["total_notes"] = dg.MetadataValue.int(total)
    metadata["note_table_version"] = dg.MetadataValue.int(svc.store.notes.version)
    events = frames["last_maintenance_events"]
    metadata["last_maintenance_event_count"] = dg.MetadataValue.int(
        int(events["events"].sum()) if not events.empty else 0
    )
    breakdown = agent_breakdown(svc)
    metadata["agent_breakdown"] = dg.MetadataValue.md(frame_markdown(breakdown, index=True))
    folder = plot_dir(svc)
    for name, png in (
        ("importance_histogram", importance_histogram(svc, folder / "importance_histogram.png")),
        ("decay_curves", decay_curves(folder / "decay_curves.png")),
    ):
        metadata[f"{name}_plot"] = dg.MetadataValue.md(_inline_png(name, png))
    context.log.info("inventory of %s notes", total)
    return dg.MaterializeResult(metadata=metadata)


def _inline_png(name: str, png: Path) -> str:
    """A markdown image with the PNG inlined as base64 (the UI shows it without files)."""
    data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    return f"![{name}](data:image/png;base64,{data})"
