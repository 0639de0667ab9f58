"""Asset checks: the properties later phases rely on, one property per check."""

import dagster as dg

from memory_pipelines.assets.common import preview_markdown
from memory_pipelines.assets.extraction import extracted_notes
from memory_pipelines.assets.hardening import hardened_notes
from memory_pipelines.assets.inventory import note_inventory
from memory_pipelines.inventory import (
    dangling_lineage,
    events_without_notes,
    hardened_with_expiry,
    vector_problems,
)
from memory_pipelines.resources.memory_api import MemoryApiResource


@dg.asset_check(asset=extracted_notes, blocking=True)
def injectable_notes_have_vectors(memory: MemoryApiResource) -> dg.AssetCheckResult:
    """Every injectable note has a finite, non-zero vector of the embedder's dimension
    (hardening, dedupe and injection all search these vectors)."""
    svc = memory.get_service()
    bad = vector_problems(svc)
    return dg.AssetCheckResult(
        passed=bad.empty,
        metadata={
            "bad_vectors": len(bad),
            "embedder_dim": svc.embedder.dim,
            "embedder": svc.embedder.model_id,
            "examples": dg.MetadataValue.md(preview_markdown(bad.head(20))),
        },
    )


@dg.asset_check(asset=hardened_notes, blocking=True)
def hardened_notes_have_no_expiry(memory: MemoryApiResource) -> dg.AssetCheckResult:
    """No Active agent-authored (hardened) note still carries an expiry; otherwise TTL
    maintenance would archive a confirmed note."""
    bad = hardened_with_expiry(memory.get_service())
    return dg.AssetCheckResult(
        passed=bad.empty,
        metadata={
            "notes_with_expiry": len(bad),
            "examples": dg.MetadataValue.md(preview_markdown(bad.head(20))),
        },
    )


@dg.asset_check(asset=hardened_notes)
def lineage_points_at_existing_notes(memory: MemoryApiResource) -> dg.AssetCheckResult:
    """``consolidated_into_note_id`` and ``derived_from_note_ids`` name existing notes."""
    bad = dangling_lineage(memory.get_service())
    return dg.AssetCheckResult(
        passed=bad.empty,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "dangling_references": len(bad),
            "examples": dg.MetadataValue.md(preview_markdown(bad.head(20))),
        },
    )


@dg.asset_check(asset=note_inventory)
def events_name_existing_notes(memory: MemoryApiResource) -> dg.AssetCheckResult:
    """Every lifecycle event names a note the note table holds (purge and erase delete a
    note's events with it; an event of a missing note is a write that went astray)."""
    bad = events_without_notes(memory.get_service())
    return dg.AssetCheckResult(
        passed=bad.empty,
        metadata={
            "missing_notes": len(bad),
            "examples": dg.MetadataValue.md(preview_markdown(bad.head(20))),
        },
    )
