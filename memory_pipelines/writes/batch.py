"""The batched write path: a run's writes planned in memory, then committed together.

:func:`execute_batch` gives every request the disposition the per-write path
(:func:`memory_pipelines.writes.guard.execute_each`) would give it, in order, each
request seeing the ones before it (within-run idempotency, the per-run cap, the
near-duplicate guard against a note written earlier in the batch, supersede of the run's
own note), but it does the expensive work once for the batch:

* one embedding call for every valid request's text;
* one read of the run's ledger;
* one fetch per clamped scope of the notes the near-duplicate guard may compare with
  (id, text and vector, read through the scalar indexes), compared in numpy with the
  batch's own planned notes laid over them; the run's own scope is fetched in a
  background thread while the texts are embedded;
* one note-table commit for the new notes, an append (``Notebook.appending``: the ledger
  claim decides each id; a supersede of a note created earlier in the
  batch is folded into it), then one ledger claim for all rows (the commit point), then
  the rewrites of notes that existed before the batch (superseded own notes of earlier
  requests, reinforced duplicates: claim first, as in the per-write path), one insert of
  the lifecycle events of every note the batch changed
  (:mod:`memory_pipelines.writes.disposition_events`: one event per note, after the claim, so a batch
  that falls back records only the per-write path's events), and one transaction for the
  audit steps.

Crash safety is the per-write path's: a new note is saved before its ledger rows (a crash
in between leaves a row a retry rewrites under the same id, never a ledger row without a
note); a rewrite is claimed before it is saved, and released if the save fails.

When the commit cannot go as planned (the embedder fails, the note save fails, or
another writer of the same run claimed one of the batch's keys first) the batch falls
back to the per-write path before anything is claimed, and then removes any note it
saved that no ledger row took (or the second copy two writers inserted at once). A
failure of a post-claim rewrite releases its key and turns that request into an
``error``, as in the per-write path (a later request of the same batch that repeated it
stays ``skipped-duplicate``).

``duration_ms`` of a result is the time spent planning that request plus an equal share
of the batch's shared work (embedding, fetches, commits).

The pieces: :func:`embed_texts` (the one embedding call), :class:`BatchPlan` (a request
list planned, reads only) and :func:`commit_plans` (the commit of one or more plans that
do not see each other); :func:`execute_batch` is the three for one plan, and
:mod:`memory_pipelines.writes.group` commits the plans of many callers together.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.note_events import NoteEvent
from memory_pipelines.notes import Note, RunContext, stable_id
from memory_pipelines.scope.placement import (
    AgentWidePolicy,
    WriteScope,
    clamp_scope,
    in_near_dup_lattice,
)
from memory_pipelines.store import eq
from memory_pipelines.text import normalize
from memory_pipelines.writes.candidates import (
    Candidates,
    StoredRow,
    fetch_candidates,
    prefetch_candidates,
    unit_rows,
)
from memory_pipelines.writes.disposition_events import (
    created_event,
    reinforced_event,
    superseded_event,
)
from memory_pipelines.writes.guard import (
    Outcome,
    collapse_duplicate_rows,
    duplicate_outcome,
    error_outcome,
    execute_each,
    guard,
    load_note,
    new_note,
    write_result,
    write_step,
)
from memory_pipelines.writes.ledger import (
    SLOT_DISPOSITION,
    SLOT_KEY_PREFIX,
    RunLedger,
    ledger_key,
    ledger_row,
)
from memory_pipelines.writes.models import (
    NEAR_DUP_TOP_K,
    REASON_DEDUPED,
    REASON_SUPERSEDED,
    REASON_WRITTEN,
    Disposition,
    WriteResult,
    cap_reason,
)
from memory_pipelines.writes.validate import (
    ValidRequest,
    request_fields,
    validate_request,
)


@dataclass
class _Planned:
    """A note the batch will write, with its vector and the requests that touched it
    (``before``: the stored note it rewrites, None for a new note; ``similarity``: of the
    near-duplicate match that made the last rewrite)."""

    note: Note
    vector: np.ndarray
    requests: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    before: Note | None = None
    similarity: float | None = None


class _Batch:
    """The in-memory state of one batch: the ledger as the batch has changed it so far,
    the notes it will write, the ledger rows it will claim."""

    def __init__(
        self, mem: MemoryContext, ctx: RunContext, ledger: RunLedger, vectors: dict[str, np.ndarray]
    ):
        self.mem = mem
        self.ctx = ctx
        self.run_id = ctx.run_id or ""
        self.vectors = vectors
        self.keys: dict[str, str] = {k: row["note_id"] for k, row in ledger.keys.items()}
        self.own = dict(ledger.own)
        self.written = ledger.written
        self.created: dict[str, _Planned] = {}  # new notes (final text), saved before the claim
        self.superseded: dict[str, _Planned] = {}  # stored own notes rewritten after the claim
        self.deduped: dict[str, _Planned] = {}  # stored notes reinforced after the claim
        self.rows: list[dict[str, Any]] = []
        #: per scope key: the fetched candidates, or a Future of them (a prefetch)
        self.candidates: dict[str, Candidates | Future | None] = {}
        self.current = 0

    # -- planning ---------------------------------------------------------------------

    def plan(self, valid: ValidRequest, scope: WriteScope) -> Outcome:
        """The per-write guard order at the clamped scope, against the batch's state."""
        config = self.mem.write_config
        norm = normalize(valid.text)
        key = ledger_key(scope.key, norm)
        earlier = self.keys.get(key)
        if earlier is not None:
            return duplicate_outcome(earlier)
        at_cap = self.written >= config.max_writes_per_run
        new_id = stable_id(self.run_id, scope.key, norm)
        vector = self.vectors[valid.text]
        hits = self._near_duplicates(scope, vector, exclude_id=new_id)
        own = next((h for h in hits if self.own.get(h[0].id) == scope.key), None)
        if own is not None:
            return self._supersede(key, scope, valid, own, vector)
        exact = next(
            (h for h in hits if h[0].id not in self.own and normalize(h[0].note) == norm), None
        )
        if exact is not None:
            return self._dedupe(key, scope, exact)
        if at_cap:
            return Outcome(Disposition.SKIPPED_CAP, cap_reason(config.max_writes_per_run))
        note = new_note(self.mem, self.ctx, scope, valid, new_id)
        self.created[new_id] = _Planned(note, vector, [self.current], [key])
        self.keys[key] = new_id
        self.own[new_id] = scope.key
        self.written += 1
        self.rows += [
            ledger_row(self.run_id, key, new_id, scope, Disposition.WRITTEN.value),
            ledger_row(
                self.run_id, f"{SLOT_KEY_PREFIX}{self.written}", new_id, scope, SLOT_DISPOSITION
            ),
        ]
        return Outcome(Disposition.WRITTEN, REASON_WRITTEN, new_id, scope.as_dict())

    def _supersede(
        self,
        key: str,
        scope: WriteScope,
        valid: ValidRequest,
        hit: tuple[Note | StoredRow, float],
        vector: np.ndarray,
    ) -> Outcome:
        own, similarity = hit
        planned = self.created.get(own.id) or self.superseded.get(own.id)
        if planned is None:
            stored = load_note(self.mem, own.id)
            if stored is None:
                return error_outcome(f"Could not load own note {own.id} to supersede.")
            planned = self.superseded[own.id] = _Planned(stored, vector, before=stored)
        note = planned.note.model_copy(update={"note": valid.text, "type": valid.type})
        planned.note, planned.vector, planned.similarity = note, vector, similarity
        planned.requests.append(self.current)
        planned.keys.append(key)
        self.keys[key] = own.id
        self.rows.append(
            ledger_row(self.run_id, key, own.id, scope, Disposition.SUPERSEDED_OWN.value)
        )
        final = WriteScope(note.agent_id or scope.agent_id, note.user_id, note.company_id)
        return Outcome(Disposition.SUPERSEDED_OWN, REASON_SUPERSEDED, own.id, final.as_dict())

    def _dedupe(self, key: str, scope: WriteScope, hit: tuple[Note | StoredRow, float]) -> Outcome:
        exact, similarity = hit
        planned = self.deduped.get(exact.id)
        if planned is None:
            existing = load_note(self.mem, exact.id)
            if existing is None:
                return error_outcome(f"Could not load existing note {exact.id} to dedupe against.")
            planned = self.deduped[exact.id] = _Planned(
                existing, self._stored_vector(exact), before=existing
            )
        planned.similarity = similarity
        now = self.mem.now()
        planned.note = planned.note.model_copy(
            update={
                "access_count": planned.note.access_count + 1,
                "last_accessed_at": now,
                "updated_at": now,
            }
        )
        planned.requests.append(self.current)
        planned.keys.append(key)
        self.keys[key] = exact.id
        self.rows.append(ledger_row(self.run_id, key, exact.id, scope, Disposition.DEDUPED.value))
        return Outcome(Disposition.DEDUPED, REASON_DEDUPED, exact.id)

    def _stored_vector(self, note: Note | StoredRow) -> np.ndarray:
        for cands in self.candidates.values():
            if isinstance(cands, Candidates) and (found := cands.vector(note.id)) is not None:
                return found
        return np.asarray(self.mem.embed([note.note])[0], dtype=np.float32)

    # -- the near-duplicate guard -----------------------------------------------------

    def _fetch(self, scope: WriteScope) -> Candidates | None:
        """The scope's comparable stored notes, fetched once; None when the fetch fails."""
        if scope.key not in self.candidates:
            self.candidates[scope.key] = fetch_candidates(self.mem, self.ctx, scope)
        found = self.candidates[scope.key]
        if isinstance(found, Future):  # fetched beside the embedding call
            found = self.candidates[scope.key] = found.result()
        return found

    def _near_duplicates(
        self, scope: WriteScope, vector: np.ndarray, exclude_id: str
    ) -> list[tuple[Note | StoredRow, float]]:
        """The top-3 notes at or above the near-dup threshold with their similarity, most
        similar first, as the store would rank them if the batch's planned notes were
        already saved."""
        cands = self._fetch(scope)
        if cands is None:
            return []
        threshold = self.mem.write_config.near_dup_similarity
        query = unit_rows(np.asarray(vector, dtype=np.float32)[None, :])[0]
        planned = {**self.deduped, **self.superseded, **self.created}
        scored: list[tuple[float, tuple[int, int], Note | StoredRow]] = [
            (sim, at, note)
            for sim, at, note in cands.above(query, threshold)
            if note.id != exclude_id and note.id not in planned
        ]
        after = len(cands.parts)  # planned notes not stored rank after every stored one
        for order, (note_id, p) in enumerate(planned.items()):
            if note_id == exclude_id:
                continue
            at = cands.position(note_id)
            if at is None and not (
                note_id in self.created and in_near_dup_lattice(p.note, scope, self.ctx)
            ):
                continue
            sim = float(unit_rows(p.vector[None, :])[0] @ query)
            if sim >= threshold:
                scored.append((sim, at if at is not None else (after, order), p.note))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return [(note, sim) for sim, _, note in scored[:NEAR_DUP_TOP_K]]

    # -- the commit -------------------------------------------------------------------

    def release(self, planned: dict[str, _Planned], reason: str, outcomes: list[Outcome]) -> None:
        """Undo the claims of rewrites that failed; their requests become errors."""
        agent_id = self.ctx.agent_id
        self.mem.sources.ledger_release(
            self.run_id, [k for p in planned.values() for k in p.keys], agent_id
        )
        for p in planned.values():
            for i in p.requests:
                outcomes[i] = error_outcome(reason)

    def tidy_after_fallback(self) -> None:
        """After the per-write fallback: drop each note this batch saved that no ledger row
        of the run took, and the second copy of one two writers inserted at once."""
        taken = {r["note_id"] for r in self.mem.sources.ledger_rows(self.run_id, self.ctx.agent_id)}
        for note_id, p in self.created.items():
            if note_id in taken:
                collapse_duplicate_rows(self.mem, p.note, p.vector)
            else:
                self.mem.store.notes.delete(eq("id", note_id))


def _rewrite(
    batch: _Batch, planned: dict[str, _Planned], outcomes: list[Outcome], *, supersede: bool
) -> list[NoteEvent]:
    """Save the batch's rewrites of stored notes (superseded own notes through the notebook,
    reinforced duplicates as they are stored: the reference changes only their counters)
    and return their events; a failed save releases their claims (the requests become
    ``error``) and records nothing."""
    if not planned:
        return []
    failure = "Failed to supersede own note" if supersede else "Failed to update existing note"
    notes = [p.note for p in planned.values()]
    vectors = np.stack([p.vector for p in planned.values()])
    try:
        if supersede:
            notes = batch.mem.notebook.save_notes(notes, vectors)
        else:
            batch.mem.store.notes.upsert(notes, vectors)
    except Exception as e:
        batch.release(planned, f"{failure}: {e}", outcomes)
        return []
    build = superseded_event if supersede else reinforced_event
    return [
        build(
            p.before or p.note,
            n,
            batch.run_id,
            similarity=p.similarity,
            writes=len(p.requests),
            at=n.updated_at,
        )
        for n, p in zip(notes, planned.values(), strict=True)
    ]


def embed_texts(mem: MemoryContext, requests: Sequence[Any]) -> dict[str, np.ndarray]:
    """One embedding call for the valid requests' texts (raises when the embedder fails)."""
    texts = [
        v.text
        for r in requests
        if isinstance(v := validate_request(r, request_fields(r), mem.write_config), ValidRequest)
    ]
    unique = list(dict.fromkeys(texts))
    mat = mem.embed(unique) if unique else np.zeros((0, mem.embedder.dim), np.float32)
    return {t: np.asarray(mat[i], dtype=np.float32) for i, t in enumerate(unique)}


@dataclass(eq=False)
class BatchPlan:
    """One request list planned against the stored state (nothing written yet): its
    outcomes, the (request text, landing scope) pairs the guards reached, and the batch
    state :func:`commit_plans` commits."""

    ctx: RunContext
    requests: list[Any]
    policy: AgentWidePolicy
    batch: _Batch
    fields: list[Any] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    started: list[Any] = field(default_factory=list)
    planning_ms: list[float] = field(default_factory=list)
    landings: list[tuple[ValidRequest, WriteScope]] = field(default_factory=list)
    #: the run is new (``ownership.claim_run``): its ledger is empty and no note holds
    #: one of its ids, so its notes are appended without the table's id lookup
    new_run: bool = False

    @classmethod
    def make(
        cls,
        mem: MemoryContext,
        ctx: RunContext,
        requests: Sequence[Any],
        policy: AgentWidePolicy,
        vectors: dict[str, np.ndarray],
        candidates: dict[str, Any] | None = None,
        *,
        new_run: bool = False,
    ) -> BatchPlan:
        """Plan ``requests`` in order through the guards (reads only). ``candidates``: the
        scope fetches to share with other plans of the same stored state and primary
        scope record (filled as scopes are fetched). ``new_run``: the run was claimed by
        this call, nothing of it is stored (its ledger is not read)."""
        ledger = RunLedger.empty() if new_run else RunLedger.load(mem, ctx.run_id or "", ctx.agent_id)
        batch = _Batch(mem, ctx, ledger, vectors)
        if candidates is not None:
            batch.candidates = candidates
        plan = cls(ctx, list(requests), policy, batch, new_run=new_run)

        def scoped(valid: ValidRequest, scope: WriteScope) -> Outcome:
            plan.landings.append((valid, scope))
            return batch.plan(valid, scope)

        for i, request in enumerate(plan.requests):
            batch.current = i
            f = request_fields(request)
            plan.fields.append(f)
            plan.started.append(mem.now())
            t = time.perf_counter()
            plan.outcomes.append(guard(mem, ctx, request, f, policy, scoped))
            plan.planning_ms.append((time.perf_counter() - t) * 1000.0)
        return plan

    def fallback(self) -> list[WriteResult]:
        """The per-write path for this plan's requests (nothing of it claimed yet)."""
        return execute_each(self.batch.mem, self.ctx, self.requests, self.policy)


def commit_plans(
    mem: MemoryContext, plans: Sequence[BatchPlan], shared_ms: float = 0.0
) -> list[list[WriteResult]]:
    """Commit plans that do not see each other's notes or runs: one note commit for all
    their new notes, one ledger claim for all their rows (per plan when that fails: a plan
    whose claim another writer of its run beat falls back to the per-write path), the
    rewrites, one insert of their events and one transaction for their audit steps.
    ``shared_ms``: work done for all of them before (embedding), shared out in the
    durations. Returns each plan's results, in order."""
    t0 = time.perf_counter()
    created = [p for plan in plans for p in plan.batch.created.values()]
    saved: list[Note] = []
    if created:
        try:  # the ledger claim below decides each id; a new run's ids are stored nowhere
            with mem.notebook.appending():
                saved = mem.notebook.save_notes(
                    [p.note for p in created],
                    np.stack([p.vector for p in created]),
                    fresh=all(plan.new_run for plan in plans),
                )
        except Exception:  # nothing is claimed yet: the per-write path reports each error
            return [plan.fallback() for plan in plans]
    stamped = dict(zip((p.note.id for p in created), saved, strict=True))
    results = _claim(mem, plans)  # the plans that fell back
    events: list[NoteEvent] = []
    for plan in plans:
        if plan in results:
            continue
        batch = plan.batch
        events += [
            created_event(stamped[note_id], batch.run_id, writes=len(p.requests))
            for note_id, p in batch.created.items()
        ]
        events += _rewrite(batch, batch.superseded, plan.outcomes, supersede=True)
        events += _rewrite(batch, batch.deduped, plan.outcomes, supersede=False)
    mem.notebook.record(events)  # one insert for the events of every plan

    live = [plan for plan in plans if plan not in results]
    total = sum(len(plan.requests) for plan in live)
    share = (shared_ms + (time.perf_counter() - t0) * 1000.0) / max(total, 1)
    finished = mem.now()
    steps: list[dict[str, Any]] = []
    for plan in live:
        results[plan] = [
            write_result(request, outcome, ms + share)
            for request, outcome, ms in zip(
                plan.requests, plan.outcomes, plan.planning_ms, strict=True
            )
        ]
        steps += [
            write_step(plan.ctx, f, r, at, finished)
            for f, r, at in zip(plan.fields, results[plan], plan.started, strict=True)
        ]
    mem.sources.add_step_batch(steps)
    return [results[plan] for plan in plans]


def _claim(mem: MemoryContext, plans: Sequence[BatchPlan]) -> dict[BatchPlan, list[WriteResult]]:
    """Claim every plan's ledger rows in one transaction, or plan by plan when another
    writer got to one of the keys first; a plan that loses its claim runs the per-write
    path and tidies its saved notes. Returns the results of the plans that fell back."""
    claimers = [plan for plan in plans if plan.batch.rows]
    if not claimers or mem.sources.ledger_claim([r for p in claimers for r in p.batch.rows]):
        return {}
    fallen: dict[BatchPlan, list[WriteResult]] = {}
    for plan in claimers:  # a lone claimer has had its one try
        if len(claimers) == 1 or not mem.sources.ledger_claim(plan.batch.rows):
            fallen[plan] = plan.fallback()  # another writer of the run won
            plan.batch.tidy_after_fallback()
    return fallen


def execute_batch(
    mem: MemoryContext,
    ctx: RunContext,
    requests: Sequence[Any],
    policy: AgentWidePolicy,
    *,
    new_run: bool = False,
) -> list[WriteResult]:
    """Run a batch of requests through the guards with one embedding call, one fetch per
    scope, one note commit, one ledger claim and one audit transaction (see the module
    notes); the results equal the per-write path's, in order. ``new_run``: the call
    claimed the run (see :class:`BatchPlan`)."""
    t0 = time.perf_counter()
    scope = clamp_scope(ctx, None)  # where requests without a scope hint land
    candidates = {scope.key: prefetch_candidates(mem, ctx, scope)}
    try:
        vectors = embed_texts(mem, requests)
    except Exception:  # the per-write path fails open per request, then reports the error
        return execute_each(mem, ctx, requests, policy)
    embed_ms = (time.perf_counter() - t0) * 1000.0
    plan = BatchPlan.make(mem, ctx, requests, policy, vectors, candidates, new_run=new_run)
    return commit_plans(mem, [plan], embed_ms)[0]
