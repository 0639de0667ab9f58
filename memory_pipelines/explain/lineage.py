"""Step 4: how a note got there and what happened to it since: the lifecycle markers of
its comments, the ``Memory Write`` audit steps naming it, its injections, its origin and
its merge lineage both ways."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from memory_pipelines.context import MemoryContext
from memory_pipelines.explain.models import LifecycleEvent, Lineage, WriteRecord
from memory_pipelines.notes import AuthorType, Note
from memory_pipelines.store import eq, in_

#: the audit step every in-flight write records (memory_pipelines.writes.STEP_NAME)
WRITE_STEP_NAME = "Memory Write"
_LINEAGE_DEPTH = 20
_SOURCES_CAP = 200

_ID = r"[0-9A-Za-z][\w.:-]*"
_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("extracted", re.compile(r"Extracted by the Memory Manager from (?P<detail>.+?) \(confidence")),
    ("consolidated-from", re.compile(r"Consolidated from (?P<detail>\d+ notes: [^\[]*)")),
    (
        "hardening-duplicate",
        re.compile(rf"\[Hardening: duplicate of (?P<id>{_ID}) — (?P<detail>[^\]]*)\]"),
    ),
    ("consolidated-into", re.compile(rf"Consolidated into note (?P<id>{_ID}): (?P<detail>[^\[]*)")),
    (
        "contradiction-revoked",
        re.compile(
            rf"\[Contradiction resolved: superseded by note (?P<id>{_ID})\. ?(?P<detail>[^\]]*)\]"
        ),
    ),
    (
        "contradiction-flagged",
        re.compile(
            rf"\[Contradiction flagged: conflicts with note (?P<id>{_ID})\. ?(?P<detail>[^\]]*)\]"
        ),
    ),
    (
        "superseded-by-extraction",
        re.compile(
            r"Superseded: contradiction detected, replaced by new note from (?P<detail>[^\[]*)"
        ),
    ),
    (
        "merge-conflict-kept",
        re.compile(rf"\[Merge-target conflict: new note (?P<id>{_ID}) (?P<detail>[^\]]*)\]"),
    ),
    ("archived-expired", re.compile(r"\[Archived by Memory Manager: expired on (?P<at>[^\]]+)\]")),
    (
        "archived-decay",
        re.compile(
            r"\[Archived by Memory Manager: ImportanceScore decayed to (?P<detail>[^\]]*)\]"
        ),
    ),
    (
        "archived-stale",
        re.compile(
            r"\[Archived by Memory Manager: stale reference pruning - (?P<detail>.*?) on (?P<at>\S+)\]"
        ),
    ),
    (
        "promoted-protected",
        re.compile(r"\[Auto-(?:promoted to Protected|protected): (?P<detail>[^\]]*)\]"),
    ),
)
#: markers that change the note's status (their time is the note's last update)
_STATUS_MARKERS = frozenset(
    {
        "hardening-duplicate",
        "consolidated-into",
        "contradiction-revoked",
        "superseded-by-extraction",
        "archived-expired",
        "archived-decay",
        "archived-stale",
    }
)


def _parse_at(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None


def parse_events(note: Note) -> list[LifecycleEvent]:
    """The audit markers of the note's comments, in the order they were appended."""
    comments = note.comments or ""
    found: list[tuple[int, LifecycleEvent]] = []
    for kind, pattern in _MARKERS:
        for m in pattern.finditer(comments):
            groups = m.groupdict()
            related = groups.get("id")
            if kind == "superseded-by-extraction":
                related = note.consolidated_into_note_id
            detail = (groups.get("detail") or m.group(0)).strip().rstrip(".")
            if kind == "archived-expired":
                detail = f"expired on {groups['at']}"
            found.append(
                (
                    m.start(),
                    LifecycleEvent(
                        kind=kind,
                        detail=detail,
                        related_note_id=related,
                        at=_parse_at(groups.get("at")),
                    ),
                )
            )
    found.sort(key=lambda x: x[0])
    events = [e for _, e in found]
    last_status = max((i for i, e in enumerate(events) if e.kind in _STATUS_MARKERS), default=None)
    if last_status is not None and events[last_status].at is None:
        events[last_status] = events[last_status].model_copy(update={"at": note.updated_at})
    return events

def write_records(mem: MemoryContext, note_ids: Sequence[str]) -> dict[str, list[WriteRecord]]:
    """``Memory Write`` audit steps whose output ``noteId`` is one of ``note_ids``."""
    if not note_ids:
        return {}
    out: dict[str, list[WriteRecord]] = {}
    for step in mem.sources.steps_naming_notes(WRITE_STEP_NAME, note_ids):
        output = step["output_json"]
        output = output if isinstance(output, dict) else {}
        out.setdefault(step["note_id"], []).append(
            WriteRecord(
                run_id=step["run_id"],
                disposition=output.get("disposition"),
                reason=output.get("reason"),
                final_scope=output.get("finalScope"),
                status=step["status"],
                at=step["finished_at"],
            )
        )
    return out


def injection_counts(mem: MemoryContext, note_ids: Sequence[str]) -> dict[str, tuple[int, datetime | None]]:
    """How often each note was injected, and when last (``injection_events``)."""
    if not note_ids:
        return {}
    return mem.sources.injection_counts(note_ids, "note")


def origin_of(note: Note, events: Sequence[LifecycleEvent], writes: Sequence[WriteRecord]) -> str:
    if note.author_type == AuthorType.AGENT.value:
        created = next((w for w in writes if w.disposition in ("written", "superseded-own")), None)
        how = f" (disposition {created.disposition})" if created else ""
        return f"written in flight by the agent in run {note.source_run_id}{how}"
    if note.author_type == AuthorType.MEMORY_MANAGER.value:
        if note.derived_from_note_ids:
            return (
                f"consolidated by the Memory Manager from {len(note.derived_from_note_ids)} notes "
                f"(generation {note.consolidation_count})"
            )
        extracted = next((e for e in events if e.kind == "extracted"), None)
        if extracted:
            return f"extracted by the Memory Manager from {extracted.detail}"
        source = note.source_conversation_id or note.source_run_id
        return "created by the Memory Manager" + (f" from {source}" if source else "")
    return "added manually (author User)"


def lineage_of(mem: MemoryContext, note: Note) -> Lineage:
    """``consolidated_into`` followed to the survivor; sources followed back (both
    ``derived_from_note_ids`` and notes whose ``consolidated_into`` is this note)."""
    table = mem.store.notes
    chain: list[str] = []
    survivor: Note | None = None
    seen = {note.id}
    nxt = note.consolidated_into_note_id
    while nxt and nxt not in seen and len(chain) < _LINEAGE_DEPTH:
        chain.append(nxt)
        seen.add(nxt)
        survivor = table.get(nxt)
        nxt = survivor.consolidated_into_note_id if survivor else None
    absorbed = table.scan(eq("consolidated_into_note_id", note.id), columns=["id"])["id"].tolist()
    sources: list[str] = []
    frontier = list(dict.fromkeys([*(note.derived_from_note_ids or []), *absorbed]))
    visited = {note.id}
    while frontier and len(sources) < _SOURCES_CAP:
        ids = [i for i in frontier if i not in visited]
        visited.update(ids)
        sources.extend(ids)
        if not ids:
            break
        rows = table.get_many(ids)
        more = table.scan(in_("consolidated_into_note_id", ids), columns=["id"])["id"].tolist()
        frontier = [*(d for r in rows for d in (r.derived_from_note_ids or [])), *more]
    return Lineage(
        merged_into=chain,
        survivor_id=chain[-1] if chain else None,
        survivor_status=str(survivor.status)
        if chain and survivor
        else ("missing" if chain else None),
        derived_from=list(note.derived_from_note_ids or []),
        absorbed=absorbed,
        all_sources=sources[:_SOURCES_CAP],
    )
