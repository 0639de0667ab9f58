"""Group commit: the write calls of many callers (each a run context and its writes), run
as if one after another, committed together.

:func:`execute_group` is what a server's writer thread calls with the calls that arrived
together. Each call gets exactly what :func:`~memory_pipelines.writes.execute_writes`
would have given it had the calls run one after another in the given order: its own
results (dispositions, reasons, notes, ledger rows, audit steps and events), or its own
exception (an unknown agent, a missing run id, a list too long); one call's error never
fails another. The work is shared:

* one embedding call for the valid texts of every call;
* one fetch of each scope's near-duplicate candidates for all calls of a segment, those
  of the calls' primary scopes started while the texts are embedded;
* the calls are planned in order (:class:`~memory_pipelines.writes.batch.BatchPlan`:
  reads only) and committed together as one *segment*
  (:func:`~memory_pipelines.writes.batch.commit_plans`): one note-table commit for all
  their new notes, one ledger claim for all their rows, one insert of their events and
  one transaction for their audit steps.

Sequential semantics: a call whose outcome could depend on what an earlier call of the
segment plans is not planned against the stored state. Before it is admitted, the
segment is committed and the call planned again, so it sees the earlier calls as the
store and the ledger hold them, exactly as :meth:`MemoryService.write` one after another
would. A call *sees* the segment (:func:`sees`) when it continues a run of the segment
(the run's ledger: idempotency, the cap, its own notes); when a note the segment creates
lies in the near-duplicate lattice of one of its writes at the near-duplicate threshold
(compared with a small margin); when a stored note the segment rewrites (supersede,
reinforcement) lies in that lattice at all; or when its agent-wide policy is the default
'allow', which a new note of its agent naming a company would turn into 'company'. A
gated call (the agent may not write) commits the segment first and records its step.
Calls that write different users' facts, the common case of a busy server, share one
segment.

Crash safety and cross-process writers are the batched path's: new notes are saved
before the claim, a claim that another writer of the run beat sends that call (alone) to
the per-write path, and the note table retries commit conflicts with backoff
(``RowTable``), so a concurrent process's commit never loses a write.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.limits import limits
from memory_pipelines.notes import RunContext
from memory_pipelines.scope.placement import clamp_scope, in_near_dup_lattice
from memory_pipelines.writes.batch import (
    BatchPlan,
    commit_plans,
    embed_texts,
    prefetch_candidates,
)
from memory_pipelines.writes.execute import check_writes, execute_writes
from memory_pipelines.writes.guard import skip_disabled
from memory_pipelines.writes.models import WriteResult

#: A call of the group: the run context and its writes (what ``svc.write`` takes).
GroupCall = tuple[RunContext, Sequence[Any]]

#: Cosines this close below the near-duplicate threshold count as "could match" (the
#: planned and the stored comparison round differently).
SIMILARITY_MARGIN = 1e-4


def execute_group(
    mem: MemoryContext, calls: Sequence[GroupCall]
) -> list[list[WriteResult] | Exception]:
    """Run ``calls`` as if one after another (see the module notes): each call's results,
    or the exception :func:`execute_writes` would have raised for it, in order."""
    out: list[list[WriteResult] | Exception] = [[] for _ in calls]
    t0 = time.perf_counter()
    fetched: dict[Any, dict[str, Any]] = {}  # scope fetches of the stored state
    _prefetch(mem, calls, fetched)
    try:
        vectors = embed_texts(mem, _requests(calls))
    except Exception:  # each call embeds (and fails open) on its own, one after another
        for i, (ctx, writes) in enumerate(calls):
            out[i] = _run(lambda ctx=ctx, writes=writes: execute_writes(mem, ctx, writes))
        return out
    embed_ms = (time.perf_counter() - t0) * 1000.0
    segment: list[tuple[int, BatchPlan]] = []

    def commit() -> None:
        share = embed_ms * sum(len(p.requests) for _, p in segment) / max(_count(calls), 1)
        results = _run(lambda: commit_plans(mem, [p for _, p in segment], share))
        for k, (i, _) in enumerate(segment):
            out[i] = results if isinstance(results, Exception) else results[k]
        segment.clear()
        fetched.clear()

    for i, (ctx, writes) in enumerate(calls):
        try:
            plan = _plan(mem, ctx, writes, vectors, fetched)
            if isinstance(plan, BatchPlan) and segment and sees([p for _, p in segment], plan):
                commit()
                plan = _plan(mem, ctx, writes, vectors, fetched)  # against the committed state
            if plan is None:  # gated: its step goes after the segment's
                commit()
                requests = check_writes(mem, ctx, writes).requests
                out[i] = skip_disabled(mem, ctx, requests)
            elif isinstance(plan, BatchPlan):
                segment.append((i, plan))
        except Exception as e:  # this call's own error
            out[i] = e
    commit()
    return out


def _prefetch(
    mem: MemoryContext, calls: Sequence[GroupCall], fetched: dict[Any, dict[str, Any]]
) -> None:
    """Start fetching each call's primary scope candidates (where its writes without a
    scope hint land) while the texts are embedded, as a single call's batch does; the
    first segment's plans use them (a commit clears ``fetched``: later plans fetch the
    state it left)."""
    for ctx, writes in calls:
        if not isinstance(ctx, RunContext) or not isinstance(writes, (list, tuple)) or not writes:
            continue  # nothing to write, or the call's own check refuses it
        share = fetched.setdefault(_share_key(ctx), {})
        scope = clamp_scope(ctx, None)
        if scope.key not in share:
            share[scope.key] = prefetch_candidates(mem, ctx, scope)


def _share_key(ctx: RunContext) -> tuple[str | None, bool]:
    """Which calls of a round may share scope fetches: the near-duplicate filter also
    depends on the run's primary scope record and on whether a company-bound key vouched
    for the context (:func:`~memory_pipelines.scope.placement.near_dup_filter`)."""
    return ctx.primary_scope_record_id, ctx.reads_companyless_user_notes


def _plan(
    mem: MemoryContext,
    ctx: RunContext,
    writes: Sequence[Any],
    vectors: dict[str, np.ndarray],
    fetched: dict[Any, dict[str, Any]],
) -> BatchPlan | list[Any] | None:
    """The call's plan; [] when it has nothing to write, None when its agent may not write
    (raises what :func:`check_writes` raises). Plans of one segment share their scope
    fetches (the stored state does not change until the segment commits); the near-
    duplicate filter also depends on the run's primary scope record, hence one share each."""
    requests, policy, new_run = check_writes(mem, ctx, writes)
    if not requests:
        return []
    if policy is None:
        return None
    if not isinstance(writes, (list, tuple)):  # another kind of sequence: not embedded yet
        vectors = {**vectors, **embed_texts(mem, requests)}
    share = fetched.setdefault(_share_key(ctx), {})
    return BatchPlan.make(mem, ctx, requests, policy, vectors, share, new_run=new_run)


def sees(segment: Sequence[BatchPlan], plan: BatchPlan) -> bool:
    """Whether ``plan`` could have come out otherwise had ``segment`` been committed
    before it was planned (see the module notes)."""
    mem = plan.batch.mem
    run = (plan.ctx.run_id, plan.ctx.agent_id)
    if any((other.ctx.run_id, other.ctx.agent_id) == run for other in segment):
        return True
    created = [p for other in segment for p in other.batch.created.values()]
    rewritten = [
        p
        for other in segment
        for p in (*other.batch.superseded.values(), *other.batch.deduped.values())
    ]
    if plan.ctx.company_id is None:
        agent = plan.ctx.agent_id
        if any(p.note.agent_id == agent and p.note.company_id is not None for p in created):
            if plan.policy.default and plan.policy.mode == "allow":
                return True
    threshold = mem.write_config.near_dup_similarity - SIMILARITY_MARGIN
    for valid, scope in plan.landings:
        for p in rewritten:
            if any(in_near_dup_lattice(n, scope, plan.ctx) for n in (p.note, p.before) if n):
                return True
        near = [p for p in created if in_near_dup_lattice(p.note, scope, plan.ctx)]
        if near:
            query = _unit(plan.batch.vectors[valid.text])
            if any(float(_unit(p.vector) @ query) >= threshold for p in near):
                return True
    return False


def _unit(vector: np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    return v / norm if norm else v


def _requests(calls: Sequence[GroupCall]) -> list[Any]:
    """Every request of the calls that can be run (a list within the per-call bound)."""
    bound = limits().max_writes_per_request
    return [
        r
        for _, writes in calls
        if isinstance(writes, (list, tuple)) and len(writes) <= bound
        for r in writes
    ]


def _count(calls: Sequence[GroupCall]) -> int:
    return len(_requests(calls))


def _run(fn: Any) -> Any:
    try:
        return fn()
    except Exception as e:
        return e
