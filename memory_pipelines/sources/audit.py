"""The audit trail: run steps, the write ledger, injection events and note history. (SQL queries as named methods)"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.exc import IntegrityError

from memory_pipelines.sources.base import SourcesBase
from memory_pipelines.sources.tables import (
    injection_events,
    jsonable,
    ledger_agent,
    run_steps,
    write_ledger,
)

log = logging.getLogger(__name__)
#: creates the per-Sources event buffer exactly once
_BUFFER_GUARD = threading.Lock()


class _EventBuffer:
    """``injection_events`` rows and 'Memory Injection' ``run_steps`` rows waiting for
    their batch insert (one per Sources)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards rows, steps, limits and the timer
        self.flushing = threading.Lock()  # one insert at a time, in buffer order
        self.rows: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []  # prepared run_steps rows
        self.max_events = 0  # 0: not buffering (each injection commits its rows)
        self.max_seconds = 0.0
        self.timer: threading.Timer | None = None


def _step_row(step: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The ``run_steps`` row of a step given as the keyword arguments of
    :meth:`AuditQueries.add_step` (``now`` for the times not given)."""
    return {
        "run_id": step["run_id"],
        "agent_id": step.get("agent_id"),
        "user_id": step.get("user_id"),
        "step_type": step["step_type"],
        "step_name": step["step_name"],
        "input_json": jsonable(step.get("input")),
        "output_json": jsonable(step.get("output")),
        "status": step.get("status", "Completed"),
        "error_message": step.get("error_message"),
        "started_at": step.get("started_at") or now,
        "finished_at": step.get("finished_at") or now,
    }


class AuditQueries(SourcesBase):
    """The audit trail: run steps, the write ledger, injection events and note history."""

    # -- audit -------------------------------------------------------------------------------

    def add_step(
        self,
        run_id: str,
        step_type: str,
        step_name: str,
        input: Any = None,
        output: Any = None,
        status: str = "Completed",
        error_message: str | None = None,
        started_at: datetime | None = None,
        finished_at: datetime | None = None,
        agent_id: str | None = None,
        user_id: str | None = None,
    ) -> int:
        self._flush_buffered_steps()
        now = self.clock()
        with self.begin() as c:
            res = c.execute(
                insert(run_steps).values(
                    run_id=run_id,
                    agent_id=agent_id,
                    user_id=user_id,
                    step_type=step_type,
                    step_name=step_name,
                    input_json=jsonable(input),
                    output_json=jsonable(output),
                    status=status,
                    error_message=error_message,
                    started_at=started_at or now,
                    finished_at=finished_at or now,
                )
            )
            return int(res.inserted_primary_key[0])

    def add_step_batch(self, steps: Sequence[dict[str, Any]]) -> None:
        """Insert audit steps, each given as the keyword arguments of :meth:`add_step`, in
        one transaction: the rows are exactly those ``add_step`` would insert one by one."""
        if not steps:
            return
        self._flush_buffered_steps()
        now = self.clock()
        rows = [_step_row(s, now) for s in steps]
        with self.begin() as c:
            c.execute(insert(run_steps), rows)

    def steps(
        self, run_id: str | None = None, step_name: str | None = None
    ) -> list[dict[str, Any]]:
        self._flush_buffered_steps()
        q = select(run_steps).order_by(run_steps.c.id)
        if run_id is not None:
            q = q.where(run_steps.c.run_id == run_id)
        if step_name is not None:
            q = q.where(run_steps.c.step_name == step_name)
        with self.begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def add_steps(self, rows: Sequence[dict[str, Any]]) -> None:
        """Insert prepared ``run_steps`` rows (column values as given) in one transaction."""
        self._flush_buffered_steps()
        with self.begin() as c:
            c.execute(insert(run_steps), list(rows))

    # -- write ledger ---------------------------------------------------------------------------

    def ledger_rows(self, run_id: str, agent_id: str | None = None) -> list[dict[str, Any]]:
        """Every ``write_ledger`` row of a run of ``agent_id`` (the run's within-run write
        state); of every agent that used the run id when ``agent_id`` is None."""
        q = select(write_ledger).where(write_ledger.c.run_id == run_id)
        if agent_id is not None:
            q = q.where(write_ledger.c.agent_id == agent_id)
        with self.begin() as c:
            return [
                dict(r)
                for r in c.execute(
                    q.order_by(write_ledger.c.created_at, write_ledger.c.key)
                ).mappings()
            ]

    def ledger_claim(self, rows: Sequence[dict[str, Any]]) -> bool:
        """Insert ledger rows in one transaction: the commit point of a write.

        Returns False, having inserted nothing, when any ``(agent_id, run_id, key)`` already
        exists (another writer of the same run got there first); ``created_at`` defaults to
        now, ``agent_id`` to the agent of the row's scope key.
        """
        if not rows:
            return True
        now = self.clock()
        values = [
            {"created_at": now, **r, "agent_id": r.get("agent_id") or ledger_agent(r["scope_key"])}
            for r in rows
        ]
        try:
            with self.begin() as c:
                c.execute(insert(write_ledger), values)
        except IntegrityError:
            return False
        return True

    def ledger_release(self, run_id: str, keys: Sequence[str], agent_id: str | None = None) -> int:
        """Delete ledger rows of a run (undoes a claim whose action then failed); only the
        rows of ``agent_id`` when given."""
        if not keys:
            return 0
        cond = [write_ledger.c.run_id == run_id, write_ledger.c.key.in_(list(keys))]
        if agent_id is not None:
            cond.append(write_ledger.c.agent_id == agent_id)
        with self.begin() as c:
            return c.execute(delete(write_ledger).where(*cond)).rowcount

    # -- injection events -------------------------------------------------------------------------

    def record_injection(
        self, events: Sequence[dict[str, Any]], step: dict[str, Any] | None = None
    ) -> None:
        """Append ``injection_events`` rows and, when given, one audit step, in one transaction.

        Each event holds run_id, agent_id, user_id, company_id, item_kind ('note' or
        'example'), item_id, rank and injected_at; ``step`` holds the keyword arguments of
        :meth:`add_step` (run_id, step_type, step_name, input, output, agent_id, user_id).
        Append-only: nothing is updated.
        """
        if not events and step is None:
            return
        if step is not None:
            self._flush_buffered_steps()
        with self.begin() as c:
            if events:
                c.execute(insert(injection_events), [dict(e) for e in events])
            if step is not None:
                c.execute(insert(run_steps), [_step_row(step, self.clock())])

    def injection_events_of(
        self, run_id: str | None = None, item_kind: str | None = None
    ) -> list[dict[str, Any]]:
        """``injection_events`` rows in insertion order, optionally for one run or item kind."""
        self.flush_injection_events()
        q = select(injection_events).order_by(injection_events.c.id)
        if run_id is not None:
            q = q.where(injection_events.c.run_id == run_id)
        if item_kind is not None:
            q = q.where(injection_events.c.item_kind == item_kind)
        with self.begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def injection_counts(
        self, item_ids: Sequence[str], item_kind: str = "note"
    ) -> dict[str, tuple[int, datetime | None]]:
        """How often each of ``item_ids`` was injected, and when last (items never injected
        are absent)."""
        if not item_ids:
            return {}
        self.flush_injection_events()
        t = injection_events
        q = (
            select(t.c.item_id, func.count(), func.max(t.c.injected_at))
            .where(t.c.item_kind == item_kind, t.c.item_id.in_(list(item_ids)))
            .group_by(t.c.item_id)
        )
        with self.begin() as c:
            return {item: (int(n), last) for item, n, last in c.execute(q)}

    # -- buffered injection events (group commit of the read path's attribution) -------------

    def _event_buffer(self) -> _EventBuffer:
        buf = self.__dict__.get("_injection_buffer")
        if buf is None:
            with _BUFFER_GUARD:
                buf = self.__dict__.setdefault("_injection_buffer", _EventBuffer())
        return buf

    def buffer_injection_events(self, max_events: int, max_seconds: float) -> None:
        """Buffer the ``injection_events`` rows and the audit step of
        :meth:`record_injection_buffered` in this process and insert them in batches: once
        ``max_events`` rows (events and steps together) wait (by the call that reaches
        it), ``max_seconds`` after the first waiting row (by a timer thread), and on
        :meth:`flush_injection_events` (which this object's event and step readers, the
        fold and ``purge_user`` call first, and ``close`` of the service). A step inserted
        any other way flushes the waiting steps first, so ``run_steps`` keep the order
        they were recorded in. A hard crash loses at most the rows waiting: fewer than
        ``max_events``, none older than ``max_seconds``. ``max_events=0`` turns
        buffering off (after flushing)."""
        buf = self._event_buffer()
        with buf.lock:
            buf.max_events = max(0, int(max_events))
            buf.max_seconds = max(0.0, float(max_seconds))
        if not buf.max_events:
            self.flush_injection_events()

    def record_injection_buffered(
        self, events: Sequence[dict[str, Any]], step: dict[str, Any] | None = None
    ) -> None:
        """:meth:`record_injection`, with the events and the audit step buffered when
        buffering is on (the step's row is prepared now, with the times of now)."""
        step_row = _step_row(step, self.clock()) if step is not None else None
        buf = self._event_buffer()
        with buf.lock:
            buffering = buf.max_events > 0
            full = False
            if buffering and (events or step_row):
                buf.rows.extend(dict(e) for e in events)
                if step_row is not None:
                    buf.steps.append(step_row)
                full = len(buf.rows) + len(buf.steps) >= buf.max_events
                if not full and buf.timer is None:
                    buf.timer = threading.Timer(buf.max_seconds, self._timed_flush)
                    buf.timer.daemon = True
                    buf.timer.start()
        if not buffering:
            self.record_injection(events, step)
            return
        if full:
            self.flush_injection_events()

    def _flush_buffered_steps(self) -> None:
        """Flush the buffer when audit steps wait in it (before a step is inserted or
        read another way, so ``run_steps`` ids follow the order steps were recorded in)."""
        buf = self.__dict__.get("_injection_buffer")
        if buf is not None and buf.steps:
            self.flush_injection_events()

    def pending_injection_events(self) -> int:
        """How many rows (``injection_events`` and their audit steps) wait in this
        process's buffer."""
        buf = self._event_buffer()
        with buf.lock:
            return len(buf.rows) + len(buf.steps)

    def injection_events_after(self, after_id: int, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` ``(id, item_kind, item_id, injected_at)`` injection events with
        an id above ``after_id``, in id order (what the Memory Manager folds next)."""
        self.flush_injection_events()
        with self.begin() as c:
            return [
                tuple(r)
                for r in c.execute(
                    select(
                        injection_events.c.id,
                        injection_events.c.item_kind,
                        injection_events.c.item_id,
                        injection_events.c.injected_at,
                    )
                    .where(injection_events.c.id > after_id)
                    .order_by(injection_events.c.id)
                    .limit(limit)
                ).all()
            ]

    def recent_injection_scopes(
        self, most: int, events: int = 2_000
    ) -> list[tuple[str, str | None, str | None]]:
        """The ``(agent_id, user_id, company_id)`` of the newest ``events`` note injection
        events, distinct, newest first, at most ``most`` of them (the scopes in use; one
        read of the id index's tail, whatever the table holds)."""
        if most <= 0:
            return []
        t = injection_events
        with self.begin() as c:
            rows = c.execute(
                select(t.c.agent_id, t.c.user_id, t.c.company_id)
                .where(t.c.item_kind == "note")
                .order_by(t.c.id.desc())
                .limit(events)
            ).all()
        return list(dict.fromkeys(tuple(r) for r in rows))[:most]

    def note_injection_stats(self) -> dict[str, tuple[int, datetime]]:
        """Per injected note id: how many injection events it has and the latest time."""
        self.flush_injection_events()
        ev = injection_events
        q = (
            select(ev.c.item_id, func.count(), func.max(ev.c.injected_at))
            .where(ev.c.item_kind == "note")
            .group_by(ev.c.item_id)
        )
        with self.begin() as c:
            return {row[0]: (int(row[1]), row[2]) for row in c.execute(q)}

    def flush_injection_events(self) -> int:
        """Insert every buffered ``injection_events`` row and audit step now, in one
        transaction, in the order they were recorded; returns how many rows. Waits for a
        flush in progress, so a read after this call sees every row recorded before it."""
        buf = self.__dict__.get("_injection_buffer")
        if buf is None:
            return 0
        with buf.flushing:
            with buf.lock:
                rows, buf.rows = buf.rows, []
                steps, buf.steps = buf.steps, []
                if buf.timer is not None:
                    buf.timer.cancel()
                    buf.timer = None
            if not rows and not steps:
                return 0
            try:
                with self.begin() as c:
                    if rows:
                        c.execute(insert(injection_events), rows)
                    if steps:
                        c.execute(insert(run_steps), steps)
            except Exception:
                with buf.lock:  # keep them for the next flush
                    buf.rows[:0] = rows
                    buf.steps[:0] = steps
                raise
            return len(rows) + len(steps)

    def _timed_flush(self) -> None:
        try:
            self.flush_injection_events()
        except Exception as e:  # retried by the next flush; the rows stay buffered
            log.warning(
                "injection events flush failed (%d rows kept): %s",
                self.pending_injection_events(),
                e,
            )
            buf = self._event_buffer()
            with buf.lock:
                if buf.timer is None and (buf.rows or buf.steps) and buf.max_events:
                    buf.timer = threading.Timer(buf.max_seconds, self._timed_flush)
                    buf.timer.daemon = True
                    buf.timer.start()

    # -- note history ------------------------------------------------------------------------------

    def steps_naming_notes(self, step_name: str, note_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The ``step_name`` audit steps whose output ``noteId`` is one of ``note_ids``, oldest
        first: their run_id, output_json, status, finished_at and the note_id they name."""
        if not note_ids:
            return []
        self._flush_buffered_steps()
        note_col = run_steps.c.output_json["noteId"].as_string()
        q = (
            select(
                run_steps.c.run_id,
                run_steps.c.output_json,
                run_steps.c.status,
                run_steps.c.finished_at,
                note_col,
            )
            .where(run_steps.c.step_name == step_name, note_col.in_(list(note_ids)))
            .order_by(run_steps.c.id)
        )
        with self.begin() as c:
            return [
                {
                    "run_id": run_id,
                    "output_json": output,
                    "status": status,
                    "finished_at": at,
                    "note_id": note_id,
                }
                for run_id, output, status, at, note_id in c.execute(q)
            ]

    def delete_run_steps(self, doomed: Callable[[Mapping[str, Any]], bool]) -> int:
        """Delete the audit steps ``doomed`` picks (given id, run/agent/user ids and the
        payloads); returns how many (erasing one note's text from the audit)."""
        self._flush_buffered_steps()
        cols = (
            run_steps.c.id,
            run_steps.c.run_id,
            run_steps.c.agent_id,
            run_steps.c.user_id,
            run_steps.c.input_json,
            run_steps.c.output_json,
            run_steps.c.error_message,
        )
        with self.begin() as c:
            ids = [r["id"] for r in c.execute(select(*cols)).mappings() if doomed(r)]
            for start in range(0, len(ids), 400):
                c.execute(delete(run_steps).where(run_steps.c.id.in_(ids[start : start + 400])))
        return len(ids)
