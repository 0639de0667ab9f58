"""HTTP API keys (hashed). (SQL queries as named methods)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    insert,
    select,
    update,
)

from memory_pipelines.sources.base import SourcesBase
from memory_pipelines.sources.tables import (
    api_keys,
    users,
)


class KeyQueries(SourcesBase):
    """HTTP API keys (hashed)."""

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
