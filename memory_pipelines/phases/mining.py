"""What the extraction phases mine (reference §4.2-§4.4): conversations with new messages,
the conversations of high-value agent runs and failed agent runs (as synthetic failure
threads), loaded past their cursors in ``manager_state``, and the cursor moves after
mining."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.judge import ConversationMessage
from memory_pipelines.notes import utc
from memory_pipelines.partitions import state_key
from memory_pipelines.phases import audit

FAILURE_RATING_COMMENT = "Agent run failed — mine for a corrective lesson."
TRUNCATED_MARK = "… (truncated)"


def conversation_cursor_key(kind: str, conversation_id: str) -> str:
    return f"cursor:{kind}:conversation:{conversation_id}"


def failed_run_key(run_id: str) -> str:
    return f"cursor:notes:failed_run:{run_id}"


def watermark_key(kind: str) -> str:
    return f"watermark:{kind}"


def judge_failures_key(kind: str, batch: MiningBatch) -> str:
    """Where the judge failures of ``batch`` mined for ``kind`` are counted."""
    if batch.kind == "failure":
        return f"judge_failures:{kind}:failed_run:{batch.run_id}"
    return f"judge_failures:{kind}:conversation:{batch.conversation_id}"


@dataclass(frozen=True)
class MiningBatch:
    """New messages of one conversation (or the synthetic thread of a failed run)."""

    kind: str  # "conversation" | "failure"
    agent_id: str
    conversation_id: str | None
    run_id: str | None
    user_id: str | None
    company_id: str | None
    messages: tuple[ConversationMessage, ...]
    rating_context: str
    last_seq: int
    activity_at: datetime | None
    primary_scope_entity_id: str | None = None
    primary_scope_record_id: str | None = None
    secondary_scopes: dict[str, Any] | None = None

    @property
    def source_label(self) -> str:
        """How a revocation comment names the source of a replacing note."""
        if self.conversation_id:
            return f"conversation {self.conversation_id}"
        return f"agent run {self.run_id}"

    @property
    def last_message_id(self) -> str | None:
        for m in reversed(self.messages):
            if m.message_id:
                return m.message_id
        return None


@dataclass
class Loaded:
    batches: list[MiningBatch] = field(default_factory=list)
    watermark: datetime | None = None
    stats: dict[str, Any] = field(default_factory=dict)


def rating_class(rating: int | None) -> str | None:
    """8-10 positive, 1-3 negative, anything else no signal (reference §4.2)."""
    if rating is None:
        return None
    if 8 <= rating <= 10:
        return "positive"
    if 1 <= rating <= 3:
        return "negative"
    return None


def failure_thread(status: str, error: str | None, max_chars: int = 2000) -> ConversationMessage:
    """The synthetic 'system' message a failed agent run is mined from (reference §4.3)."""
    text = (error or "").strip() or "(no error message)"
    if len(text) > max_chars:
        text = text[:max_chars] + TRUNCATED_MARK
    return ConversationMessage(
        role="system",
        text=(
            f'An agent run ended with status "{status}". Error: {text}. Identify a generalizable '
            "lesson to avoid repeating this failure; if none generalizes, extract nothing."
        ),
        rating=-1,
        rating_comment=FAILURE_RATING_COMMENT,
    )


def agents_using_memory(mem: MemoryContext) -> list[str]:
    return [
        a.agent_id
        for a in mem.sources.list_agents(active_only=True)
        if a.inject_notes or a.inject_examples
    ]


def activity_since(mem: MemoryContext, kind: str, partition: str | None = None) -> datetime | None:
    """Where loading ``kind`` activity starts: the watermark minus the overlap. A
    partition's watermark is the later of its own and the whole-pool one (a
    whole-pool run mined every partition); the per-item cursors decide what is new."""
    keys = [watermark_key(kind)]
    if partition is not None:
        keys.append(state_key(watermark_key(kind), partition))
    marks = [utc(m) for m in mem.sources.get_states(keys).values() if m]
    return max(marks) - mem.manager_config.activity_overlap if marks else None


def load_conversations(
    mem: MemoryContext,
    kind: str,
    agent_ids: Sequence[str],
    run_id: str,
    partition: str | None = None,
) -> Loaded:
    """Conversations of memory-using agents with messages past their ``kind`` cursor,
    plus the conversations of high-value agent runs (audit: two steps)."""
    started = mem.now()
    cfg = mem.manager_config
    since = activity_since(mem, kind, partition)
    convs = mem.sources.conversations_with_activity(since, agent_ids, limit=cfg.max_conversations)
    hit_limit = len(convs) >= cfg.max_conversations
    by_id = {c["conversation_id"]: c for c in convs}
    # high-value agent runs: mine their conversation (reference §4.2 step 4)
    hv_started = mem.now()
    high_value = mem.sources.high_value_runs(
        agent_ids,
        since,
        cfg.high_value_share_count,
        cfg.high_value_artifact_count,
        cfg.max_high_value_runs,
    )
    extra_ids = [
        r["conversation_id"]
        for r in high_value
        if r["conversation_id"] and r["conversation_id"] not in by_id
    ]
    if extra_ids:
        for row in mem.sources.conversations_by_id(extra_ids):
            by_id[row["conversation_id"]] = row
    high_value_convs = {r["conversation_id"] for r in high_value if r["conversation_id"]}
    loaded = _conversation_batches(mem, kind, by_id, high_value_convs)
    if hit_limit and convs:
        loaded.watermark = utc(convs[-1]["last_activity_at"])
    else:
        loaded.watermark = started
    audit.step(
        mem,
        run_id,
        "Decision",
        "Load Conversations With New Activity",
        {
            "since": since,
            "agentCount": len(agent_ids),
            "agentIds": list(agent_ids),
            "cursor": kind,
        },
        loaded.stats,
        started_at=started,
    )
    audit.step(
        mem,
        run_id,
        "Decision",
        "Load High-Value Agent Runs",
        {
            "since": since,
            "minShareCount": cfg.high_value_share_count,
            "minArtifactCount": cfg.high_value_artifact_count,
        },
        {"runCount": len(high_value)},
        started_at=hv_started,
    )
    return loaded


def _conversation_batches(
    mem: MemoryContext, kind: str, by_id: dict[str, dict], high_value_convs: set[str]
) -> Loaded:
    """One batch per conversation with messages past its ``kind`` cursor (its scope
    completed from its latest run and the user's company), and the load's stats."""
    cursors = mem.sources.get_states([conversation_cursor_key(kind, cid) for cid in by_id])
    runs = mem.sources.latest_runs_of(list(by_id))
    companies = mem.sources.user_companies({c["user_id"] for c in by_id.values() if c["user_id"]})
    loaded = Loaded()
    counts = {"positiveCount": 0, "negativeCount": 0, "unratedCount": 0}
    total_messages = 0
    for cid, conv in by_id.items():
        after = int(cursors.get(conversation_cursor_key(kind, cid)) or 0)
        rows = mem.sources.messages_of(cid, after_seq=after)
        if not rows:
            continue
        context = _rating_context(rows, cid in high_value_convs)
        counts[f"{context}Count"] += 1
        total_messages += len(rows)
        loaded.batches.append(
            _conversation_batch(conv, rows, context, runs.get(cid) or {}, companies)
        )
    loaded.stats = {
        "conversationCount": len(loaded.batches),
        "totalMessages": total_messages,
        **counts,
    }
    return loaded


def _rating_context(rows: Sequence[dict], high_value: bool) -> str:
    """The class of the latest rated message; unrated: positive for a high-value run's
    conversation, else ``unrated``."""
    for m in reversed(rows):
        context = rating_class(m["rating"])
        if context:
            return context
    return "positive" if high_value else "unrated"


def _conversation_batch(
    conv: dict, rows: Sequence[dict], context: str, run: dict, companies: dict
) -> MiningBatch:
    """The batch of one conversation's new messages."""
    user_id = conv["user_id"] or run.get("user_id")
    company_id = conv["company_id"] or run.get("company_id") or companies.get(user_id)
    return MiningBatch(
        kind="conversation",
        agent_id=conv["agent_id"],
        conversation_id=conv["conversation_id"],
        run_id=run.get("run_id"),
        user_id=user_id,
        company_id=company_id,
        messages=tuple(
            ConversationMessage(
                role=m["role"],
                text=m["text"],
                rating=m["rating"],
                rating_comment=m["rating_comment"],
                message_id=m["message_id"],
                sent_at=utc(m["created_at"]) if m.get("created_at") else None,
            )
            for m in rows
        ),
        rating_context=context,
        last_seq=int(rows[-1]["seq"]),
        activity_at=utc(conv["last_activity_at"]),
        primary_scope_entity_id=run.get("primary_scope_entity_id"),
        primary_scope_record_id=run.get("primary_scope_record_id"),
        secondary_scopes=run.get("secondary_scopes"),
    )


def load_failed_runs(
    mem: MemoryContext, agent_ids: Sequence[str], run_id: str, partition: str | None = None
) -> Loaded:
    """Failed or unsuccessful agent runs not mined yet, as synthetic failure threads."""
    started = mem.now()
    since = activity_since(mem, "failed_runs", partition)
    rows = mem.sources.failed_runs(agent_ids, since)
    mined = mem.sources.get_states([failed_run_key(r["run_id"]) for r in rows])
    fresh = [r for r in rows if not mined.get(failed_run_key(r["run_id"]))]
    hit_limit = len(fresh) > mem.manager_config.max_failed_runs
    fresh = fresh[: mem.manager_config.max_failed_runs]
    companies = mem.sources.user_companies({r["user_id"] for r in fresh if r["user_id"]})
    loaded = Loaded()
    for r in fresh:
        loaded.batches.append(
            MiningBatch(
                kind="failure",
                agent_id=r["agent_id"],
                conversation_id=r["conversation_id"],
                run_id=r["run_id"],
                user_id=r["user_id"],
                company_id=r["company_id"] or companies.get(r["user_id"]),
                messages=(
                    failure_thread(
                        r["status"], r["error_message"], mem.manager_config.max_failure_error_chars
                    ),
                ),
                rating_context="failure",
                last_seq=0,
                activity_at=utc(r["created_at"]),
                primary_scope_entity_id=r["primary_scope_entity_id"],
                primary_scope_record_id=r["primary_scope_record_id"],
                secondary_scopes=r["secondary_scopes"],
            )
        )
    loaded.watermark = utc(fresh[-1]["created_at"]) if hit_limit else started
    loaded.stats = {"runCount": len(fresh)}
    audit.step(
        mem,
        run_id,
        "Decision",
        "Load Instructive Failed Agent Runs",
        {"since": since, "agentIds": list(agent_ids)},
        loaded.stats,
        started_at=started,
    )
    return loaded


def advance(
    mem: MemoryContext,
    kind: str,
    loaded: Loaded,
    done: Sequence[MiningBatch],
    failed: Sequence[MiningBatch],
    partition: str | None = None,
) -> list[MiningBatch]:
    """Move the cursors of mined batches; keep the watermark (the partition's own,
    with a ``partition``) before any failed one, and count its failure. A batch that has
    failed ``judge_give_up_attempts`` times over at least ``judge_give_up_after`` is given
    up: its cursor moves as if mined. Returns the batches given up."""
    values: dict[str, Any] = {}
    failed, given_up = _count_failures(mem, kind, done, failed, values)
    for b in [*done, *given_up]:
        if b.kind == "failure":
            values[failed_run_key(b.run_id or "")] = True
        elif b.conversation_id:
            values[conversation_cursor_key(kind, b.conversation_id)] = b.last_seq
    watermark = loaded.watermark
    retry = [b.activity_at for b in failed if b.activity_at is not None]
    if retry:
        # the next load (from mark - overlap) starts just before the earliest failed
        # batch; the batches mined meanwhile are skipped by their cursors
        earliest = min(retry) - timedelta(microseconds=1) + mem.manager_config.activity_overlap
        watermark = min(watermark, earliest) if watermark else earliest
    if watermark is not None:
        key = watermark_key("failed_runs" if kind == "failure" else kind)
        values[state_key(key, partition)] = watermark.isoformat()
    mem.sources.set_states(values)
    return given_up


def _count_failures(
    mem: MemoryContext,
    kind: str,
    done: Sequence[MiningBatch],
    failed: Sequence[MiningBatch],
    values: dict[str, Any],
) -> tuple[list[MiningBatch], list[MiningBatch]]:
    """(still failing, given up) of ``failed``; the failure counts to write go into
    ``values`` (a mined or given-up batch's count is removed)."""
    cfg = mem.manager_config
    failing = {judge_failures_key(kind, b): b for b in failed}
    cleared = [judge_failures_key(kind, b) for b in done]
    if not failing and not cleared:
        return [], []
    known = mem.sources.get_states([*failing, *cleared])
    values.update({key: None for key in cleared if key in known})
    now, attempts = mem.now(), cfg.judge_give_up_attempts
    still: list[MiningBatch] = []
    given_up: list[MiningBatch] = []
    for key, batch in failing.items():
        record = known.get(key)
        record = record if isinstance(record, dict) else {}
        count = int(record.get("count", 0)) + 1
        first = utc(record["first"]) if record.get("first") else now
        if attempts and count >= attempts and now - first >= cfg.judge_give_up_after:
            given_up.append(batch)
            values[key] = None
        else:
            still.append(batch)
            values[key] = {"count": count, "first": first.isoformat()}
    return still, given_up


def audit_given_up(
    mem: MemoryContext, run_id: str, kind: str, given_up: Sequence[MiningBatch]
) -> None:
    """The audit step that names the batches whose judge calls kept failing and that
    the cursors now pass (none: no step)."""
    if not given_up:
        return
    cfg = mem.manager_config
    audit.step(
        mem,
        run_id,
        "Decision",
        "Give Up On Sources The Judge Keeps Failing",
        {
            "cursor": kind,
            "attempts": cfg.judge_give_up_attempts,
            "after": str(cfg.judge_give_up_after),
        },
        {"sources": [b.source_label for b in given_up], "count": len(given_up)},
        started_at=mem.now(),
    )
