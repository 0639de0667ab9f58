"""Where a write lands: the clamped scope, the agent-wide policy (which writes may land
without a user) and the lattice the near-duplicate guard compares with (see the notes of
:mod:`memory_pipelines.writes`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from memory_pipelines.context import MemoryContext
from memory_pipelines.notes import AgentConfig, Note, RunContext, is_injectable
from memory_pipelines.scope.lattice import scope_key
from memory_pipelines.scope.match import in_lattice
from memory_pipelines.scope.tenancy import SecondaryScopeConfig
from memory_pipelines.store import Cond, and_, eq, injectable, is_null, not_null, or_


@dataclass(frozen=True)
class WriteScope:
    """The clamped scope a write lands at: always the running agent, never wider."""

    agent_id: str
    user_id: str | None
    company_id: str | None

    @property
    def key(self) -> str:
        return scope_key(self.agent_id, self.user_id, self.company_id)

    def as_dict(self) -> dict[str, str | None]:
        return {"agent_id": self.agent_id, "user_id": self.user_id, "company_id": self.company_id}


def clamp_scope(ctx: RunContext, scope_hint: str | None) -> WriteScope:
    """Clamp a write to the running agent; ``scopeHint='agent'`` drops the user.

    A hint can narrow the scope but never widen it: without a user in the context,
    ``'user'`` still yields a NULL user; the company always comes from the context.
    """
    user_id = None if scope_hint == "agent" else ctx.user_id
    return WriteScope(agent_id=ctx.agent_id, user_id=user_id, company_id=ctx.company_id)


@dataclass(frozen=True)
class AgentWidePolicy:
    """Which writes may land without a user for one batch: the agent's ``agentWideWrites``
    or its default (``default`` tells which, for the reasons). ``setting`` is the mode, or
    how to work it out: then only the first write that lands without a user asks (a write
    with a user is always allowed, and never pays for the question)."""

    setting: str | Callable[[], str]
    default: bool = False

    @cached_property
    def mode(self) -> str:
        return self.setting() if callable(self.setting) else self.setting

    def allows(self, scope: WriteScope) -> bool:
        if scope.user_id is not None or self.mode == "allow":
            return True
        return self.mode == "company" and scope.company_id is not None

    def reason(self, template: str) -> str:
        why = ", the default for an agent that serves companies" if self.default else ""
        return template.format(mode=self.mode, why=why)


def agent_wide_policy(mem: MemoryContext, agent: AgentConfig, ctx: RunContext) -> AgentWidePolicy:
    """The agent's ``agentWideWrites`` setting, else 'company' when it serves companies
    (see the module notes) and 'allow' otherwise; checked only for a companyless run."""
    config = SecondaryScopeConfig.from_value(agent.scope_config)
    if config.agent_wide_writes:
        return AgentWidePolicy(config.agent_wide_writes)
    if ctx.company_id is None and config.dimensions:
        return AgentWidePolicy("company", default=True)
    if ctx.company_id is None:
        return AgentWidePolicy(
            lambda: "company" if serves_companies(mem, agent.agent_id) else "allow", default=True
        )
    return AgentWidePolicy("allow", default=True)


def serves_companies(mem: MemoryContext, agent_id: str) -> bool:
    """Whether a conversation, run, injection or note of the agent names a company."""
    if mem.sources.agent_names_company(agent_id):
        return True
    return mem.store.notes.count(and_(eq("agent_id", agent_id), not_null("company_id"))) > 0


def _company_bound(scope: WriteScope, ctx: RunContext) -> bool:
    """Whether the write's comparisons leave out the user's notes without a company."""
    return (
        scope.user_id is not None
        and scope.company_id is not None
        and not ctx.reads_companyless_user_notes
    )


def near_dup_filter(scope: WriteScope, ctx: RunContext) -> Cond:
    """The notes a write may be compared with: injectable ones in the scope's lattice.

    Agent: the running agent or NULL. User and company: the clamped value or NULL when
    there is one, NULL only when there is none (no leak to other users or companies).
    With a primary scope record in the run, notes must have none or the same one. A run
    a company-bound key vouched for never compares with its user's notes stored without
    a company (``RunContext.reads_companyless_user_notes``). The same rows as the
    lattice of :func:`~.prefilter.note_scope_filter` with the company-bound rule, written
    as the write path's read cache keys them.
    """
    conds = [injectable(), or_(eq("agent_id", scope.agent_id), is_null("agent_id"))]
    for column, value in (("user_id", scope.user_id), ("company_id", scope.company_id)):
        conds.append(is_null(column) if value is None else or_(eq(column, value), is_null(column)))
    if _company_bound(scope, ctx):
        conds.append(or_(is_null("user_id"), not_null("company_id")))
    if ctx.primary_scope_record_id is not None:
        conds.append(
            or_(
                is_null("primary_scope_record_id"),
                eq("primary_scope_record_id", ctx.primary_scope_record_id),
            )
        )
    return and_(*conds)


def in_near_dup_lattice(note: Note, scope: WriteScope, ctx: RunContext) -> bool:
    """Whether :func:`near_dup_filter` admits ``note`` (the same rule, in Python, for notes
    a batch has planned but not yet saved)."""
    if not is_injectable(note.status):
        return False
    if not in_lattice(
        note.agent_id,
        note.user_id,
        note.company_id,
        scope.agent_id,
        scope.user_id,
        scope.company_id,
        companyless_users=not _company_bound(scope, ctx),
    ):
        return False
    record = ctx.primary_scope_record_id
    return record is None or note.primary_scope_record_id in (None, record)
