"""The entry of the in-flight write path: :func:`execute_writes` checks the call, applies
the agent's gate and runs the batch, batched (the default) or one write at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from memory_pipelines.agents import get_agent
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import ValidationError
from memory_pipelines.limits import limits
from memory_pipelines.notes import RunContext
from memory_pipelines.scope.placement import AgentWidePolicy, agent_wide_policy
from memory_pipelines.writes.batch import execute_batch
from memory_pipelines.writes.guard import execute_each, skip_disabled
from memory_pipelines.writes.models import WriteResult
from memory_pipelines.writes.ownership import check_run, claim_run


def execute_writes(
    mem: MemoryContext, ctx: RunContext, writes: Sequence[Any], *, batched: bool = True
) -> list[WriteResult]:
    """Run a batch of in-flight writes through the gate and the guards, in order.

    Raises ``UnknownAgentError`` for an unknown agent, ``ValidationError`` without a
    run id or when ``writes`` is not a list, and ``RunConflictError`` when the run id
    belongs to another company or user of the agent (:mod:`.ownership`). A malformed request never raises: it gets
    ``rejected-type``. Returns one result per request, in order; an empty batch does
    nothing. Each processed request gets one audit step; a gated batch gets one in all.
    ``batched=False`` takes the per-write path (the same results, each write embedding,
    searching and committing on its own: the baseline of ``bench writes``).
    """
    requests, policy, new_run = check_writes(mem, ctx, writes)
    if not requests:
        return []
    if policy is None:
        return skip_disabled(mem, ctx, requests)
    if batched:
        return execute_batch(mem, ctx, requests, policy, new_run=new_run)
    return execute_each(mem, ctx, requests, policy)


class WriteCheck(NamedTuple):
    """What :func:`check_writes` found."""

    requests: list[Any]
    #: the agent-wide policy; None when the agent may not write (or there is nothing to do)
    policy: AgentWidePolicy | None
    #: whether the call claimed a run that nothing had used (:func:`.ownership.claim_run`)
    new_run: bool = False


def check_writes(mem: MemoryContext, ctx: RunContext, writes: Sequence[Any]) -> WriteCheck:
    """The checks of :func:`execute_writes` (the raises it documents): the requests, the
    agent-wide policy and whether the run is new."""
    agent = get_agent(mem.sources, ctx.agent_id)
    if not ctx.run_id:
        raise ValidationError("run_id is required for memory writes (RunContext.run_id)")
    if isinstance(writes, (str, bytes, bytearray, Mapping)) or not isinstance(writes, Sequence):
        raise ValidationError(
            f"writes must be a list of memory write requests, got {type(writes).__name__}"
        )
    requests = list(writes)
    if not requests:
        check_run(mem, ctx)
        return WriteCheck([], None)
    bound = limits().max_writes_per_request
    if len(requests) > bound:
        raise ValidationError(
            f"writes: at most {bound} memory writes per request, got {len(requests)};"
            " nothing was saved"
        )
    new_run = claim_run(mem, ctx)  # RunConflictError: another tenant's run
    if not agent.allow_memory_write:
        return WriteCheck(requests, None, new_run)
    return WriteCheck(requests, agent_wide_policy(mem, agent, ctx), new_run)
