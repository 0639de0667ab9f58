"""HTTP API keys (hashed) and run owners: who may act for what. (SQL queries as named methods)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from memory_pipelines.sources.base import SourcesBase
from memory_pipelines.sources.tables import (
    agent_runs,
    api_keys,
    run_owners,
    users,
    write_ledger,
)


class KeyQueries(SourcesBase):
    """HTTP API keys (hashed) and run owners."""

    # -- run owners ---------------------------------------------------------------------------

    def run_owner(self, agent_id: str, run_id: str) -> dict[str, Any] | None:
        """The ``run_owners`` row of the agent's run (``company_id``, ``user_id``), or None
        when no context has claimed it; a run recorded in ``agent_runs`` (before owners
        were kept, or by the caller) is owned by that record's company and user, unless it
        names neither."""
        with self.begin() as c:
            return self._owner(c, agent_id, run_id)[0]

    @staticmethod
    def _owner(c: Any, agent_id: str, run_id: str) -> tuple[dict[str, Any] | None, bool]:
        """:meth:`run_owner` on connection ``c``, and whether the run id was used before
        (an owner, or an ``agent_runs`` record even without a tenant)."""
        owned = select(run_owners).where(
            run_owners.c.agent_id == agent_id, run_owners.c.run_id == run_id
        )
        row = c.execute(owned).mappings().first()
        if row is not None:
            return dict(row), True
        recorded = select(agent_runs.c.company_id, agent_runs.c.user_id).where(
            agent_runs.c.run_id == run_id, agent_runs.c.agent_id == agent_id
        )
        row = c.execute(recorded).mappings().first()
        if row is None:
            return None, False
        if row["company_id"] is None and row["user_id"] is None:
            return None, True  # a run recorded without a tenant: the first write claims it
        return dict(row), True

    def claim_run(
        self, agent_id: str, run_id: str, company_id: str | None, user_id: str | None
    ) -> dict[str, Any]:
        """The run's owner: the existing one, or (company_id, user_id) claimed now. Of two
        first claims at once, one inserts and the other reads it."""
        return self.claim_new_run(agent_id, run_id, company_id, user_id)[0]

    def claim_new_run(
        self, agent_id: str, run_id: str, company_id: str | None, user_id: str | None
    ) -> tuple[dict[str, Any], bool]:
        """:meth:`claim_run`, and whether the run is new: True only when this call claimed
        a run id no context had used (no owner, no ``agent_runs`` record, no write ledger
        rows), so nothing of the run can be stored yet."""
        with self.begin() as c:  # (reads apart from the insert: SQLite refuses, without
            # waiting, to turn a read transaction into a write after another's commit)
            owner, used = self._owner(c, agent_id, run_id)
            if owner is None and not used:
                ledger = select(write_ledger.c.key).where(
                    write_ledger.c.agent_id == agent_id, write_ledger.c.run_id == run_id
                )
                used = c.execute(ledger.limit(1)).first() is not None
        if owner is not None:
            return owner, False
        row = {
            "agent_id": agent_id,
            "run_id": run_id,
            "company_id": company_id,
            "user_id": user_id,
            "claimed_at": self.clock(),
        }
        try:
            with self.begin() as c:
                c.execute(insert(run_owners).values(**row))
        except IntegrityError:  # another process claimed it first: its claim holds
            return self.run_owner(agent_id, run_id) or row, False
        return row, not used

    # -- API keys -----------------------------------------------------------------------------

    def add_api_key(self, row: dict[str, Any]) -> None:
        """Insert one ``api_keys`` row (``created_at`` defaults to now)."""
        with self.begin() as c:
            c.execute(insert(api_keys).values(**{"created_at": self.clock(), **row}))

    def get_api_key(self, key_id: str) -> dict[str, Any] | None:
        """The ``api_keys`` row of ``key_id`` (hash included), or None."""
        with self.begin() as c:
            r = c.execute(select(api_keys).where(api_keys.c.key_id == key_id)).mappings().first()
        return dict(r) if r else None

    def list_api_keys(self) -> list[dict[str, Any]]:
        """Every ``api_keys`` row, oldest first, without the hash."""
        cols = [c for c in api_keys.columns if c.name != "secret_hash"]
        with self.begin() as c:
            return [
                dict(r)
                for r in c.execute(
                    select(*cols).order_by(api_keys.c.created_at, api_keys.c.key_id)
                ).mappings()
            ]

    def revoke_api_key(self, key_id: str) -> bool:
        """Mark a key revoked now (an already revoked key keeps its time); False if unknown."""
        with self.begin() as c:
            if not c.execute(select(api_keys.c.key_id).where(api_keys.c.key_id == key_id)).first():
                return False
            c.execute(
                update(api_keys)
                .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=self.clock())
            )
        return True

    def any_api_key(self) -> bool:
        """Whether any API key was ever created here (revoked ones included)."""
        with self.begin() as c:
            return c.execute(select(api_keys.c.key_id).limit(1)).first() is not None

    def get_user(self, user_id: str) -> dict[str, Any] | None:
        """The ``users`` row of ``user_id`` (its company), or None if it is not registered."""
        with self.begin() as c:
            r = c.execute(select(users).where(users.c.user_id == user_id)).mappings().first()
        return dict(r) if r else None
