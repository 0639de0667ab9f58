"""Erasing a user: ``memory-pipelines purge-user ID`` and ``MemoryService.purge_user``.

Deleting a user's source row (``svc.delete_user``) leaves their notes for stale-reference
pruning to archive; purging erases them. ``purge_user`` goes by ownership and provenance:
the user's runs are the agent runs of the user or of one of their conversations, and the
runs their own audit rows name (an in-flight write records no agent run). It removes every
note and example of the user (their own scope, or without a user and sourced from one of
their conversations or runs, such as an agent-wide note they wrote, plus any note derived
from one of those), their conversations and messages, agent runs, audit steps (rows of
the user or of their runs, and rows of no user and no other user's run whose payload
mentions a purged note's id or text, such as the Memory Manager's), injection events,
write-ledger rows, the embedding-cache entries of the purged texts, the manager-state
entries that name purged notes, and the user row. A row of another user is never matched
by its text, even when it holds the same words. Then it makes
the old data unrecoverable: LanceDB tables are compacted with every deletion
materialised, the full-text index is rebuilt, every older table version and unreferenced
file is removed, and the SQLite files are vacuumed with their WAL truncated, so no
deleted text survives in data, index, version or free-page bytes under the home folder.

Run it while no other process is writing to the home: removing old versions with a zero
age invalidates readers that hold them (see stack notes, LanceDB).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.embeddings import CachedEmbedder
from memory_pipelines.errors import ValidationError
from memory_pipelines.phases.lease import exclusive
from memory_pipelines.store import and_, eq, in_, is_null
from memory_pipelines.store import or_ as any_of

_CHUNK = 400


@dataclass(frozen=True)
class PurgeCounts:
    """What ``purge_user`` removed (returned as a plain dict)."""

    user_id: str
    notes: int
    examples: int
    conversations: int
    messages: int
    agent_runs: int
    run_steps: int
    injection_events: int
    note_events: int
    write_ledger: int
    run_owners: int
    manager_state: int
    embedding_cache: int
    users: int
    api_keys: int
    lance_versions_removed: int


def _chunks(items: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield list(items[start : start + _CHUNK])


def mentions(payload: Any, needles: Sequence[str]) -> bool:
    if payload is None or not needles:
        return False
    text = (
        payload
        if isinstance(payload, str)
        else json.dumps(payload, ensure_ascii=False, default=str)
    )
    return any(n in text for n in needles)


def _scrub(value: Any, needles: Sequence[str]) -> tuple[Any, bool]:
    """Drop dict entries and list items that mention a needle; returns (value, changed)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        changed = False
        for k, v in value.items():
            if mentions(str(k), needles) or (isinstance(v, str) and mentions(v, needles)):
                changed = True
                continue
            nv, ch = _scrub(v, needles)
            out[k] = nv
            changed = changed or ch
        return out, changed
    if isinstance(value, list):
        items: list[Any] = []
        changed = False
        for v in value:
            if isinstance(v, str) and mentions(v, needles):
                changed = True
                continue
            nv, ch = _scrub(v, needles)
            items.append(nv)
            changed = changed or ch
        return items, changed
    if isinstance(value, str) and mentions(value, needles):
        return None, True
    return value, False


def _provenance(conv_ids: list[str], runs: set[tuple[str | None, str]]):
    """Rows sourced from one of the conversations, or from one of the runs of its agent
    (run ids are per agent); None when there are neither."""
    by_agent: dict[str | None, list[str]] = {}
    for agent_id, run_id in sorted(runs, key=lambda r: (r[0] or "", r[1])):
        by_agent.setdefault(agent_id, []).append(run_id)
    conds = [in_("source_conversation_id", conv_ids)] if conv_ids else []
    for agent_id, run_ids in by_agent.items():
        agent = eq("agent_id", agent_id) if agent_id is not None else None
        conds.append(and_(agent, in_("source_run_id", run_ids)))
    return any_of(*conds) if conds else None


def _owned(user_id: str, conv_ids: list[str], runs: set[tuple[str | None, str]]):
    """The user's rows: their own scope, or no user and sourced from their conversations
    or runs (never another user's row)."""
    provenance = _provenance(conv_ids, runs)
    if provenance is None:
        return eq("user_id", user_id)
    return any_of(eq("user_id", user_id), and_(is_null("user_id"), provenance))


def _user_notes(
    mem: MemoryContext, user_id: str, conv_ids: list[str], runs: set[tuple[str | None, str]]
):
    """Every note of the user: own scope, without a user and sourced from their
    conversations/runs, or derived (transitively) from such a note."""
    table = mem.store.notes
    cond = _owned(user_id, conv_ids, runs)
    found = {n.id: n for n in table.all(cond)}
    everything = table.scan(None, ["id", "derived_from_note_ids", "consolidated_into_note_id"])
    links: list[tuple[str, set[str]]] = []
    for row in everything.itertuples(index=False):
        refs = set(row.derived_from_note_ids if row.derived_from_note_ids is not None else [])
        if isinstance(row.consolidated_into_note_id, str):
            refs.add(row.consolidated_into_note_id)
        links.append((row.id, refs))
    grown = True
    while grown:
        grown = False
        extra = [i for i, refs in links if i not in found and refs & found.keys()]
        if extra:
            for n in table.get_many(extra):
                found[n.id] = n
            grown = True
    return list(found.values())


def _of_runs(agent_id: str | None, run_id: str | None, runs: set[tuple[str | None, str]]) -> bool:
    """Whether a row of ``agent_id`` names one of the runs (a row without an agent: any
    agent's run of that id)."""
    if run_id is None:
        return False
    if agent_id is None:
        return any(rid == run_id for _, rid in runs)
    return (agent_id, run_id) in runs or (None, run_id) in runs


def user_seen(mem: MemoryContext, user_id: str) -> bool:
    """Whether the home knows ``user_id`` at all: registered (or deleted) in the SQL
    sources, owning conversations, runs or audit rows, or named by a note or example."""
    src = mem.sources
    if src.existing_ids("user", [user_id]) or src.deleted_ids("user", [user_id]):
        return True
    footprint = src.user_footprint(user_id)
    if footprint.conversation_ids or footprint.agent_runs or footprint.step_runs:
        return True
    return bool(
        mem.store.notes.count(eq("user_id", user_id))
        or mem.store.examples.count(eq("user_id", user_id))
    )


def purge_user(
    mem: MemoryContext, user_id: str, *, lease_wait_s: float | None = None
) -> dict[str, Any]:
    """Erase everything of one user from the memory home and return counts.

    Reads the SQL sources for the user's conversations and runs, deletes their notes and
    examples from LanceDB and their rows from every SQL table (audit steps that mention a
    purged note's id or text included), removes the purged texts from the embedding
    cache, then compacts/cleans LanceDB and vacuums SQLite so nothing is recoverable from
    old versions or free pages. Other users' data is untouched. Idempotent.

    The erasure runs under the home's Memory Manager lease, waiting up to
    ``lease_wait_s`` for it (default ``ManagerConfig.lease_wait_s``); past the wait it
    raises ``ManagerBusyError`` having changed nothing.
    """
    if not isinstance(user_id, str) or not user_id.strip():
        raise ValidationError("user_id must be a non-empty string")
    mem.sources.flush_injection_events()  # buffered attribution rows are erased like the others
    if not user_seen(mem, user_id):  # a typo: change nothing (no old version dropped)
        return {f.name: 0 for f in fields(PurgeCounts)} | {"user_id": user_id}
    # dropping every old version also deletes files no version references yet, which a
    # Memory Manager run on this home may be about to commit: hold its lease, from before
    # the first change, so a busy home is left as it was
    with exclusive(mem, wait_s=lease_wait_s):
        mem.sources.flush_injection_events()  # what was injected while this waited
        return _purge(mem, user_id)


@dataclass
class _Erasure:
    """What purging one user erases: their conversations and runs (and the runs of other
    users, whose rows are never matched by text), their notes and examples, the texts to
    forget and the needles an audit payload must not mention."""

    user_id: str
    conv_ids: Sequence[str]
    run_ids: list[str]
    runs: set[tuple[str | None, str]]
    others_runs: Collection[str]
    msg_texts: list[str]
    note_ids: list[str]
    example_ids: list[str]
    texts: list[str]
    needles: list[str]

    def doomed_step(self, step: Mapping[str, Any]) -> bool:
        """An audit step of the user or of their runs, or of no user and no other user's
        run that mentions a purged id or text (e.g. a Memory Manager step naming a note)."""
        uid, rid, aid = step["user_id"], step["run_id"], step["agent_id"]
        if uid == self.user_id or (uid is None and _of_runs(aid, rid, self.runs)):
            return True
        return (
            uid is None
            and rid not in self.others_runs
            and any(
                mentions(step[k], self.needles)
                for k in ("input_json", "output_json", "error_message")
            )
        )

    def doomed_ledger(self, row: Mapping[str, Any], purged: Collection[str]) -> bool:
        """A write-ledger row of the user's scope, naming a purged note, or of no user and
        one of their runs."""
        parts = (row["scope_key"] or "").split("|")
        owner = parts[1] if len(parts) > 1 else ""
        return (
            owner == self.user_id
            or row["note_id"] in purged
            or (not owner and _of_runs(row["agent_id"], row["run_id"], self.runs))
        )


def _purge(mem: MemoryContext, user_id: str) -> dict[str, Any]:
    erasure = _what_to_erase(mem, user_id)
    for chunk in _chunks(erasure.note_ids):
        mem.store.notes.delete(in_("id", chunk))
    for chunk in _chunks(erasure.example_ids):
        mem.store.examples.delete(in_("id", chunk))
    purged = set(erasure.note_ids)
    counts = mem.sources.erase_user_rows(
        user_id,
        conversation_ids=erasure.conv_ids,
        run_ids=erasure.run_ids,
        runs=erasure.runs,
        item_ids=[*erasure.note_ids, *erasure.example_ids],
        doomed_step=erasure.doomed_step,
        doomed_ledger=lambda row: erasure.doomed_ledger(row, purged),
        scrub_state=lambda value: _scrub(value, erasure.needles),
        clock=mem.clock,
    )
    emb = mem.embedder
    texts = [*erasure.texts, *erasure.msg_texts]
    counts["embedding_cache"] = emb.forget(texts) if isinstance(emb, CachedEmbedder) else 0
    removed = mem.store.notes.erase_old_versions() + mem.store.examples.erase_old_versions()
    mem.sources.vacuum()
    return asdict(
        PurgeCounts(
            user_id=user_id,
            notes=len(erasure.note_ids),
            examples=len(erasure.example_ids),
            lance_versions_removed=removed,
            **counts,
        )
    )


def _what_to_erase(mem: MemoryContext, user_id: str) -> _Erasure:
    """The user's footprint in the SQL sources, and their notes and examples."""
    footprint = mem.sources.user_footprint(user_id)
    conv_ids = footprint.conversation_ids
    run_rows = footprint.agent_runs
    # the user's runs: their agent runs, and the runs their own audit rows name
    runs: set[tuple[str | None, str]] = {(agent, rid) for rid, agent in run_rows}
    runs.update((agent, rid) for rid, agent in footprint.step_runs if rid)
    msg_texts = footprint.message_texts
    notes = _user_notes(mem, user_id, conv_ids, runs)
    note_ids = [n.id for n in notes]
    examples = mem.store.examples.all(_owned(user_id, conv_ids, runs))
    example_ids = [e.id for e in examples]
    texts = [n.note for n in notes] + [
        t for e in examples for t in (e.example_input, e.example_output)
    ]
    texts.extend(n.comments for n in notes if n.comments)
    # What an audit payload must not mention (ids, texts and message texts; short strings
    # would match by accident, so only texts of some length count).
    needles = list(
        dict.fromkeys([*note_ids, *example_ids, *(t for t in texts + msg_texts if len(t) >= 12)])
    )
    return _Erasure(
        user_id=user_id,
        conv_ids=conv_ids,
        run_ids=[rid for rid, _ in run_rows],
        runs=runs,
        # runs another user owns: their rows are never matched by text
        others_runs=footprint.other_users_runs,
        msg_texts=msg_texts,
        note_ids=note_ids,
        example_ids=example_ids,
        texts=texts,
        needles=needles,
    )
