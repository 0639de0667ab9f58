"""Run ownership: a run id belongs to one agent in one tenant.

Within-run state (the write ledger's idempotency keys and cap, the proxy's pending write
feedback, the run record) is keyed by (agent, run id). The first context that uses a run
id in a write (or a turn of the proxy) claims it for its (company, user): the
``run_owners`` table keeps the claim. A later call of the same agent naming the same run
id from another company or user is refused with :class:`RunConflictError` (HTTP 409, an
MCP tool error), before anything of the run is read: it cannot consume the run's cap,
learn how many notes the run wrote, receive its feedback or take over its record.
Another agent using the same run id has a run of its own (see
:mod:`memory_pipelines.writes`).

Injection does not claim a run (it changes no run state) but is refused the same way a
run id another tenant owns: it would otherwise record its injections under that run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import RunConflictError
from memory_pipelines.notes import RunContext

#: The context fields a run's owner is compared on (the agent is part of the run's key).
TENANT = ("company_id", "user_id")


def _refuse(ctx: RunContext, owner: Mapping[str, Any]) -> None:
    if any(owner.get(k) != getattr(ctx, k) for k in TENANT):
        raise RunConflictError(
            f"run {ctx.run_id!r} of agent {ctx.agent_id!r} belongs to another company or user;"
            " use a run id of your own"
        )


def claim_run(mem: MemoryContext, ctx: RunContext) -> bool:
    """Claim ``ctx``'s run for its (company, user), or check that it already is theirs
    (:class:`RunConflictError` otherwise). Nothing to do without a run id. True when this
    call claimed a run id that nothing had used, so nothing of the run is stored yet: no
    write ledger row, no note with one of its write ids (the write path then appends its
    notes without asking the table whether their ids are stored)."""
    if not ctx.run_id:
        return False
    owner, new = mem.sources.claim_new_run(ctx.agent_id, ctx.run_id, ctx.company_id, ctx.user_id)
    _refuse(ctx, owner)
    return new


def check_run(mem: MemoryContext, ctx: RunContext) -> None:
    """:class:`RunConflictError` when ``ctx``'s run id belongs to another company or user
    of the agent; a run nobody claimed yet stays unclaimed."""
    if not ctx.run_id:
        return
    owner = mem.sources.run_owner(ctx.agent_id, ctx.run_id)
    if owner is not None:
        _refuse(ctx, owner)
