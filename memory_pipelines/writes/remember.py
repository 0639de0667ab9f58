"""Learning from a conversation at once: ``MemoryService.remember(ctx, messages)``.

The messages (OpenAI chat format) are recorded as turns of the context's conversation
(``ctx.conversation_id``, else one conversation per run), the agent's judge extracts
durable notes from the new ones the same way the extraction phase does, and every
proposal goes through the guarded in-flight write path (``Provisional``, the run's cap,
the near-duplicate and instruction guards, provenance), so the Memory Manager later
hardens it like any agent write.

Guarantees and decisions:

* Everything is validated before anything is saved: ``messages`` is a list of
  ``{"role", "content"}`` objects; ``content`` is text or a list of content parts (the
  text parts are joined; images and other parts are ignored). Tool and function messages,
  and assistant messages without text (tool calls), are skipped; ``developer`` reads as
  ``system``. A bad item is a ``ValidationError`` naming ``messages[i]`` and its field.
* A message's id is derived from the conversation, its role, its text and how many
  identical messages come before it in the call, so the same messages remembered again
  (the whole history sent every turn, or a retry) are recognised: nothing new is recorded,
  extracted or written, and the call returns ``[]``.
* The judge reads the latest ``JUDGED_CHARS`` characters of the new turns (a longer
  message from its end); every turn is recorded whole, and the Memory Manager mines the
  recorded conversation later as usual.
* Only the judge's proposals that pass the extraction phase's filter (confidence, length)
  are written; the in-flight path decides the rest (a type other than Preference/Context
  is ``rejected-type`` there and is left for the Memory Manager, which mines the recorded
  messages on its next cycle and skips what is already stored).
* The writes are made before the messages are recorded, so a crash in between is
  repaired by calling again (the run's ledger answers the repeated writes). A judge that
  fails records the messages for the Memory Manager and raises ``JudgeError``.
* The run is claimed for the context's company and user first, as a write claims it; a
  run id or a conversation that belongs to another agent, user or company is refused
  (``RunConflictError``) before anything is read or recorded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memory_pipelines.agents import get_agent
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import JudgeError, RunConflictError, ValidationError
from memory_pipelines.judge import CandidateNote, ConversationMessage, judged_messages
from memory_pipelines.limits import check_id, limits, shown, unencodable_field, utf8_message
from memory_pipelines.notes import Note, NoteStatus, RunContext
from memory_pipelines.scope import note_scope_filter
from memory_pipelines.store import and_, eq
from memory_pipelines.writes.models import Disposition, WriteResult
from memory_pipelines.writes.ownership import check_run, claim_run

#: roles recorded as conversation turns (``developer`` is recorded as ``system``)
ROLES: tuple[str, ...] = ("user", "assistant", "system")
#: roles of the chat format that carry no conversation text: skipped
SKIPPED_ROLES: frozenset[str] = frozenset({"tool", "function"})
#: dispositions whose note now holds the fact (returned by ``remember``)
KEPT: frozenset[str] = frozenset(
    {Disposition.WRITTEN.value, Disposition.SUPERSEDED_OWN.value, Disposition.DEDUPED.value}
)

#: characters of the new turns the judge reads in one call (the latest ones): the offline
#: rules take about a second for this much text, and a model's prompt stays bounded
JUDGED_CHARS = 16_000

WriteFn = Callable[[RunContext, list[Any]], list[WriteResult]]


@dataclass(frozen=True)
class ChatTurn:
    """One message to remember: its role, its text and its id in the conversation."""

    role: str
    text: str
    message_id: str


def chat_turns(messages: Any) -> list[tuple[str, str]]:
    """``(role, text)`` of each message that carries conversation text, in order.

    Raises ``ValidationError`` naming ``messages[i]`` (and the field) for a malformed item."""
    if isinstance(messages, (str, bytes, bytearray, Mapping)) or not isinstance(messages, Sequence):
        raise ValidationError(
            f"messages must be a list of chat messages, got {type(messages).__name__}"
        )
    bound = limits().max_writes_per_request
    if len(messages) > bound:
        raise ValidationError(
            f"messages: at most {bound} messages per call, got {len(messages)}; nothing was saved"
        )
    turns: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, Mapping):
            raise ValidationError(f"{where} must be an object with role and content")
        bad = unencodable_field(dict(msg), where)
        if bad:
            raise ValidationError(utf8_message(bad))
        role = msg.get("role")
        if not isinstance(role, str):
            raise ValidationError(
                f"{where}.role must be one of {', '.join(ROLES)}, got {shown(role)}"
            )
        if role in SKIPPED_ROLES:
            continue
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise ValidationError(
                f"{where}.role must be one of {', '.join(ROLES)}, got {shown(role)}"
            )
        text = _content_text(msg.get("content"), where, allow_none=role == "assistant")
        if text:
            turns.append((role, text))
    return turns


def _content_text(content: Any, where: str, *, allow_none: bool) -> str:
    """The text of a message's ``content``: a string, or the text parts of a list."""
    if content is None and allow_none:  # an assistant message holding only tool calls
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise ValidationError(f"{where}.content[{j}] must be an object (a content part)")
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise ValidationError(f"{where}.content[{j}].text must be a string")
                texts.append(part["text"].strip())
        return "\n".join(t for t in texts if t)
    raise ValidationError(f"{where}.content must be a string or a list of content parts")


def conversation_of(ctx: RunContext) -> str:
    """The conversation the messages are recorded in: the context's, else one per run."""
    if ctx.conversation_id:
        return ctx.conversation_id
    digest = hashlib.sha256(f"{ctx.agent_id}\0{ctx.run_id}".encode()).hexdigest()
    return f"remember-{digest[:32]}"


def turn_ids(conversation_id: str, turns: Sequence[tuple[str, str]]) -> list[ChatTurn]:
    """Each turn with its deterministic message id (identical turns numbered in order)."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for role, text in turns:
        k = seen.get((role, text), 0)
        seen[(role, text)] = k + 1
        digest = hashlib.sha256(f"{conversation_id}\0{role}\0{k}\0{text}".encode()).hexdigest()
        out.append(ChatTurn(role, text, f"msg-{digest[:32]}"))
    return out


def remember(mem: MemoryContext, ctx: RunContext, messages: Any, write: WriteFn) -> list[Note]:
    """Record ``messages`` in the context's conversation, extract durable notes from the new
    ones with the agent's judge and save them through ``write`` (the in-flight path).

    Returns the notes that now hold what was learnt (written, rewritten or reinforced), in
    the judge's order; ``[]`` when the messages were remembered before in this run or
    nothing durable was found. Raises ``UnknownAgentError``, ``ValidationError`` (no run
    id, a malformed message), ``RunConflictError`` (a run or conversation of another
    context) and ``JudgeError``."""
    turns = chat_turns(messages)
    agent = get_agent(mem.sources, ctx.agent_id)
    if not ctx.run_id:
        raise ValidationError("run_id is required to remember messages (RunContext.run_id)")
    conversation_id = conversation_of(ctx)
    check_id("conversation_id", conversation_id)
    check_run(mem, ctx)  # another tenant's run id: RunConflictError, before anything is read
    _check_owner(mem, ctx, conversation_id)
    recorded = _recorded_ids(mem, conversation_id)
    new = [t for t in turn_ids(conversation_id, turns) if t.message_id not in recorded]
    if not new:
        return []
    claim_run(mem, ctx)  # the run is this context's from now on, as a write claims it
    run = ctx.model_copy(update={"conversation_id": conversation_id})
    notes: list[Note] = []
    if agent.allow_memory_write and any(t.role == "user" for t in new):
        try:
            notes = _extract_and_write(mem, run, new, write)
        except JudgeError as e:
            _record(mem, run, new)
            raise JudgeError(
                f"the judge could not extract notes ({e}); the messages were recorded and the"
                " Memory Manager will extract from them on its next cycle"
            ) from e
    _record(mem, run, new)
    return notes


def _check_owner(mem: MemoryContext, ctx: RunContext, conversation_id: str) -> None:
    conv = mem.sources.get_conversation(conversation_id)
    who = ("agent_id", "user_id", "company_id")
    if conv is not None and any(conv.get(k) != getattr(ctx, k) for k in who):
        raise RunConflictError(
            f"conversation {conversation_id!r} belongs to another agent, user or company"
        )


def _recorded_ids(mem: MemoryContext, conversation_id: str) -> set[str]:
    return {m["message_id"] for m in mem.sources.messages_of(conversation_id)}


def _extract_and_write(
    mem: MemoryContext, run: RunContext, new: Sequence[ChatTurn], write: WriteFn
) -> list[Note]:
    """Ask the judge (as the extraction phase does), filter, and write per source message."""
    shown_msgs = _judged(new, mem.now())
    if not any(m.role == "user" for m in shown_msgs):
        return []
    proposals = mem.judge.extract_notes(
        shown_msgs, _existing_for_judge(mem, run, new), rating_context="unrated"
    )
    last_user = next(m.message_id for m in reversed(shown_msgs) if m.role == "user")
    ids = {m.message_id for m in shown_msgs}
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in proposals:
        request = _write_request(mem, c)
        if request is not None:
            source = c.source_message_id if c.source_message_id in ids else last_user
            groups.setdefault(source, []).append(request)
    kept: dict[str, None] = {}
    for source, requests in groups.items():
        ctx = run.model_copy(update={"conversation_detail_id": source})
        for r in write(ctx, requests):
            if r.disposition in KEPT and r.note_id:
                kept[r.note_id] = None
    found = {n.id: n for n in mem.store.notes.get_many(list(kept))}
    return [found[i] for i in kept if i in found]


def _judged(new: Sequence[ChatTurn], now: datetime) -> list[ConversationMessage]:
    """The new turns as the judge reads them: the latest ``JUDGED_CHARS`` characters of
    them in all (a longer message is read from its end; older turns past the budget are
    left to the Memory Manager), each message within the extraction's per-message bound
    (:func:`~memory_pipelines.judge.judged_messages`), so one call's judging time is
    bounded."""
    turns = [ConversationMessage(t.role, t.text, message_id=t.message_id, sent_at=now) for t in new]
    return judged_messages(turns, total_chars=JUDGED_CHARS)


def _write_request(mem: MemoryContext, c: CandidateNote) -> dict[str, Any] | None:
    """The in-flight write of one proposal, or None when the extraction filter drops it."""
    cfg = mem.manager_config
    content = (c.content or "").strip()
    if float(c.confidence or 0) < cfg.min_confidence or len(content) < cfg.min_content_length:
        return None
    hint = "user" if (c.scope_level or "user").lower() == "user" else "agent"
    return {"note": content, "type": c.type, "scopeHint": hint}


def _existing_for_judge(mem: MemoryContext, run: RunContext, new: Sequence[ChatTurn]) -> list[Note]:
    """The Active notes the context sees, closest to the new messages first (as the
    extraction phase shows the judge)."""
    where = and_(
        note_scope_filter(run.agent_id, run.user_id, run.company_id),
        eq("status", NoteStatus.ACTIVE),
    )
    (query,) = mem.embed([" ".join(t.text for t in new)[:4000]])
    hits = mem.store.notes.vector_search(
        query, where=where, k=mem.manager_config.existing_notes_for_judge
    )
    return [h.item for h in hits]


def _record(mem: MemoryContext, run: RunContext, new: Sequence[ChatTurn]) -> None:
    """Record the new turns in the run's conversation (created for the context if new)."""
    conversation_id = run.conversation_id
    assert conversation_id is not None
    if mem.sources.get_conversation(conversation_id) is None:
        mem.sources.add_conversation(conversation_id, run.agent_id, run.user_id, run.company_id)
    for t in new:
        mem.sources.add_message(conversation_id, t.message_id, t.role, t.text)
