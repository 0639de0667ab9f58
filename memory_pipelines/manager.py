"""The Memory Manager cycle: fold injection events, extract, harden (reference §4.2-§4.5).

``MemoryManager`` composes the phases the Dagster assets call (``svc.manager``):

- ``fold_injection_events`` turns the ``injection_events`` the read path records into
  ``access_count`` / ``last_accessed_at`` on notes and examples, exactly once per event.
- ``extract_notes`` mines conversations with new messages, high-value agent runs and
  failed agent runs for durable notes (confidence/length filter, merge collapse,
  dedupe, lineage-preserving revocation of merge targets); ``extract_examples`` mines
  the same conversations for input/output examples; ``extract`` does both.
- ``harden`` promotes provisional agent-written notes to Active, or archives a true
  duplicate into the Active note it repeats. A judge that cannot decide leaves the note
  Provisional (never archives on a failure; reference defect 6).
- ``run_cycle`` runs the above, then the maintenance phases of
  ``memory_pipelines.maintenance`` when their trigger fires, and records a
  ``manager_runs`` row.

Every sub-step writes one audit row (``run_steps``) under the manager run id. Cursors
live in ``manager_state``: a conversation's messages, a failed run and an injection
event are each mined or folded once; note and example ids are deterministic, so a
crashed or repeated phase upserts instead of duplicating.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import and_ as sql_and
from sqlalchemy import delete as sql_delete
from sqlalchemy import func, insert, or_, select, update

from memory_pipelines.config import ManagerConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import JudgeError, MemoryPipelineError
from memory_pipelines.judge import (
    CandidateExample,
    CandidateNote,
    ConversationMessage,
    reads_as_instruction,
)
from memory_pipelines.maintenance import (
    consolidate,
    expire_and_decay,
    maintenance_trigger,
    prune_stale,
    resolve_contradictions,
    run_maintenance,
    score_importance,
)
from memory_pipelines.notes import (
    AuthorType,
    Example,
    ExampleStatus,
    Note,
    NoteStatus,
    NoteType,
    ProtectionTier,
    append_comment,
    new_id,
    stable_id,
    utc,
)
from memory_pipelines.partitions import (
    agents_in,
    in_partition,
    note_filter,
    partition_of,
    state_key,
)
from memory_pipelines.reports import PhaseReport
from memory_pipelines.scoping import in_lattice, note_scope_filter
from memory_pipelines.sources import (
    agent_runs,
    conversations,
    injection_events,
    manager_runs,
    manager_state,
    messages,
    users,
)
from memory_pipelines.store import Cond, and_, eq, injectable
from memory_pipelines.store import or_ as cond_or
from memory_pipelines.text import normalize

# --------------------------------------------------------------------------- settings



DEFAULT_CONFIG = ManagerConfig()

VALID_NOTE_TYPES = frozenset(t.value for t in NoteType)
FAILURE_NOTE_TYPES = (NoteType.ISSUE.value, NoteType.CONTEXT.value)
#: Tiers a judge may hint. Immutable is a human decision; a model never sets it.
HINTABLE_TIERS = frozenset(
    {ProtectionTier.STANDARD.value, ProtectionTier.EPHEMERAL.value, ProtectionTier.PROTECTED.value}
)
KEPT_TIERS = frozenset({ProtectionTier.IMMUTABLE.value, ProtectionTier.PROTECTED.value})

FAILURE_RATING_COMMENT = "Agent run failed — mine for a corrective lesson."
TRUNCATED_MARK = "… (truncated)"
NO_AGENTS_MESSAGE = "No agents have note/example injection enabled - nothing to extract"

# manager_state keys
FOLD_CURSOR = "injection_fold_cursor"
FOLD_PENDING = "injection_fold_pending"
LAST_CYCLE_AT = "last_cycle_at"


def _conversation_cursor_key(kind: str, conversation_id: str) -> str:
    return f"cursor:{kind}:conversation:{conversation_id}"


def _failed_run_key(run_id: str) -> str:
    return f"cursor:notes:failed_run:{run_id}"


def _watermark_key(kind: str) -> str:
    return f"watermark:{kind}"


CYCLE_PHASES = ("fold", "extract_notes", "extract_examples", "harden")
#: The comment hardening appends to a provisional note it revokes as steering text.
REVOKED_INSTRUCTION = "revoked — reads as an instruction to the assistant, not a fact"


def _phase_key(phase: str) -> str:
    return f"cycle.phase.{phase}"


class CycleError(MemoryPipelineError):
    """One or more phases of a Memory Manager cycle failed (the cycle is recorded Failed)."""


# --------------------------------------------------------------------------- values


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
class _NoteCandidate:
    note: Note
    merge_ids: tuple[str, ...]
    batch: MiningBatch
    confidence: float
    key: str = ""
    vector: np.ndarray | None = None
    reason: str = ""


@dataclass
class _ExampleCandidate:
    example: Example
    batch: MiningBatch
    confidence: float
    vector: np.ndarray | None = None
    reason: str = ""


@dataclass(frozen=True)
class CycleSignal:
    """The sensor's decision: whether new data warrants a cycle, and the next cursor."""

    should_run: bool
    reason: str
    cursor: dict[str, Any]
    run_key: str | None = None
    new_rated_messages: int = 0
    provisional_backlog: int = 0


@dataclass
class _Loaded:
    batches: list[MiningBatch] = field(default_factory=list)
    watermark: datetime | None = None
    stats: dict[str, Any] = field(default_factory=dict)


def _chunks(items: Sequence[Any], size: int = 500) -> Iterable[Sequence[Any]]:
    """Slices of ``items`` small enough for one SQL ``IN (...)``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _scope(note: Note) -> tuple[str | None, str | None, str | None]:
    return (note.agent_id, note.user_id, note.company_id)


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


# --------------------------------------------------------------------------- filters


def exact_scope(agent_id: str | None, user_id: str | None, company_id: str | None) -> Cond:
    """Notes of exactly this (agent, user, company) scope (NULL matches NULL)."""
    return and_(eq("agent_id", agent_id), eq("user_id", user_id), eq("company_id", company_id))


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


# --------------------------------------------------------------------------- manager


def _partition_field(partition: str | None) -> dict[str, str]:
    """``{"partition": key}`` for a partitioned run's records, nothing for a whole-pool run."""
    return {} if partition is None else {"partition": partition}


class MemoryManager:
    """The Memory Manager phases over one ``MemoryService`` (no Dagster here)."""

    def __init__(self, mem: MemoryContext, config: ManagerConfig | None = None):
        self.mem = mem
        self.config = config or mem.manager_config

    # -- small plumbing -----------------------------------------------------------------

    def _step(
        self,
        run_id: str,
        step_type: str,
        name: str,
        input: Any,
        output: Any,
        *,
        started_at: datetime,
        ok: bool = True,
        error: str | None = None,
    ) -> None:
        self.mem.sources.add_step(
            run_id,
            step_type,
            name,
            input=input,
            output=output,
            status="Completed" if ok else "Failed",
            error_message=error,
            started_at=started_at,
            finished_at=self.mem.now(),
        )

    def _get_states(self, keys: Sequence[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        with self.mem.sources.begin() as c:
            for chunk in _chunks(list(dict.fromkeys(keys))):
                rows = c.execute(
                    select(manager_state.c.key, manager_state.c.value).where(
                        manager_state.c.key.in_(chunk)
                    )
                )
                found.update({k: v for k, v in rows})
        return found

    def _set_states(self, values: Mapping[str, Any]) -> None:
        """Set (or, for a None value, delete) several state keys in one transaction."""
        if not values:
            return
        now = self.mem.now()
        with self.mem.sources.begin() as c:
            existing = set()
            for chunk in _chunks(list(values)):
                existing.update(
                    r[0]
                    for r in c.execute(
                        select(manager_state.c.key).where(manager_state.c.key.in_(chunk))
                    )
                )
            for key, value in values.items():
                if value is None:
                    c.execute(sql_delete(manager_state).where(manager_state.c.key == key))
                elif key in existing:
                    c.execute(
                        update(manager_state)
                        .where(manager_state.c.key == key)
                        .values(value=value, updated_at=now)
                    )
                else:
                    c.execute(insert(manager_state).values(key=key, value=value, updated_at=now))

    def _remember(
        self,
        phase: str,
        run_id: str,
        started_at: datetime,
        report: PhaseReport,
        partition: str | None = None,
    ) -> None:
        """Keep the phase's last report so ``finish_cycle`` can total a cycle run by run id."""
        self.mem.sources.set_state(
            state_key(_phase_key(phase), partition),
            {
                "run_id": run_id,
                "started_at": started_at.isoformat(),
                "finished_at": self.mem.now().isoformat(),
                "counts": dict(report),
            },
        )

    def _agents_using_memory(self) -> list[str]:
        return [
            a.agent_id
            for a in self.mem.sources.list_agents(active_only=True)
            if a.inject_notes or a.inject_examples
        ]

    # -- fold injection events ----------------------------------------------------------

    def fold_injection_events(
        self, run_id: str | None = None, partition: str | None = None
    ) -> PhaseReport:
        """Fold ``injection_events`` newer than the fold cursor into access statistics.

        Reads: ``injection_events`` (id > the fold cursor), the notes and examples they
        name. Writes: ``access_count`` += number of events and ``last_accessed_at`` =
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
        started = self.mem.now()
        cursor_key = state_key(FOLD_CURSOR, partition)
        pending_key = state_key(FOLD_PENDING, partition)
        report = PhaseReport(
            {"eventsFolded": 0, "notesTouched": 0, "examplesTouched": 0, "recovered": 0}
        )
        pending = self.mem.sources.get_state(pending_key)
        if pending:
            self._apply_fold(pending, report, cursor_key, pending_key)
            report["recovered"] = 1
        # the whole-pool fold skips what partition folds already counted
        folded = self._partition_fold_cursors() if partition is None else {}
        while True:
            cursor = self._fold_cursor(partition)
            with self.mem.sources.begin() as c:
                rows = c.execute(
                    select(
                        injection_events.c.id,
                        injection_events.c.item_kind,
                        injection_events.c.item_id,
                        injection_events.c.injected_at,
                    )
                    .where(injection_events.c.id > cursor)
                    .order_by(injection_events.c.id)
                    .limit(self.config.fold_batch_size)
                ).all()
            if not rows:
                break
            intent = self._fold_intent(rows, partition, folded)
            self.mem.sources.set_state(pending_key, intent)
            self._apply_fold(intent, report, cursor_key, pending_key)
            report["eventsFolded"] += len(rows)
            if len(rows) < self.config.fold_batch_size:
                break
        self._step(
            run_id,
            "Decision",
            "Fold Injection Events",
            {"cursor": self._fold_cursor(partition)} | _partition_field(partition),
            dict(report),
            started_at=started,
        )
        self._remember("fold", run_id, started, report, partition)
        return report

    def _fold_cursor(self, partition: str | None) -> int:
        """The last event id folded for ``partition`` (the whole pool for ``None``)."""
        whole = int(self.mem.sources.get_state(FOLD_CURSOR, 0) or 0)
        if partition is None:
            return whole
        own = int(self.mem.sources.get_state(state_key(FOLD_CURSOR, partition), 0) or 0)
        return max(whole, own)

    def _partition_fold_cursors(self) -> dict[str, int]:
        """Every partition's own fold cursor (partitions never folded are absent)."""
        prefix = state_key(FOLD_CURSOR, "")
        with self.mem.sources.begin() as c:
            rows = c.execute(
                select(manager_state.c.key, manager_state.c.value).where(
                    manager_state.c.key.like(prefix + "%")
                )
            ).all()
        return {k[len(prefix) :]: int(v or 0) for k, v in rows if k.startswith(prefix)}

    def _fold_intent(
        self, rows: Sequence[Any], partition: str | None, folded: Mapping[str, int]
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
            ("note", self.mem.store.notes, intent["notes"]),
            ("example", self.mem.store.examples, intent["examples"]),
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
        self, intent: Mapping[str, Any], report: PhaseReport, cursor_key: str, pending_key: str
    ) -> None:
        notes = self.mem.store.notes.get_many(list(intent.get("notes", {})))
        if notes:
            self.mem.notebook.update_notes(
                (
                    n,
                    {
                        "access_count": intent["notes"][n.id][0],
                        "last_accessed_at": utc(intent["notes"][n.id][1]),
                    },
                )
                for n in notes
            )
        examples = self.mem.store.examples.get_many(list(intent.get("examples", {})))
        if examples:
            self.mem.notebook.save_examples(
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
        self._set_states({cursor_key: int(intent["end_id"]), pending_key: None})

    # -- loading what to mine -----------------------------------------------------------

    def _since(self, kind: str, partition: str | None = None) -> datetime | None:
        """Where loading ``kind`` activity starts: the watermark minus the overlap. A
        partition's watermark is the later of its own and the whole-pool one (a
        whole-pool run mined every partition); the per-item cursors decide what is new."""
        keys = [_watermark_key(kind)]
        if partition is not None:
            keys.append(state_key(_watermark_key(kind), partition))
        marks = [utc(m) for m in self._get_states(keys).values() if m]
        return max(marks) - self.config.activity_overlap if marks else None

    def _load_conversations(
        self, kind: str, agent_ids: Sequence[str], run_id: str, partition: str | None = None
    ) -> _Loaded:
        """Conversations of memory-using agents with messages past their ``kind`` cursor,
        plus the conversations of high-value agent runs (audit: two steps)."""
        started = self.mem.now()
        since = self._since(kind, partition)
        convs = self.mem.sources.conversations_with_activity(
            since, agent_ids, limit=self.config.max_conversations
        )
        hit_limit = len(convs) >= self.config.max_conversations
        by_id = {c["conversation_id"]: c for c in convs}
        # high-value agent runs: mine their conversation (reference §4.2 step 4)
        hv_started = self.mem.now()
        with self.mem.sources.begin() as c:
            q = (
                select(agent_runs)
                .where(
                    agent_runs.c.agent_id.in_(list(agent_ids)),
                    or_(
                        agent_runs.c.artifact_share_count >= self.config.high_value_share_count,
                        agent_runs.c.artifact_count >= self.config.high_value_artifact_count,
                    ),
                )
                .order_by(agent_runs.c.created_at.desc())
                .limit(self.config.max_high_value_runs)
            )
            if since is not None:
                q = q.where(agent_runs.c.created_at > since)
            high_value = [dict(r) for r in c.execute(q).mappings()]
            extra_ids = [
                r["conversation_id"]
                for r in high_value
                if r["conversation_id"] and r["conversation_id"] not in by_id
            ]
            if extra_ids:
                for row in c.execute(
                    select(conversations).where(conversations.c.conversation_id.in_(extra_ids))
                ).mappings():
                    by_id[row["conversation_id"]] = dict(row)
        high_value_convs = {r["conversation_id"] for r in high_value if r["conversation_id"]}

        cursors = self._get_states([_conversation_cursor_key(kind, cid) for cid in by_id])
        runs = self._latest_runs(list(by_id))
        companies = self._user_companies({c["user_id"] for c in by_id.values() if c["user_id"]})
        loaded = _Loaded()
        counts = {"positiveCount": 0, "negativeCount": 0, "unratedCount": 0}
        total_messages = 0
        for cid, conv in by_id.items():
            after = int(cursors.get(_conversation_cursor_key(kind, cid)) or 0)
            rows = self.mem.sources.messages_of(cid, after_seq=after)
            if not rows:
                continue
            context = None
            for m in reversed(rows):
                context = rating_class(m["rating"])
                if context:
                    break
            if context is None:
                context = "positive" if cid in high_value_convs else "unrated"
            counts[f"{context}Count"] += 1
            total_messages += len(rows)
            run = runs.get(cid) or {}
            user_id = conv["user_id"] or run.get("user_id")
            company_id = conv["company_id"] or run.get("company_id") or companies.get(user_id)
            loaded.batches.append(
                MiningBatch(
                    kind="conversation",
                    agent_id=conv["agent_id"],
                    conversation_id=cid,
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
            )
        if hit_limit and convs:
            loaded.watermark = utc(convs[-1]["last_activity_at"])
        else:
            loaded.watermark = started
        loaded.stats = {
            "conversationCount": len(loaded.batches),
            "totalMessages": total_messages,
            **counts,
        }
        self._step(
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
        self._step(
            run_id,
            "Decision",
            "Load High-Value Agent Runs",
            {
                "since": since,
                "minShareCount": self.config.high_value_share_count,
                "minArtifactCount": self.config.high_value_artifact_count,
            },
            {"runCount": len(high_value)},
            started_at=hv_started,
        )
        return loaded

    def _latest_runs(self, conversation_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The most recent agent run of each conversation (source run id and scope)."""
        out: dict[str, dict[str, Any]] = {}
        with self.mem.sources.begin() as c:
            for chunk in _chunks(conversation_ids):
                for r in c.execute(
                    select(agent_runs)
                    .where(agent_runs.c.conversation_id.in_(chunk))
                    .order_by(agent_runs.c.created_at, agent_runs.c.run_id)
                ).mappings():
                    out[r["conversation_id"]] = dict(r)
        return out

    def _user_companies(self, user_ids: Iterable[str]) -> dict[str, str | None]:
        ids = list(user_ids)
        if not ids:
            return {}
        with self.mem.sources.begin() as c:
            return {
                r[0]: r[1]
                for r in c.execute(
                    select(users.c.user_id, users.c.company_id).where(users.c.user_id.in_(ids))
                )
            }

    def _load_failed_runs(
        self, agent_ids: Sequence[str], run_id: str, partition: str | None = None
    ) -> _Loaded:
        """Failed or unsuccessful agent runs not mined yet, as synthetic failure threads."""
        started = self.mem.now()
        since = self._since("failed_runs", partition)
        failed = or_(
            sql_and(
                agent_runs.c.status.in_(["Failed", "Cancelled"]),
                agent_runs.c.error_message.is_not(None),
                agent_runs.c.error_message != "",
            ),
            sql_and(
                agent_runs.c.success.is_(False), agent_runs.c.status.not_in(["Running", "Paused"])
            ),
        )
        with self.mem.sources.begin() as c:
            q = (
                select(agent_runs)
                .where(agent_runs.c.agent_id.in_(list(agent_ids)), failed)
                .order_by(agent_runs.c.created_at, agent_runs.c.run_id)
            )
            if since is not None:
                q = q.where(agent_runs.c.created_at > since)
            rows = [dict(r) for r in c.execute(q).mappings()]
        mined = self._get_states([_failed_run_key(r["run_id"]) for r in rows])
        fresh = [r for r in rows if not mined.get(_failed_run_key(r["run_id"]))]
        hit_limit = len(fresh) > self.config.max_failed_runs
        fresh = fresh[: self.config.max_failed_runs]
        companies = self._user_companies({r["user_id"] for r in fresh if r["user_id"]})
        loaded = _Loaded()
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
                            r["status"], r["error_message"], self.config.max_failure_error_chars
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
        self._step(
            run_id,
            "Decision",
            "Load Instructive Failed Agent Runs",
            {"since": since, "agentIds": list(agent_ids)},
            loaded.stats,
            started_at=started,
        )
        return loaded

    def _advance(
        self,
        kind: str,
        loaded: _Loaded,
        done: Sequence[MiningBatch],
        failed: Sequence[MiningBatch],
        partition: str | None = None,
    ) -> None:
        """Move the cursors of mined batches; keep the watermark (the partition's own,
        with a ``partition``) before any failed one."""
        values: dict[str, Any] = {}
        for b in done:
            if b.kind == "failure":
                values[_failed_run_key(b.run_id or "")] = True
            elif b.conversation_id:
                values[_conversation_cursor_key(kind, b.conversation_id)] = b.last_seq
        watermark = loaded.watermark
        retry = [b.activity_at for b in failed if b.activity_at is not None]
        if retry:
            # the next load (from mark - overlap) starts just before the earliest failed
            # batch; the batches mined meanwhile are skipped by their cursors
            earliest = min(retry) - timedelta(microseconds=1) + self.config.activity_overlap
            watermark = min(watermark, earliest) if watermark else earliest
        if watermark is not None:
            key = _watermark_key("failed_runs" if kind == "failure" else kind)
            values[state_key(key, partition)] = watermark.isoformat()
        self._set_states(values)

    # -- note extraction ----------------------------------------------------------------

    def _existing_for_judge(self, batch: MiningBatch) -> list[Note]:
        """The Active notes (reference: Active only) the agent sees for this batch's user,
        at most ``existing_notes_for_judge``, the ones closest to the batch's text first."""
        where = and_(
            note_scope_filter(batch.agent_id, batch.user_id, batch.company_id),
            eq("status", NoteStatus.ACTIVE),
        )
        text = " ".join(m.text for m in batch.messages)[:4000]
        (query,) = self.mem.embed([text])
        hits = self.mem.store.notes.vector_search(
            query, where=where, k=self.config.existing_notes_for_judge
        )
        return [h.item for h in hits]

    def _candidate_note(
        self, c: CandidateNote, batch: MiningBatch, existing: Mapping[str, Note]
    ) -> tuple[_NoteCandidate | None, str]:
        """Validate one judge proposal and build the note it would create (or say why not)."""
        content = (c.content or "").strip()
        if float(c.confidence or 0) < self.config.min_confidence:
            return None, "lowConfidence"
        if len(content) < self.config.min_content_length:
            return None, "tooShort"
        if len(content) > self.config.max_note_length:
            return None, "tooLong"
        note_type = c.type if c.type in VALID_NOTE_TYPES else None
        if batch.kind == "failure" and note_type not in FAILURE_NOTE_TYPES:
            note_type = NoteType.ISSUE.value
        if note_type is None:
            return None, "invalidType"
        tier = ProtectionTier.STANDARD.value
        if batch.kind == "failure":
            tier = ProtectionTier.EPHEMERAL.value
        elif c.protection_tier_hint in HINTABLE_TIERS:
            tier = c.protection_tier_hint
        level = (c.scope_level or "user").lower()
        user_id, company_id = batch.user_id, batch.company_id
        primary = (batch.primary_scope_entity_id, batch.primary_scope_record_id)
        secondary = batch.secondary_scopes
        if level == "global":
            user_id = company_id = None
            primary, secondary = (None, None), None
        elif level == "company" and company_id:
            user_id = None
            secondary = None
        # "company" without a known company keeps the user scope: never widen past the evidence
        message_ids = {m.message_id for m in batch.messages if m.message_id}
        message_id = (
            c.source_message_id if c.source_message_id in message_ids else batch.last_message_id
        )
        source = f"run:{batch.run_id}" if batch.kind == "failure" else batch.conversation_id
        note = Note(
            id=stable_id("mm-note", source, message_id, normalize(content)),
            agent_id=batch.agent_id,
            user_id=user_id,
            company_id=company_id,
            note=content,
            type=note_type,
            status=NoteStatus.ACTIVE,
            author_type=AuthorType.MEMORY_MANAGER,
            protection_tier=tier,
            access_count=1,
            is_auto_generated=True,
            source_run_id=batch.run_id,
            source_conversation_id=batch.conversation_id,
            source_conversation_detail_id=message_id,
            primary_scope_entity_id=primary[0],
            primary_scope_record_id=primary[1],
            secondary_scopes=secondary,
            comments=(
                f"Extracted by the Memory Manager from {batch.source_label} "
                f"(confidence {float(c.confidence):g}, rating context {batch.rating_context})."
            ),
        )
        # a merge may only revoke a note the judge was shown, of this agent, and no wider
        # than the new note (a user's statement never revokes a company-wide note)
        merge_ids = tuple(
            i
            for i in dict.fromkeys(c.merge_with_existing_ids)
            if i in existing
            and existing[i].agent_id == batch.agent_id
            and in_lattice(*_scope(note), *_scope(existing[i]))
        )
        return _NoteCandidate(
            note=note, merge_ids=merge_ids, batch=batch, confidence=float(c.confidence)
        ), ""

    def _mine_notes(
        self, batches: Sequence[MiningBatch], run_id: str, report: PhaseReport
    ) -> tuple[list[_NoteCandidate], list[MiningBatch], list[MiningBatch]]:
        """Ask the judge for notes in each batch; keep the ones that pass the filter."""
        started = self.mem.now()
        candidates: list[_NoteCandidate] = []
        done: list[MiningBatch] = []
        failed: list[MiningBatch] = []
        raw = 0
        existing_count = 0
        errors: list[str] = []
        for batch in batches:
            existing = self._existing_for_judge(batch)
            existing_count += len(existing)
            by_id = {n.id: n for n in existing}
            try:
                proposals = self.mem.judge.extract_notes(
                    batch.messages, existing, rating_context=batch.rating_context
                )
            except JudgeError as e:
                failed.append(batch)
                errors.append(f"{batch.source_label}: {e}")
                continue
            done.append(batch)
            raw += len(proposals)
            for p in proposals:
                cand, why = self._candidate_note(p, batch, by_id)
                if cand is None:
                    report[f"notesFiltered_{why}"] = report.get(f"notesFiltered_{why}", 0) + 1
                    continue
                candidates.append(cand)
        capped = candidates[: self.config.max_notes_per_run]
        if len(candidates) > len(capped):
            report["notesCapped"] = len(candidates) - len(capped)
        report["rawNoteCount"] += raw
        report["noteJudgeFailures"] += len(failed)
        self._step(
            run_id,
            "Prompt",
            "Extract Notes from Conversations",
            {
                "conversationCount": sum(1 for b in batches if b.kind == "conversation"),
                "failedRunCount": sum(1 for b in batches if b.kind == "failure"),
                "messageCount": sum(len(b.messages) for b in batches),
                "existingNoteCount": existing_count,
            },
            {
                "success": not failed,
                "rawNoteCount": raw,
                "keptNoteCount": len(capped),
                "failedBatches": len(failed),
            },
            started_at=started,
            ok=not failed or bool(done),
            error="; ".join(errors)[:4000] or None,
        )
        return capped, done, failed

    def _collapse_merges(self, cands: Sequence[_NoteCandidate]) -> list[_NoteCandidate]:
        """Merge candidates with the same normalised content in the same scope become one
        (targets joined); merge candidates come first so a plain restatement of one is
        deduped against it."""
        merged: dict[str, _NoteCandidate] = {}
        plain: list[_NoteCandidate] = []
        for c in cands:
            c.key = f"{c.note.scope_key}|{normalize(c.note.note)}"
            if not c.merge_ids:
                plain.append(c)
            elif c.key in merged:
                first = merged[c.key]
                first.merge_ids = tuple(dict.fromkeys(first.merge_ids + c.merge_ids))
            else:
                merged[c.key] = c
        return [*merged.values(), *plain]

    def _dedupe_notes(
        self, cands: list[_NoteCandidate], run_id: str, report: PhaseReport
    ) -> list[_NoteCandidate]:
        """Approve merges; reject exact restatements; ask the judge about near-duplicates
        (store hits and notes approved earlier in this run). A failed judge rejects the
        NEW candidate ("too similar to existing notes"): nothing existing is touched."""
        started = self.mem.now()
        approved: list[_NoteCandidate] = []
        rejected: list[_NoteCandidate] = []
        llm_calls = 0
        if cands:
            vectors = self.mem.embed([c.note.note for c in cands])
            for c, v in zip(cands, vectors, strict=True):
                c.vector = v
        exact_cache: dict[str, set[str]] = {}
        seen_keys: set[str] = set()
        for c in cands:
            n = c.note
            if c.merge_ids:
                c.reason = "merge candidate (auto-approved)"
                approved.append(c)
                seen_keys.add(c.key)
                continue
            if c.key in seen_keys:
                c.reason = "duplicate of a note approved earlier in this run"
                rejected.append(c)
                continue
            where = and_(note_scope_filter(n.agent_id, n.user_id, n.company_id), injectable())
            scope = n.scope_key
            if scope not in exact_cache:
                texts = self.mem.store.notes.scan(where, columns=["note"])["note"]
                exact_cache[scope] = {normalize(t) for t in texts}
            if normalize(n.note) in exact_cache[scope]:
                c.reason = "exact restatement of an existing note"
                rejected.append(c)
                continue
            hits = [
                h.item
                for h in self.mem.store.notes.vector_search(
                    c.vector,
                    where=where,
                    k=self.config.note_dedupe_k,
                    min_similarity=self.config.note_dedupe_similarity,
                    exclude_ids=[n.id],
                )
            ]
            hits += self._batch_hits(c, approved)
            if hits:
                llm_calls += 1
                try:
                    decision = self.mem.judge.is_duplicate(n.note, hits)
                except JudgeError:
                    c.reason = "too similar to existing notes"
                    rejected.append(c)
                    continue
                if not decision.should_add:
                    c.reason = decision.reason or "duplicate"
                    rejected.append(c)
                    continue
                c.reason = decision.reason
            approved.append(c)
            seen_keys.add(c.key)
        report["notesRejected"] += len(rejected)
        report.extra.setdefault("rejectedNotes", []).extend(
            {"note": c.note.note, "reason": c.reason, "source": c.batch.source_label}
            for c in rejected
        )
        self._step(
            run_id,
            "Decision",
            "Deduplicate Note Candidates",
            {"candidateCount": len(cands)},
            {
                "approvedCount": len(approved),
                "rejectedCount": len(rejected),
                "llmCallCount": llm_calls,
            },
            started_at=started,
        )
        return approved

    def _batch_hits(self, c: _NoteCandidate, approved: Sequence[_NoteCandidate]) -> list[Note]:
        """Notes approved earlier in this run that are near-duplicates of ``c`` in its lattice."""
        n = c.note
        pool = [a for a in approved if in_lattice(*_scope(a.note), *_scope(n))]
        if not pool or c.vector is None:
            return []
        sims = np.stack([a.vector for a in pool]) @ c.vector
        order = np.argsort(-sims)
        return [pool[i].note for i in order if sims[i] >= self.config.note_dedupe_similarity][
            : self.config.note_dedupe_k
        ]

    def _create_notes(
        self, approved: Sequence[_NoteCandidate], run_id: str, report: PhaseReport
    ) -> None:
        """Save each approved note, then revoke its merge targets (lineage kept; Immutable
        and Protected targets only get a conflict comment). A note already saved by an
        earlier, interrupted run is not saved again, but its revocations are completed."""
        started = self.mem.now()
        created = merged = conflicts = 0
        present = {n.id for n in self.mem.store.notes.get_many([c.note.id for c in approved])}
        fresh = [c for c in approved if c.note.id not in present]
        if fresh:
            saved = self.mem.notebook.save_notes(
                [c.note for c in fresh], np.stack([c.vector for c in fresh]).astype(np.float32)
            )
            created = len(saved)
            for n in saved:
                report.note_changed(n, "created")
        for c in approved:
            if not c.merge_ids:
                continue
            changes = []
            for target in self.mem.store.notes.get_many(list(c.merge_ids)):
                if target.status != NoteStatus.ACTIVE.value:
                    continue
                if target.protection_tier in KEPT_TIERS:
                    marker = (
                        f"[Merge-target conflict: new note {c.note.id} from {c.batch.source_label} "
                        f"supersedes this {target.protection_tier} note; it was kept]"
                    )
                    if marker in (target.comments or ""):
                        continue
                    changes.append((target, {"comments": append_comment(target.comments, marker)}))
                    conflicts += 1
                else:
                    changes.append(
                        (
                            target,
                            {
                                "status": NoteStatus.REVOKED.value,
                                "consolidated_into_note_id": c.note.id,
                                "comments": append_comment(
                                    target.comments,
                                    "Superseded: contradiction detected, replaced by new note from "
                                    f"{c.batch.source_label}",
                                ),
                            },
                        )
                    )
                    merged += 1
            for n in self.mem.notebook.update_notes(changes):
                report.note_changed(
                    n, "revoked" if n.status == NoteStatus.REVOKED.value else "merge-conflict"
                )
        report["notesCreated"] += created
        report["notesMerged"] += merged
        report["mergeConflicts"] += conflicts
        self._step(
            run_id,
            "Decision",
            "Create Note Records",
            {"approvedCount": len(approved), "alreadyPresent": len(present)},
            {"created": created, "merged": merged, "failed": 0, "conflicts": conflicts},
            started_at=started,
        )

    def extract_notes(
        self, run_id: str | None = None, partition: str | None = None
    ) -> PhaseReport:
        """Mine new conversation messages, high-value runs and failed runs for notes.

        Reads: memory-using agents (Active, injecting notes or examples), their
        conversations with messages past the per-conversation cursor, high-value and
        failed agent runs, the Active notes each conversation's user sees (sent to the
        judge), injectable notes in the lattice (dedupe). Writes: new Active
        MemoryManager notes (deterministic ids), revoked merge targets with lineage, the
        cursors, audit steps. Guarantees: a message or failed run is mined once; a judge
        failure mines nothing from that batch and leaves its cursor for the next cycle.
        With a ``partition``: only that agent's conversations and runs (none for the
        shared partition); merge targets are always notes of the batch's own agent.
        """
        run_id = run_id or new_id()
        started = self.mem.now()
        report = PhaseReport(
            {
                "conversationsProcessed": 0,
                "messagesProcessed": 0,
                "agentRunsProcessed": 0,
                "failedRunsMined": 0,
                "rawNoteCount": 0,
                "notesCreated": 0,
                "notesMerged": 0,
                "mergeConflicts": 0,
                "notesRejected": 0,
                "noteJudgeFailures": 0,
            }
        )
        agent_ids = agents_in(partition, self._agents_using_memory())
        if not agent_ids:
            self._step(
                run_id,
                "Decision",
                "Load Conversations With New Activity",
                {"agentCount": 0},
                {"message": NO_AGENTS_MESSAGE},
                started_at=started,
            )
            report.extra["message"] = NO_AGENTS_MESSAGE
            self._remember("extract_notes", run_id, started, report, partition)
            return report
        convs = self._load_conversations("notes", agent_ids, run_id, partition)
        failures = self._load_failed_runs(agent_ids, run_id, partition)
        batches = convs.batches + failures.batches
        cands, done, failed = self._mine_notes(batches, run_id, report)
        approved = self._dedupe_notes(self._collapse_merges(cands), run_id, report)
        self._create_notes(approved, run_id, report)
        self._advance(
            "notes",
            convs,
            [b for b in done if b.kind == "conversation"],
            [b for b in failed if b.kind == "conversation"],
            partition,
        )
        self._advance(
            "failure",
            failures,
            [b for b in done if b.kind == "failure"],
            [b for b in failed if b.kind == "failure"],
            partition,
        )
        conv_done = [b for b in done if b.kind == "conversation"]
        report["conversationsProcessed"] = len(conv_done)
        report["messagesProcessed"] = sum(len(b.messages) for b in conv_done)
        report["failedRunsMined"] = sum(1 for b in done if b.kind == "failure")
        report["agentRunsProcessed"] = len({b.run_id for b in done if b.run_id})
        self._remember("extract_notes", run_id, started, report, partition)
        return report

    # -- example extraction ---------------------------------------------------------------

    def _candidate_example(
        self, c: CandidateExample, batch: MiningBatch
    ) -> tuple[_ExampleCandidate | None, str]:
        if float(c.success_score or 0) < self.config.example_min_success:
            return None, "lowSuccess"
        if float(c.confidence or 0) < self.config.example_min_confidence:
            return None, "lowConfidence"
        example_input = (c.example_input or "").strip()
        example_output = (c.example_output or "").strip()
        if not example_input or not example_output:
            return None, "empty"
        message_ids = {m.message_id for m in batch.messages if m.message_id}
        message_id = (
            c.source_message_id if c.source_message_id in message_ids else batch.last_message_id
        )
        example = Example(
            id=stable_id("mm-example", batch.conversation_id, message_id, normalize(example_input)),
            agent_id=batch.agent_id,
            user_id=batch.user_id,
            company_id=batch.company_id,
            example_input=example_input,
            example_output=example_output,
            success_score=float(c.success_score),
            is_auto_generated=True,
            status=ExampleStatus.ACTIVE,
            source_conversation_id=batch.conversation_id,
            source_conversation_detail_id=message_id,
            source_run_id=batch.run_id,
            primary_scope_entity_id=batch.primary_scope_entity_id,
            primary_scope_record_id=batch.primary_scope_record_id,
            secondary_scopes=batch.secondary_scopes,
            comments=(
                f"Extracted by the Memory Manager from {batch.source_label} "
                f"(confidence {float(c.confidence):g})."
            ),
        )
        return _ExampleCandidate(example=example, batch=batch, confidence=float(c.confidence)), ""

    def extract_examples(
        self, run_id: str | None = None, partition: str | None = None
    ) -> PhaseReport:
        """Mine new conversation messages for input/output examples (reference §4.4).

        Reads: conversations of memory-using agents with messages past the examples
        cursor, the agent's Active examples. Writes: new Active auto-generated examples
        (success ≥ 70, confidence ≥ 70; deterministic ids), the cursors, audit steps.
        Guarantees: an exact input already present, or a near-duplicate the judge rejects
        (or cannot judge), is not added.
        """
        run_id = run_id or new_id()
        started = self.mem.now()
        report = PhaseReport(
            {
                "conversationsProcessed": 0,
                "rawExampleCount": 0,
                "examplesCreated": 0,
                "examplesRejected": 0,
                "exampleJudgeFailures": 0,
            }
        )
        agent_ids = agents_in(partition, self._agents_using_memory())
        if not agent_ids:
            report.extra["message"] = NO_AGENTS_MESSAGE
            self._remember("extract_examples", run_id, started, report, partition)
            return report
        loaded = self._load_conversations("examples", agent_ids, run_id, partition)
        mine_started = self.mem.now()
        cands: list[_ExampleCandidate] = []
        done: list[MiningBatch] = []
        failed: list[MiningBatch] = []
        raw = 0
        for batch in loaded.batches:
            existing = self._examples_of(batch.agent_id)[: self.config.existing_examples_for_judge]
            try:
                proposals = self.mem.judge.extract_examples(batch.messages, existing)
            except JudgeError:
                failed.append(batch)
                continue
            done.append(batch)
            raw += len(proposals)
            for p in proposals:
                cand, why = self._candidate_example(p, batch)
                if cand is None:
                    report[f"examplesFiltered_{why}"] = report.get(f"examplesFiltered_{why}", 0) + 1
                else:
                    cands.append(cand)
        report["rawExampleCount"] = raw
        report["exampleJudgeFailures"] = len(failed)
        self._step(
            run_id,
            "Prompt",
            "Extract Examples from Conversations",
            {"conversationCount": len(loaded.batches)},
            {"success": not failed, "rawExampleCount": raw, "keptExampleCount": len(cands)},
            started_at=mine_started,
            ok=not failed or bool(done),
        )
        approved = self._dedupe_examples(cands, run_id, report)
        create_started = self.mem.now()
        present = {e.id for e in self.mem.store.examples.get_many([c.example.id for c in approved])}
        fresh = [c for c in approved if c.example.id not in present]
        if fresh:
            self.mem.notebook.save_examples(
                [c.example for c in fresh], np.stack([c.vector for c in fresh]).astype(np.float32)
            )
        report["examplesCreated"] = len(fresh)
        self._step(
            run_id,
            "Decision",
            "Create Example Records",
            {"approvedCount": len(approved)},
            {"created": len(fresh), "alreadyPresent": len(present), "failed": 0},
            started_at=create_started,
        )
        self._advance("examples", loaded, done, failed, partition)
        report["conversationsProcessed"] = len(done)
        self._remember("extract_examples", run_id, started, report, partition)
        return report

    def _examples_of(self, agent_id: str) -> list[Example]:
        items = self.mem.store.examples.all(
            and_(eq("agent_id", agent_id), eq("status", ExampleStatus.ACTIVE))
        )
        items.sort(key=lambda e: e.updated_at or e.created_at or self.mem.now(), reverse=True)
        return items

    def _dedupe_examples(
        self, cands: Sequence[_ExampleCandidate], run_id: str, report: PhaseReport
    ) -> list[_ExampleCandidate]:
        started = self.mem.now()
        approved: list[_ExampleCandidate] = []
        rejected = llm_calls = 0
        if cands:
            vectors = self.mem.embed([c.example.example_input for c in cands])
            for c, v in zip(cands, vectors, strict=True):
                c.vector = v
        inputs: dict[str, set[str]] = {}
        for c in cands:
            ex = c.example
            if ex.agent_id not in inputs:
                inputs[ex.agent_id] = {
                    normalize(e.example_input) for e in self._examples_of(ex.agent_id)
                }
            key = normalize(ex.example_input)
            if key in inputs[ex.agent_id]:
                rejected += 1
                continue
            hits = [
                _example_note(h.item)
                for h in self.mem.store.examples.vector_search(
                    c.vector,
                    where=and_(eq("agent_id", ex.agent_id), eq("status", ExampleStatus.ACTIVE)),
                    k=self.config.example_dedupe_k,
                    min_similarity=self.config.example_dedupe_similarity,
                    exclude_ids=[ex.id],
                )
            ]
            hits += [
                _example_note(a.example)
                for a in approved
                if a.example.agent_id == ex.agent_id
                and float(a.vector @ c.vector) >= self.config.example_dedupe_similarity
            ]
            if hits:
                llm_calls += 1
                try:
                    decision = self.mem.judge.is_duplicate(_example_note(ex).note, hits)
                except JudgeError:
                    rejected += 1
                    continue
                if not decision.should_add:
                    rejected += 1
                    continue
            approved.append(c)
            inputs[ex.agent_id].add(key)
        report["examplesRejected"] = rejected
        self._step(
            run_id,
            "Decision",
            "Deduplicate Example Candidates",
            {"candidateCount": len(cands)},
            {"approvedCount": len(approved), "rejectedCount": rejected, "llmCallCount": llm_calls},
            started_at=started,
        )
        return approved

    def extract(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Notes, then examples (both extraction assets in one call); counts merged."""
        run_id = run_id or new_id()
        notes = self.extract_notes(run_id, partition)
        examples = self.extract_examples(run_id, partition)
        report = PhaseReport(dict(notes), changed=notes.changed, extra=notes.extra)
        for key, value in examples.items():
            if key == "conversationsProcessed":
                report["exampleConversationsProcessed"] = value
            else:
                report[key] = report.get(key, 0) + value if isinstance(value, int) else value
        return report

    # -- hardening ------------------------------------------------------------------------

    def harden(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
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
        started = self.mem.now()
        limit = self.config.hardening_max_notes
        report = PhaseReport({"hardened": 0, "deduped": 0, "failed": 0, "provisionalCount": 0})
        table = self.mem.store.notes
        index = table.scan(
            and_(
                eq("status", NoteStatus.PROVISIONAL),
                eq("author_type", AuthorType.AGENT),
                note_filter(partition),
            ),
            columns=["id", "created_at"],
        )
        ids = (
            index.sort_values(["created_at", "id"]).head(limit)["id"].tolist() if len(index) else []
        )
        notes = table.get_many(ids)
        vectors = table.vectors(ids)
        report["provisionalCount"] = len(notes)
        pools = self._active_pools({_scope(n) for n in notes})
        outcome: dict[str, tuple[Note, str]] = {}
        reinforced: dict[str, int] = {}
        for note in notes:
            if reads_as_instruction(note.note):  # steering text is never promoted
                comment = f"[Hardening: {REVOKED_INSTRUCTION}]"
                revoked = note.model_copy(
                    update={
                        "status": NoteStatus.REVOKED.value,
                        "comments": append_comment(note.comments, comment),
                    }
                )
                outcome[note.id] = (revoked, "revoked-instruction")
                report.extra.setdefault("revoked", []).append(note.id)
                continue
            pool = pools[_scope(note)]
            hits = pool.nearest(
                vectors[note.id], self.config.note_dedupe_k, self.config.hardening_similarity
            )
            decision = None
            if hits:
                try:
                    decision = self.mem.judge.is_duplicate(note.note, [h for h, _ in hits])
                except JudgeError as e:
                    report["failed"] += 1
                    report.extra.setdefault("failures", []).append({"id": note.id, "error": str(e)})
                    continue
            if decision is not None and not decision.should_add:
                best = hits[0][0]
                comment = f"[Hardening: duplicate of {best.id} — {decision.reason}]"
                archived = note.model_copy(
                    update={
                        "status": NoteStatus.ARCHIVED.value,
                        "consolidated_into_note_id": best.id,
                        "comments": append_comment(note.comments, comment),
                    }
                )
                outcome[note.id] = (archived, "archived-duplicate")
                reinforced[best.id] = reinforced.get(best.id, 0) + 1
                report["deduped"] += 1
            else:
                promoted = note.model_copy(
                    update={"status": NoteStatus.ACTIVE.value, "expires_at": None}
                )
                outcome[note.id] = (promoted, "hardened")
                pool.add(promoted, vectors[note.id])
                report["hardened"] += 1
        now = self.mem.now()
        for hit_id, times in reinforced.items():
            base, action = outcome.get(hit_id) or (pools.note(hit_id), "reinforced")
            outcome[hit_id] = (
                base.model_copy(
                    update={"access_count": base.access_count + times, "last_accessed_at": now}
                ),
                action,
            )
        if outcome:
            saved = self.mem.notebook.save_notes(
                [n for n, _ in outcome.values()],
                np.stack([pools.vector(i) if i not in vectors else vectors[i] for i in outcome]),
            )
            for n, (_, action) in zip(saved, outcome.values(), strict=True):
                report.note_changed(n, action)
        self._step(
            run_id,
            "Decision",
            "Harden Provisional Notes",
            {"maxNotesPerRun": limit},
            {k: report[k] for k in ("hardened", "deduped", "failed", "provisionalCount")},
            started_at=started,
            ok=report["failed"] == 0,
        )
        self._remember("harden", run_id, started, report, partition)
        return report

    def _active_pools(self, scopes: set[tuple[str | None, str | None, str | None]]) -> _Pools:
        """The Active notes of each of these exact scopes, with their vectors (one scan)."""
        pools = _Pools({s: _ScopePool() for s in scopes})
        if not scopes:
            return pools
        where = and_(eq("status", NoteStatus.ACTIVE), cond_or(*(exact_scope(*s) for s in scopes)))
        active, matrix = self.mem.store.notes.scan_with_vectors(where)
        for note, vec in zip(active, matrix, strict=True):
            pools.by_scope[_scope(note)].add(note, vec)
        return pools

    # -- maintenance (delegated to memory_pipelines.maintenance) --------------------------

    def score_importance(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Importance scoring (reference §4.7); see ``memory_pipelines.maintenance``."""
        return score_importance(self.mem, run_id, partition=partition)

    def consolidate(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Consolidation of similar clusters (reference §4.8)."""
        return consolidate(self.mem, run_id, partition=partition)

    def resolve_contradictions(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Contradiction detection and resolution (reference §4.9)."""
        return resolve_contradictions(self.mem, run_id, partition=partition)

    def prune_stale(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Stale-reference pruning (reference §4.10)."""
        return prune_stale(self.mem, run_id, partition=partition)

    def expire_and_decay(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """TTL expiry and Ebbinghaus decay (reference §4.11)."""
        return expire_and_decay(self.mem, run_id, partition=partition)

    # -- the cycle --------------------------------------------------------------------------

    def finish_cycle(
        self,
        run_id: str,
        status: str = "Completed",
        extra_counts: Mapping[str, Any] | None = None,
        partition: str | None = None,
    ) -> dict[str, Any]:
        """Record the cycle ``run_id`` in ``manager_runs`` (kind 'cycle') and ``last_cycle_at``.

        Totals the counts the cycle phases remembered under this run id (so the Dagster
        job, whose assets run the phases one by one, records the same row as
        ``run_cycle``). A partition's cycle names its partition in the counts and keeps
        its own ``last_cycle_at``. Returns the recorded counts.
        """
        keys = {p: state_key(_phase_key(p), partition) for p in CYCLE_PHASES}
        states = self._get_states(list(keys.values()))
        counts: dict[str, Any] = {}
        starts: list[datetime] = []
        for phase in CYCLE_PHASES:
            value = states.get(keys[phase])
            if not value or value.get("run_id") != run_id:
                continue
            starts.append(utc(value["started_at"]))
            counts[phase] = value.get("counts", {})
        counts.update(extra_counts or {})
        now = self.mem.now()
        with self.mem.sources.begin() as c:
            c.execute(
                insert(manager_runs).values(
                    kind="cycle",
                    status=status,
                    started_at=min(starts) if starts else now,
                    finished_at=now,
                    counts={"run_id": run_id, **counts} | _partition_field(partition),
                )
            )
        self.mem.sources.set_state(state_key(LAST_CYCLE_AT, partition), now.isoformat())
        return counts

    def run_cycle(
        self,
        force_maintenance: bool = False,
        run_id: str | None = None,
        partition: str | None = None,
    ) -> PhaseReport:
        """One Memory Manager cycle: fold → extract → harden → gated maintenance (of one
        ``partition``, or of the whole pool).

        Every phase runs even if an earlier one failed (each has its own error
        handling, as in the reference); the cycle is then recorded Failed and a
        ``CycleError`` chained to the first failure is raised. Returns the counts of every
        phase in one flat report (maintenance counts prefixed ``maintenance_``).
        """
        run_id = run_id or new_id()
        started = self.mem.now()
        report = PhaseReport()
        errors: list[tuple[str, Exception]] = []
        phases = (
            ("fold", self.fold_injection_events),
            ("extract_notes", self.extract_notes),
            ("extract_examples", self.extract_examples),
            ("harden", self.harden),
        )
        for name, phase in phases:
            try:
                part = phase(run_id, partition)
            except Exception as e:  # each phase has its own error handling (reference §4.2)
                errors.append((name, e))
                continue
            for key, value in part.items():
                if name == "extract_examples" and key == "conversationsProcessed":
                    key = "exampleConversationsProcessed"
                report[key] = value
            report.changed.extend(part.changed)
        try:
            should, trigger = maintenance_trigger(self.mem, force_maintenance, partition)
            report["maintenanceTrigger"] = trigger
            report["maintenanceRan"] = bool(should)
            if should:
                part = run_maintenance(self.mem, trigger, run_id, partition)
                for key, value in part.items():
                    report[f"maintenance_{key}"] = value
                report.changed.extend(part.changed)
                report.extra["maintenance"] = dict(part)
        except Exception as e:
            errors.append(("maintenance", e))
        report["cycleSeconds"] = round((self.mem.now() - started).total_seconds(), 3)
        status = "Failed" if errors else "Completed"
        self.finish_cycle(
            run_id,
            status,
            {
                "maintenanceTrigger": report.get("maintenanceTrigger"),
                "maintenanceRan": report.get("maintenanceRan", False),
                "errors": [f"{n}: {e}" for n, e in errors],
            },
            partition,
        )
        self._step(
            run_id,
            "Decision",
            "Memory Manager Cycle",
            {"forceMaintenance": force_maintenance} | _partition_field(partition),
            {"status": status, "message": cycle_message(report)},
            started_at=started,
            ok=not errors,
            error="; ".join(f"{n}: {e}" for n, e in errors) or None,
        )
        if errors:
            name, first = errors[0]
            raise CycleError(
                f"Memory Manager cycle {run_id} failed in {', '.join(n for n, _ in errors)}: {first}"
            ) from first
        return report

    # -- sensor support -----------------------------------------------------------------------

    def cycle_signal(self, cursor: Mapping[str, Any] | None = None) -> CycleSignal:
        """Whether a cycle should start now: rated messages newer than the cursor, or a
        backlog of provisional notes newer than the cursor (reads only)."""
        cursor = dict(cursor or {})
        rated_after = utc(cursor["rated_after"]) if cursor.get("rated_after") else None
        with self.mem.sources.begin() as c:
            q = select(func.count(), func.max(messages.c.created_at)).where(
                messages.c.rating.is_not(None)
            )
            if rated_after is not None:
                q = q.where(messages.c.created_at > rated_after)
            new_rated, newest_rated = c.execute(q).one()
        prov = self.mem.store.notes.scan(
            and_(eq("status", NoteStatus.PROVISIONAL), eq("author_type", AuthorType.AGENT)),
            columns=["id", "created_at"],
        )
        prov_after = utc(cursor["provisional_after"]) if cursor.get("provisional_after") else None
        if prov_after is not None and len(prov):
            prov = prov[prov["created_at"] > prov_after]
        backlog = len(prov)
        newest_prov = prov["created_at"].max().to_pydatetime() if backlog else None
        reasons = []
        if new_rated:
            reasons.append(f"{new_rated} new rated message(s)")
        if backlog >= self.config.provisional_backlog:
            reasons.append(f"{backlog} new provisional note(s)")
        new_cursor = dict(cursor)
        if new_rated and newest_rated is not None:
            new_cursor["rated_after"] = utc(newest_rated).isoformat()
        if reasons and newest_prov is not None:
            new_cursor["provisional_after"] = utc(newest_prov).isoformat()
        if not reasons:
            return CycleSignal(
                False,
                f"no new rated messages; {backlog} new provisional note(s) "
                f"(backlog threshold {self.config.provisional_backlog})",
                new_cursor,
                provisional_backlog=backlog,
            )
        run_key = "cycle:" + stable_id(
            new_cursor.get("rated_after"), new_cursor.get("provisional_after")
        )
        return CycleSignal(True, "; ".join(reasons), new_cursor, run_key, int(new_rated), backlog)


def _example_as_text(example: Example) -> str:
    return f"Input: {example.example_input} Output: {example.example_output}"


def _example_note(example: Example) -> Note:
    """An example shown to the note dedupe judge as a note (its input and output as text)."""
    return Note(
        id=example.id,
        agent_id=example.agent_id,
        user_id=example.user_id,
        company_id=example.company_id,
        note=_example_as_text(example),
        type=NoteType.EXAMPLE,
        status=NoteStatus.ACTIVE,
    )


def cycle_message(report: Mapping[str, Any]) -> str:
    """The reference's final message (§4.2 step 9) for a cycle report."""
    msg = (
        f"Processed {report.get('conversationsProcessed', 0)} conversations "
        f"({report.get('messagesProcessed', 0)} messages) and {report.get('agentRunsProcessed', 0)} "
        f"agent runs. Created {report.get('notesCreated', 0)} notes and "
        f"{report.get('examplesCreated', 0)} examples."
    )
    if report.get("hardened") or report.get("deduped"):
        msg += (
            f" Hardened {report.get('hardened', 0)} provisional notes "
            f"({report.get('deduped', 0)} deduped, {report.get('failed', 0)} failed)."
        )
    if report.get("maintenanceRan"):
        parts = [
            f"{k.removeprefix('maintenance_')} {v}"
            for k, v in report.items()
            if k.startswith("maintenance_")
            and isinstance(v, int | float)
            and not isinstance(v, bool)
        ]
        msg += " Maintenance: " + ", ".join(parts) + "."
    return msg


__all__ = [
    "CycleError",
    "CycleSignal",
    "DEFAULT_CONFIG",
    "ManagerConfig",
    "MemoryManager",
    "MiningBatch",
    "cycle_message",
    "exact_scope",
    "failure_thread",
    "rating_class",
]
