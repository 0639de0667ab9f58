"""Hardening, the last cycle phase (reference §4.5): provisional agent-written notes are
promoted to Active, or a true duplicate is archived into the Active note it repeats. A
judge that cannot decide leaves the note Provisional (never archives on a failure;
reference defect 6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import JudgeError
from memory_pipelines.judge import reads_as_instruction
from memory_pipelines.note_events import Actor, EventKind, NoteEvent, note_event
from memory_pipelines.notes import AuthorType, Note, NoteStatus, append_comment, new_id
from memory_pipelines.partitions import note_filter
from memory_pipelines.phases import audit
from memory_pipelines.phases.common import scope_triple
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.scope import exact_scope
from memory_pipelines.store import and_, eq
from memory_pipelines.store import or_ as cond_or

#: The comment hardening appends to a provisional note it revokes as steering text.
REVOKED_INSTRUCTION = "revoked — reads as an instruction to the assistant, not a fact"

PHASE = "hardening"
RULE_PROMOTE = "hardening-promote"
RULE_DEDUPE = "hardening-dedupe"
RULE_INSTRUCTION = "hardening-instruction"


@dataclass
class _ScopePool:
    """The Active notes of one exact scope and their unit vectors (exact cosine search)."""

    notes: list[Note] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)

    def add(self, note: Note, vector: np.ndarray) -> None:
        v = np.asarray(vector, dtype=np.float32)
        norm = float(np.linalg.norm(v))
        self.notes.append(note)
        self.vectors.append(v / norm if norm > 0 else v)

    def nearest(
        self, vector: np.ndarray, k: int, min_similarity: float
    ) -> list[tuple[Note, float]]:
        """Up to ``k`` notes at cosine ≥ ``min_similarity``, most similar first."""
        if not self.notes:
            return []
        q = np.asarray(vector, dtype=np.float32)
        q = q / (float(np.linalg.norm(q)) or 1.0)
        sims = np.stack(self.vectors) @ q
        order = np.argsort(-sims, kind="stable")[:k]
        return [(self.notes[i], float(sims[i])) for i in order if sims[i] >= min_similarity]


@dataclass
class _Pools:
    by_scope: dict[tuple[str | None, str | None, str | None], _ScopePool]

    def __getitem__(self, scope: tuple[str | None, str | None, str | None]) -> _ScopePool:
        return self.by_scope[scope]

    def _find(self, note_id: str) -> tuple[_ScopePool, int]:
        for pool in self.by_scope.values():
            for i, n in enumerate(pool.notes):
                if n.id == note_id:
                    return pool, i
        raise KeyError(note_id)

    def note(self, note_id: str) -> Note:
        pool, i = self._find(note_id)
        return pool.notes[i]

    def vector(self, note_id: str) -> np.ndarray:
        pool, i = self._find(note_id)
        return pool.vectors[i]


@dataclass
class _Outcomes:
    """The decided outcome of each note (in decision order), the details of its event,
    and the Active notes the archived duplicates reinforce."""

    outcome: dict[str, tuple[Note, str]] = field(default_factory=dict)
    why: dict[str, dict] = field(default_factory=dict)  # note id -> event related/details
    reinforced: dict[str, list[str]] = field(default_factory=dict)  # Active id -> duplicates

    def decide(self, after: Note, action: str, why: dict) -> None:
        self.outcome[after.id] = (after, action)
        self.why[after.id] = why


@exclusive_phase
def run(mem: MemoryContext, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
    """Promote provisional agent-written notes, or archive the true duplicates.

    Reads: up to 200 oldest Provisional notes with author Agent and the Active notes
    of exactly their scopes (agent, user, company). For each candidate in order, the
    Active notes of its scope at cosine ≥ 0.85 (exact search, itself excluded) go to
    the judge. Writes: the note becomes Active with no expiry, or Archived with
    ``consolidated_into_note_id`` = the best match, which gets access_count + 1 and
    last_accessed_at = now. Guarantees: sequential, each promotion joins the Active
    set before the next check, so paraphrases within one batch consolidate; the
    outcomes are saved in one upsert (a crash saves nothing and the rerun decides
    the same); a judge failure leaves the note Provisional (``failed``). A note that
    reads as an instruction to the assistant (steering text, a role prefix or prompt
    markup) is Revoked with a comment, never promoted. With a
    ``partition``, only that partition's provisional notes (their scopes are in it).
    """
    run_id = run_id or new_id()
    started = mem.now()
    report = PhaseReport({"hardened": 0, "deduped": 0, "failed": 0, "provisionalCount": 0})
    notes, vectors = _provisional(mem, partition)
    report["provisionalCount"] = len(notes)
    pools = _active_pools(mem, {scope_triple(n) for n in notes})
    decided = _Outcomes()
    for note in notes:
        _decide(mem, note, vectors[note.id], pools, decided, report)
    _reinforce(decided, pools, mem.now())
    _save(mem, notes, vectors, pools, decided, run_id, report)
    _record(mem, run_id, started, report, partition)
    return report


def _provisional(mem: MemoryContext, partition: str | None) -> tuple[list[Note], dict]:
    """The oldest Provisional agent-written notes (at most ``hardening_max_notes``) and
    their vectors by id."""
    table = mem.store.notes
    index = table.scan(
        and_(
            eq("status", NoteStatus.PROVISIONAL),
            eq("author_type", AuthorType.AGENT),
            note_filter(partition),
        ),
        columns=["id", "created_at"],
    )
    limit = mem.manager_config.hardening_max_notes
    ids = index.sort_values(["created_at", "id"]).head(limit)["id"].tolist() if len(index) else []
    return table.get_many(ids), table.vectors(ids)


def _decide(
    mem: MemoryContext,
    note: Note,
    vector: np.ndarray,
    pools: _Pools,
    decided: _Outcomes,
    report: PhaseReport,
) -> None:
    """Decide one provisional note: revoke steering text; archive a duplicate the judge
    finds among the Active notes of its scope; otherwise promote it (it joins the pool
    before the next note is checked). A judge failure leaves it Provisional."""
    if reads_as_instruction(note.note):  # steering text is never promoted
        _revoke_instruction(note, decided)
        report.extra.setdefault("revoked", []).append(note.id)
        return
    pool = pools[scope_triple(note)]
    cfg = mem.manager_config
    hits = pool.nearest(vector, cfg.note_dedupe_k, cfg.hardening_similarity)
    decision = None
    if hits:
        try:
            decision = mem.judge.is_duplicate(note.note, [h for h, _ in hits])
        except JudgeError as e:
            report["failed"] += 1
            report.extra.setdefault("failures", []).append({"id": note.id, "error": str(e)})
            return
    if decision is not None and not decision.should_add:
        _archive_duplicate(note, *hits[0], decision.reason, decided)
        report["deduped"] += 1
        return
    promoted = note.model_copy(update={"status": NoteStatus.ACTIVE.value, "expires_at": None})
    decided.decide(
        promoted,
        "hardened",
        {
            "rule": RULE_PROMOTE,
            "reason": decision.reason if decision is not None else "no near-duplicate",
        },
    )
    pool.add(promoted, vector)
    report["hardened"] += 1


def _revoke_instruction(note: Note, decided: _Outcomes) -> None:
    """Revoke a note that reads as steering text, with a comment saying so."""
    comment = f"[Hardening: {REVOKED_INSTRUCTION}]"
    revoked = note.model_copy(
        update={
            "status": NoteStatus.REVOKED.value,
            "comments": append_comment(note.comments, comment),
        }
    )
    decided.decide(
        revoked,
        "revoked-instruction",
        {"rule": RULE_INSTRUCTION, "reason": REVOKED_INSTRUCTION},
    )


def _archive_duplicate(
    note: Note, best: Note, similarity: float, reason: str, decided: _Outcomes
) -> None:
    """Archive a true duplicate into the Active note it repeats (which it reinforces)."""
    comment = f"[Hardening: duplicate of {best.id} — {reason}]"
    archived = note.model_copy(
        update={
            "status": NoteStatus.ARCHIVED.value,
            "consolidated_into_note_id": best.id,
            "comments": append_comment(note.comments, comment),
        }
    )
    decided.decide(
        archived,
        "archived-duplicate",
        {
            "related": [best.id],
            "rule": RULE_DEDUPE,
            "reason": reason,
            "similarity": round(similarity, 6),
        },
    )
    decided.reinforced.setdefault(best.id, []).append(note.id)


def _reinforce(decided: _Outcomes, pools: _Pools, now: datetime) -> None:
    """Each Active note duplicates were archived into gets one access per duplicate."""
    outcome, why = decided.outcome, decided.why
    for hit_id, dups in decided.reinforced.items():
        base, action = outcome.get(hit_id) or (pools.note(hit_id), "reinforced")
        outcome[hit_id] = (
            base.model_copy(
                update={"access_count": base.access_count + len(dups), "last_accessed_at": now}
            ),
            action,
        )
        why.setdefault(hit_id, {"rule": RULE_DEDUPE})
        why[hit_id].update(related=dups, reinforced_by=dups)


def _save(
    mem: MemoryContext,
    notes: list[Note],
    vectors: dict,
    pools: _Pools,
    decided: _Outcomes,
    run_id: str,
    report: PhaseReport,
) -> None:
    """Save every outcome in one upsert, with its event."""
    outcome = decided.outcome
    if not outcome:
        return
    before = {n.id: n for n in notes}
    saved = mem.notebook.save_notes(
        [n for n, _ in outcome.values()],
        np.stack([pools.vector(i) if i not in vectors else vectors[i] for i in outcome]),
        events=[
            _event(before.get(i) or pools.note(i), after, action, run_id, decided.why[i])
            for i, (after, action) in outcome.items()
        ],
    )
    for n, (_, action) in zip(saved, outcome.values(), strict=True):
        report.note_changed(n, action)


def _record(
    mem: MemoryContext, run_id: str, started: datetime, report: PhaseReport, partition: str | None
) -> None:
    """The phase's audit step (Failed when a judge call failed) and its run record."""
    audit.step(
        mem,
        run_id,
        "Decision",
        "Harden Provisional Notes",
        {"maxNotesPerRun": mem.manager_config.hardening_max_notes},
        {k: report[k] for k in ("hardened", "deduped", "failed", "provisionalCount")},
        started_at=started,
        status="Completed" if report["failed"] == 0 else "Failed",
    )
    audit.remember(mem, "harden", run_id, started, report, partition)


#: The event of each hardening action.
EVENTS = {
    "hardened": EventKind.PROMOTED,
    "archived-duplicate": EventKind.DEDUPED,
    "revoked-instruction": EventKind.REVOKED,
    "reinforced": EventKind.REINFORCED,
}


def _event(before: Note, after: Note, action: str, run_id: str, why: dict) -> NoteEvent:
    """The event of one hardening outcome: ``promoted`` (Provisional -> Active),
    ``deduped`` (archived into the Active note it repeats, related: that note),
    ``revoked`` (steering text) or ``reinforced`` (the Active note duplicates were archived
    into, related: them; a note promoted in this run and then reinforced keeps its
    ``promoted`` event, with ``reinforced_by``)."""
    details = dict(why)
    related = details.pop("related", [])
    return note_event(
        EVENTS[action],
        after,
        before=before,
        actor=Actor.MANAGER,
        phase=PHASE,
        run_id=run_id,
        related=related,
        **details,
    )


def _active_pools(
    mem: MemoryContext, scopes: set[tuple[str | None, str | None, str | None]]
) -> _Pools:
    """The Active notes of each of these exact scopes, with their vectors (one scan)."""
    pools = _Pools({s: _ScopePool() for s in scopes})
    if not scopes:
        return pools
    where = and_(eq("status", NoteStatus.ACTIVE), cond_or(*(exact_scope(*s) for s in scopes)))
    active, matrix = mem.store.notes.scan_with_vectors(where)
    for note, vec in zip(active, matrix, strict=True):
        pools.by_scope[scope_triple(note)].add(note, vec)
    return pools
