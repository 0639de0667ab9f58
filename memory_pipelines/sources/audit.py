"""The audit trail: run steps, the write ledger, injection events and note history. (SQL queries as named methods)"""

from __future__ import annotations

from collections.abc import Sequence
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
        now = self.clock()
        rows = [
            {
                "run_id": s["run_id"],
                "agent_id": s.get("agent_id"),
                "user_id": s.get("user_id"),
                "step_type": s["step_type"],
                "step_name": s["step_name"],
                "input_json": jsonable(s.get("input")),
                "output_json": jsonable(s.get("output")),
                "status": s.get("status", "Completed"),
                "error_message": s.get("error_message"),
                "started_at": s.get("started_at") or now,
                "finished_at": s.get("finished_at") or now,
            }
            for s in steps
        ]
        with self.begin() as c:
            c.execute(insert(run_steps), rows)

    def steps(
        self, run_id: str | None = None, step_name: str | None = None
    ) -> list[dict[str, Any]]:
        q = select(run_steps).order_by(run_steps.c.id)
        if run_id is not None:
            q = q.where(run_steps.c.run_id == run_id)
        if step_name is not None:
            q = q.where(run_steps.c.step_name == step_name)
        with self.begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def add_steps(self, rows: Sequence[dict[str, Any]]) -> None:
        """Insert prepared ``run_steps`` rows (column values as given) in one transaction."""
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
        with self.begin() as c:
            if events:
                c.execute(insert(injection_events), [dict(e) for e in events])
            if step is not None:
                now = self.clock()
                c.execute(
                    insert(run_steps).values(
                        run_id=step["run_id"],
                        agent_id=step.get("agent_id"),
                        user_id=step.get("user_id"),
                        step_type=step["step_type"],
                        step_name=step["step_name"],
                        input_json=jsonable(step.get("input")),
                        output_json=jsonable(step.get("output")),
                        status=step.get("status", "Completed"),
                        error_message=step.get("error_message"),
                        started_at=step.get("started_at") or now,
                        finished_at=step.get("finished_at") or now,
                    )
                )

    def injection_events_of(
        self, run_id: str | None = None, item_kind: str | None = None
    ) -> list[dict[str, Any]]:
        """``injection_events`` rows in insertion order, optionally for one run or item kind."""
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
        t = injection_events
        q = (
            select(t.c.item_id, func.count(), func.max(t.c.injected_at))
            .where(t.c.item_kind == item_kind, t.c.item_id.in_(list(item_ids)))
            .group_by(t.c.item_id)
        )
        with self.begin() as c:
            return {item: (int(n), last) for item, n, last in c.execute(q)}

    # -- note history ------------------------------------------------------------------------------

    def steps_naming_notes(self, step_name: str, note_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The ``step_name`` audit steps whose output ``noteId`` is one of ``note_ids``, oldest
        first: their run_id, output_json, status, finished_at and the note_id they name."""
        if not note_ids:
            return []
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
