"""The Memory Manager's cursors, state and recorded runs. (SQL queries as named methods)"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    delete,
    insert,
    select,
    update,
)

from memory_pipelines.sources.base import SourcesBase, chunks
from memory_pipelines.sources.tables import (
    jsonable,
    manager_runs,
    manager_state,
)


class ManagerQueries(SourcesBase):
    """The Memory Manager's cursors, state and recorded runs."""

    # -- manager state --------------------------------------------------------------------------

    def get_state(self, key: str, default: Any = None) -> Any:
        with self.begin() as c:
            r = c.execute(select(manager_state.c.value).where(manager_state.c.key == key)).first()
        return default if r is None else r[0]

    def set_state(self, key: str, value: Any) -> None:
        now = self.clock()
        with self.begin() as c:
            if c.execute(select(manager_state.c.key).where(manager_state.c.key == key)).first():
                c.execute(
                    update(manager_state).where(manager_state.c.key == key).values(value=jsonable(value), updated_at=now)
                )
            else:
                c.execute(insert(manager_state).values(key=key, value=jsonable(value), updated_at=now))

    def get_states(self, keys: Sequence[str]) -> dict[str, Any]:
        """The values of those of ``keys`` that are set."""
        found: dict[str, Any] = {}
        with self.begin() as c:
            for chunk in chunks(list(dict.fromkeys(keys))):
                rows = c.execute(
                    select(manager_state.c.key, manager_state.c.value).where(
                        manager_state.c.key.in_(chunk)
                    )
                )
                found.update({k: v for k, v in rows})
        return found

    def set_states(self, values: dict[str, Any]) -> None:
        """Set (or, for a None value, delete) several state keys in one transaction."""
        if not values:
            return
        now = self.clock()
        with self.begin() as c:
            existing = set()
            for chunk in chunks(list(values)):
                existing.update(
                    r[0]
                    for r in c.execute(
                        select(manager_state.c.key).where(manager_state.c.key.in_(chunk))
                    )
                )
            for key, value in values.items():
                if value is None:
                    c.execute(delete(manager_state).where(manager_state.c.key == key))
                elif key in existing:
                    c.execute(
                        update(manager_state)
                        .where(manager_state.c.key == key)
                        .values(value=value, updated_at=now)
                    )
                else:
                    c.execute(insert(manager_state).values(key=key, value=value, updated_at=now))

    def states_with_prefix(self, prefix: str) -> dict[str, Any]:
        """Every state key that starts with ``prefix`` (SQL ``LIKE``), with its value."""
        with self.begin() as c:
            rows = c.execute(
                select(manager_state.c.key, manager_state.c.value).where(
                    manager_state.c.key.like(prefix + "%")
                )
            ).all()
        return {k: v for k, v in rows}

    # -- Memory Manager runs ------------------------------------------------------------------

    def add_manager_run(
        self,
        kind: str,
        status: str,
        started_at: datetime,
        finished_at: datetime,
        counts: dict[str, Any],
    ) -> None:
        """Append a ``manager_runs`` row (a cycle or a maintenance run)."""
        with self.begin() as c:
            c.execute(
                insert(manager_runs).values(
                    kind=kind,
                    status=status,
                    started_at=started_at,
                    finished_at=finished_at,
                    counts=counts,
                )
            )

    def manager_runs_finished(self, kind: str, status: str) -> list[tuple[datetime, Any]]:
        """``(finished_at, counts)`` of the ``kind`` runs with ``status``, newest first."""
        q = (
            select(manager_runs.c.finished_at, manager_runs.c.counts)
            .where(manager_runs.c.kind == kind, manager_runs.c.status == status)
            .order_by(manager_runs.c.finished_at.desc())
        )
        with self.begin() as c:
            return [(finished, counts) for finished, counts in c.execute(q)]

    def manager_run_counts(
        self, kind: str, status: str, started_after: datetime | None = None
    ) -> list[Any]:
        """The ``counts`` of the ``kind`` runs with ``status`` started after
        ``started_after`` (all when None)."""
        q = select(manager_runs.c.counts).where(
            manager_runs.c.kind == kind, manager_runs.c.status == status
        )
        if started_after is not None:
            q = q.where(manager_runs.c.started_at > started_after)
        with self.begin() as c:
            return list(c.execute(q).scalars().all())

