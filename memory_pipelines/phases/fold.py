"""The injection fold, first phase of a cycle (reference §4.5 access statistics): the
``injection_events`` the read path records become ``access_count`` / ``last_accessed_at``
on notes and examples, exactly once per event."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.notes import new_id, utc
from memory_pipelines.partitions import in_partition, partition_of, state_key
from memory_pipelines.phases import audit
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.reports import PhaseReport

# manager_state keys
FOLD_CURSOR = "injection_fold_cursor"
FOLD_PENDING = "injection_fold_pending"


@exclusive_phase
def run(
    mem: MemoryContext, run_id: str | None = None, partition: str | None = None
) -> PhaseReport:
    """Fold ``injection_events`` newer than the fold cursor into access statistics.

    Reads: ``injection_events`` (id > the fold cursor; this process's buffered events
    are flushed first), the notes and examples they name. Writes: ``access_count`` += number of events and ``last_accessed_at`` =
    the latest ``injected_at`` on each item; the cursor. Guarantees exactly-once: the
    absolute new values of a batch are written to the pending intent before the
    items are updated, and the cursor advances and the intent is cleared in one SQL
    transaction afterwards; a crash in between re-applies the same absolute values.
    With a ``partition``, only that partition's items are folded, under its own
    cursor (effective: the later of its own and the whole-pool one); the whole-pool
    fold skips the events a partition fold already counted.
    (The store has no atomic increment: a concurrent change to the same item's
    access count between reading and applying a batch is overwritten.)
    """
    run_id = run_id or new_id()
    started = mem.now()
    cursor_key = state_key(FOLD_CURSOR, partition)
    pending_key = state_key(FOLD_PENDING, partition)
    report = PhaseReport(
        {"eventsFolded": 0, "notesTouched": 0, "examplesTouched": 0, "recovered": 0}
    )
    mem.sources.flush_injection_events()  # this process's buffered attribution counts too
    pending = mem.sources.get_state(pending_key)
    if pending:
        _apply_fold(mem, pending, report, cursor_key, pending_key)
        report["recovered"] = 1
    # the whole-pool fold skips what partition folds already counted
    folded = _partition_fold_cursors(mem) if partition is None else {}
    while True:
        cursor = _fold_cursor(mem, partition)
        rows = mem.sources.injection_events_after(cursor, mem.manager_config.fold_batch_size)
        if not rows:
            break
        intent = _fold_intent(mem, rows, partition, folded)
        mem.sources.set_state(pending_key, intent)
        _apply_fold(mem, intent, report, cursor_key, pending_key)
        report["eventsFolded"] += len(rows)
        if len(rows) < mem.manager_config.fold_batch_size:
            break
    audit.step(
        mem,
        run_id,
        "Decision",
        "Fold Injection Events",
        {"cursor": _fold_cursor(mem, partition)} | audit.partition_field(partition),
        dict(report),
        started_at=started,
    )
    audit.remember(mem, "fold", run_id, started, report, partition)
    return report


def _fold_cursor(mem: MemoryContext, partition: str | None) -> int:
    """The last event id folded for ``partition`` (the whole pool for ``None``)."""
    whole = int(mem.sources.get_state(FOLD_CURSOR, 0) or 0)
    if partition is None:
        return whole
    own = int(mem.sources.get_state(state_key(FOLD_CURSOR, partition), 0) or 0)
    return max(whole, own)


def _partition_fold_cursors(mem: MemoryContext) -> dict[str, int]:
    """Every partition's own fold cursor (partitions never folded are absent)."""
    prefix = state_key(FOLD_CURSOR, "")
    rows = mem.sources.states_with_prefix(prefix).items()
    return {k[len(prefix) :]: int(v or 0) for k, v in rows if k.startswith(prefix)}


def _fold_intent(
    mem: MemoryContext, rows: Sequence[Any], partition: str | None, folded: Mapping[str, int]
) -> dict[str, Any]:
    """The absolute access values a batch of events leads to, for the items of
    ``partition`` (every item for ``None``, minus the events up to ``folded[p]``
    that partition ``p``'s own fold already counted)."""
    per_kind: dict[str, dict[str, list[tuple[int, datetime]]]] = {"note": {}, "example": {}}
    for event_id, kind, item_id, injected_at in rows:
        per_kind.setdefault(kind, {}).setdefault(item_id, []).append(
            (int(event_id), utc(injected_at))
        )
    intent: dict[str, Any] = {"end_id": int(rows[-1][0]), "notes": {}, "examples": {}}
    for kind, table, out in (
        ("note", mem.store.notes, intent["notes"]),
        ("example", mem.store.examples, intent["examples"]),
    ):
        wanted = per_kind.get(kind, {})
        for item in table.get_many(list(wanted)):
            if not in_partition(item.agent_id, partition):
                continue
            done = folded.get(partition_of(item.agent_id), 0)
            events = [(i, when) for i, when in wanted[item.id] if i > done]
            if not events:
                continue
            when = max(w for _, w in events)
            last = (
                item.last_accessed_at
                if item.last_accessed_at and item.last_accessed_at > when
                else when
            )
            out[item.id] = [item.access_count + len(events), last.isoformat()]
    return intent


def _apply_fold(
    mem: MemoryContext, intent: Mapping[str, Any], report: PhaseReport, cursor_key: str, pending_key: str
) -> None:
    notes = mem.store.notes.get_many(list(intent.get("notes", {})))
    if notes:
        mem.notebook.update_notes(
            (
                (
                    n,
                    {
                        "access_count": intent["notes"][n.id][0],
                        "last_accessed_at": utc(intent["notes"][n.id][1]),
                    },
                )
                for n in notes
            ),
            event=None,  # access counts are not lifecycle changes
        )
    examples = mem.store.examples.get_many(list(intent.get("examples", {})))
    if examples:
        mem.notebook.save_examples(
            [
                e.model_copy(
                    update={
                        "access_count": intent["examples"][e.id][0],
                        "last_accessed_at": utc(intent["examples"][e.id][1]),
                    }
                )
                for e in examples
            ]
        )
    report["notesTouched"] += len(notes)
    report["examplesTouched"] += len(examples)
    mem.sources.set_states({cursor_key: int(intent["end_id"]), pending_key: None})
