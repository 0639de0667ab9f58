"""Tenancy checks, home checks and erasing a user. (SQL queries as named methods)"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection,
    Table,
    delete,
    false,
    func,
    or_,
    select,
    update,
)

from memory_pipelines.sources.base import SourcesBase, chunks
from memory_pipelines.sources.tables import (
    PURGED_USER,
    agent_runs,
    api_keys,
    conversations,
    injection_events,
    manager_runs,
    manager_state,
    messages,
    note_events,
    run_owners,
    run_steps,
    users,
    write_ledger,
)

_ERASE_CHUNK = 400


def _sqlite_file(url: str) -> Path | None:
    prefix = "sqlite:///"
    if url.startswith(prefix) and ":memory:" not in url:
        return Path(url[len(prefix) :])
    return None


def _vacuum_sqlite(path: Path) -> None:
    """Rewrite a SQLite file (no free pages keep deleted text) and truncate its WAL."""
    if not path.exists():
        return
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _delete_in(c: Connection, table: Table, column: Any, values: Sequence[Any]) -> int:
    """Delete the rows of ``table`` whose ``column`` is one of ``values`` (in chunks);
    how many."""
    n = 0
    for chunk in chunks(values, _ERASE_CHUNK):
        n += c.execute(delete(table).where(column.in_(chunk))).rowcount
    return n


def _erase_run_steps(c: Connection, doomed_step: Callable[[Mapping[str, Any]], bool]) -> int:
    """Delete the audit steps ``doomed_step`` picks; how many."""
    doomed_steps = set()
    for step in c.execute(
        select(
            run_steps.c.id,
            run_steps.c.user_id,
            run_steps.c.run_id,
            run_steps.c.agent_id,
            run_steps.c.input_json,
            run_steps.c.output_json,
            run_steps.c.error_message,
        )
    ).mappings():
        if doomed_step(step):
            doomed_steps.add(step["id"])
    steps_list = sorted(doomed_steps)
    for start in range(0, len(steps_list), _ERASE_CHUNK):
        c.execute(
            delete(run_steps).where(run_steps.c.id.in_(steps_list[start : start + _ERASE_CHUNK]))
        )
    return len(steps_list)


def _erase_injection_events(
    c: Connection, user_id: str, runs: Iterable[tuple[str | None, str]], item_ids: Sequence[str]
) -> int:
    """Delete the injection events of the user, of their runs (rows without a user) and
    of ``item_ids``; how many."""
    n_inj = c.execute(
        delete(injection_events).where(injection_events.c.user_id == user_id)
    ).rowcount
    for agent_id, rid in sorted(runs, key=lambda r: (r[0] or "", r[1])):
        n_inj += c.execute(
            delete(injection_events).where(
                injection_events.c.run_id == rid,
                injection_events.c.user_id.is_(None),
                *([injection_events.c.agent_id == agent_id] if agent_id is not None else []),
            )
        ).rowcount
    return n_inj + _delete_in(c, injection_events, injection_events.c.item_id, item_ids)


def _erase_note_events(c: Connection, user_id: str, item_ids: Sequence[str]) -> int:
    """Delete the lifecycle events of the user's notes, and any event naming one of
    them; how many."""
    items = set(item_ids)
    doomed_events = [
        eid
        for eid, uid, nid, related in c.execute(
            select(
                note_events.c.id,
                note_events.c.user_id,
                note_events.c.note_id,
                note_events.c.related_note_ids,
            )
        )
        if uid == user_id or nid in items or items.intersection(related or ())
    ]
    for chunk in chunks(doomed_events, _ERASE_CHUNK):
        c.execute(delete(note_events).where(note_events.c.id.in_(chunk)))
    return len(doomed_events)


def _erase_ledger_rows(c: Connection, doomed_ledger: Callable[[Mapping[str, Any]], bool]) -> int:
    """Delete the write-ledger rows ``doomed_ledger`` picks; how many."""
    doomed_rows = []
    for row in c.execute(
        select(
            write_ledger.c.agent_id,
            write_ledger.c.run_id,
            write_ledger.c.key,
            write_ledger.c.note_id,
            write_ledger.c.scope_key,
        )
    ).mappings():
        if doomed_ledger(row):
            doomed_rows.append((row["agent_id"], row["run_id"], row["key"]))
    for aid, rid, key in doomed_rows:
        c.execute(
            delete(write_ledger).where(
                write_ledger.c.agent_id == aid,
                write_ledger.c.run_id == rid,
                write_ledger.c.key == key,
            )
        )
    return len(doomed_rows)


def _scrub_manager_state(c: Connection, scrub_state: Callable[[Any], tuple[Any, bool]]) -> int:
    """Rewrite each manager-state value ``scrub_state`` changes; how many."""
    n_state = 0
    for key, value in list(c.execute(select(manager_state.c.key, manager_state.c.value))):
        new, changed = scrub_state(value)
        if changed:
            c.execute(update(manager_state).where(manager_state.c.key == key).values(value=new))
            n_state += 1
    return n_state


@dataclass(frozen=True)
class UserFootprint:
    """A user's SQL footprint, as ``purge_user`` needs it."""

    #: the user's conversations
    conversation_ids: list[str]
    #: ``(run_id, agent_id)`` of the agent runs of the user or of their conversations
    agent_runs: list[tuple[str, str | None]]
    #: ``(run_id, agent_id)`` named by the user's own audit rows (distinct)
    step_runs: list[tuple[str | None, str | None]]
    #: run ids another user owns
    other_users_runs: set[str]
    #: the texts and rating comments of the messages of the user's conversations
    message_texts: list[str]


class ErasureQueries(SourcesBase):
    """Tenancy checks, home checks and erasing a user."""

    # -- tenancy -------------------------------------------------------------------------------------

    def agent_names_company(self, agent_id: str) -> bool:
        """Whether an agent run, conversation or injection event of the agent names a company."""
        with self.begin() as c:
            for t in (agent_runs, conversations, injection_events):
                q = select(t.c.agent_id).where(
                    t.c.agent_id == agent_id, t.c.company_id.is_not(None)
                )
                if c.execute(q.limit(1)).first() is not None:
                    return True
        return False

    # -- home checks -----------------------------------------------------------------------------

    def note_references(self) -> int:
        """Rows that only exist once the note store held notes: write-ledger entries,
        recorded injections of notes and Memory Manager runs (0 for a fresh database)."""
        queries = [
            select(func.count()).select_from(write_ledger),
            select(func.count())
            .select_from(injection_events)
            .where(injection_events.c.item_kind == "note"),
            select(func.count()).select_from(manager_runs),
        ]
        with self.begin() as c:
            return sum(int(c.execute(q).scalar_one()) for q in queries)

    def probe_write(self) -> None:
        """Run a no-op update (it matches no row and is rolled back); the driver's error
        propagates unchanged when the database cannot be written."""
        with self.engine.connect() as c:
            c.execute(update(manager_state).where(false()).values(key=manager_state.c.key))
            c.rollback()

    # -- erasing a user ------------------------------------------------------------------------

    def user_footprint(self, user_id: str) -> UserFootprint:
        """What the SQL side knows of a user, read in one transaction (see :class:`UserFootprint`)."""
        with self.begin() as c:
            conv_ids = [
                r[0]
                for r in c.execute(
                    select(conversations.c.conversation_id).where(
                        conversations.c.user_id == user_id
                    )
                )
            ]
            run_q = select(agent_runs.c.run_id, agent_runs.c.agent_id).where(
                agent_runs.c.user_id == user_id
            )
            if conv_ids:
                run_q = run_q.where(
                    or_(agent_runs.c.user_id == user_id, agent_runs.c.conversation_id.in_(conv_ids))
                )
            run_rows = [(r[0], r[1]) for r in c.execute(run_q)]
            step_runs = [
                (rid, agent)
                for rid, agent in c.execute(
                    select(run_steps.c.run_id, run_steps.c.agent_id)
                    .where(run_steps.c.user_id == user_id)
                    .distinct()
                )
            ]
            others_runs = {
                r[0]
                for r in c.execute(
                    select(agent_runs.c.run_id).where(
                        agent_runs.c.user_id.is_not(None), agent_runs.c.user_id != user_id
                    )
                )
            }
            msg_texts: list[str] = []
            for chunk in chunks(conv_ids, _ERASE_CHUNK):
                for text_, comment in c.execute(
                    select(messages.c.text, messages.c.rating_comment).where(
                        messages.c.conversation_id.in_(chunk)
                    )
                ):
                    msg_texts.extend(t for t in (text_, comment) if t)
        return UserFootprint(
            conversation_ids=conv_ids,
            agent_runs=run_rows,
            step_runs=step_runs,
            other_users_runs=others_runs,
            message_texts=msg_texts,
        )

    def erase_user_rows(
        self,
        user_id: str,
        *,
        conversation_ids: Sequence[str],
        run_ids: Sequence[str],
        runs: Iterable[tuple[str | None, str]],
        item_ids: Sequence[str],
        doomed_step: Callable[[Mapping[str, Any]], bool],
        doomed_ledger: Callable[[Mapping[str, Any]], bool],
        scrub_state: Callable[[Any], tuple[Any, bool]],
        clock: Callable[[], datetime],
    ) -> dict[str, int]:
        """Delete a user's SQL rows in one transaction and return counts per table.

        Deletes the messages of ``conversation_ids``, the user's conversations, the agent
        runs ``run_ids``, the audit steps ``doomed_step`` picks, the injection events of the
        user, of their ``runs`` (``(agent_id, run_id)``; rows without a user) and of
        ``item_ids``, the note events of the user or naming one of ``item_ids``, the ledger rows ``doomed_ledger`` picks and the user row; rewrites each
        manager-state value ``scrub_state`` changes; revokes (at ``clock()``, unless already
        revoked) the API keys bound to the user, which forget whom they were bound to.
        """
        counts: dict[str, int] = {}
        with self.begin() as c:
            counts["messages"] = _delete_in(
                c, messages, messages.c.conversation_id, conversation_ids
            )
            counts["conversations"] = c.execute(
                delete(conversations).where(conversations.c.user_id == user_id)
            ).rowcount
            counts["agent_runs"] = _delete_in(c, agent_runs, agent_runs.c.run_id, run_ids)
            counts["run_steps"] = _erase_run_steps(c, doomed_step)
            counts["injection_events"] = _erase_injection_events(c, user_id, runs, item_ids)
            counts["note_events"] = _erase_note_events(c, user_id, item_ids)
            counts["write_ledger"] = _erase_ledger_rows(c, doomed_ledger)
            counts["run_owners"] = c.execute(
                delete(run_owners).where(run_owners.c.user_id == user_id)
            ).rowcount
            counts["manager_state"] = _scrub_manager_state(c, scrub_state)
            counts["users"] = c.execute(delete(users).where(users.c.user_id == user_id)).rowcount
            # keys bound to the user stop working and forget whom they were bound to; the rows
            # stay (revoked), so a home whose only key was purged keeps its API locked
            counts["api_keys"] = c.execute(
                update(api_keys)
                .where(api_keys.c.user_id == user_id)
                .values(
                    user_id=PURGED_USER,
                    revoked_at=func.coalesce(api_keys.c.revoked_at, clock()),
                )
            ).rowcount
        return counts

    def vacuum(self) -> None:
        """A SQLite file only: close the pooled connections, rewrite the file (no free page
        keeps deleted text) and truncate its WAL. Nothing for another database."""
        sql_file = _sqlite_file(self.url)
        if sql_file is not None:
            self.engine.dispose()  # pooled connections would keep the WAL from truncating
            _vacuum_sqlite(sql_file)
