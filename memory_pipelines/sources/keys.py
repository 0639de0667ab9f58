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
)


class KeyQueries(SourcesBase):
    """HTTP API keys (hashed) and run owners."""

    # -- run owners ---------------------------------------------------------------------------

    def run_owner(self, agent_id: str, run_id: str) -> dict[str, Any] | None:
        """The ``run_owners`` row of the agent's run (``company_id``, ``user_id``), or None
        when no context has claimed it; a run recorded in ``agent_runs`` (before owners
        were kept, or by the caller) is owned by that record's company and user, unless it
        names neither."""
        owned = select(run_owners).where(
            run_owners.c.agent_id == agent_id, run_owners.c.run_id == run_id
        )
        recorded = select(agent_runs.c.company_id, agent_runs.c.user_id).where(
            agent_runs.c.run_id == run_id, agent_runs.c.agent_id == agent_id
        )
        with self.begin() as c:
            row = c.execute(owned).mappings().first()
            if row is None:
                row = c.execute(recorded).mappings().first()
                if row is not None and row["company_id"] is None and row["user_id"] is None:
                    row = None  # a run recorded without a tenant: the first write claims it
        return dict(row) if row else None

    def claim_run(
        self, agent_id: str, run_id: str, company_id: str | None, user_id: str | None
    ) -> dict[str, Any]:
        """The run's owner: the existing one, or (company_id, user_id) claimed now. Of two
        first claims at once, one inserts and the other reads it."""
        owner = self.run_owner(agent_id, run_id)
        if owner is not None:
            return owner
        row = {"agent_id": agent_id, "run_id": run_id, "company_id": company_id, "user_id": user_id}
        try:
            with self.begin() as c:
                c.execute(insert(run_owners).values(**row, claimed_at=self.clock()))
        except IntegrityError:
            pass  # another process claimed it first: its claim holds
        return self.run_owner(agent_id, run_id) or row

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
