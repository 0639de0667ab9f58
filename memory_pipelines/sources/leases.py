"""Leases: which process may run the Memory Manager on a home right now.

A lease is one row of ``manager_leases`` (name, owner, expiry). Taking it is one
conditional statement (an insert, or an update of a row whose owner is the taker or
whose expiry has passed), so two processes, on one machine or on several sharing a
PostgreSQL database, never both hold it. The holder renews it before it expires; a
holder that died loses it when it expires. Expiry instants come from the service clock.
(SQL queries as named methods.)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from memory_pipelines.sources.base import SourcesBase
from memory_pipelines.sources.tables import jsonable, manager_leases


class LeaseQueries(SourcesBase):
    """Take, renew, release and list the leases of a home."""

    def take_lease(
        self, name: str, owner: str, expires_at: datetime, details: dict[str, Any] | None = None
    ) -> bool:
        """Take (or, for its own owner, extend) the lease ``name`` until ``expires_at``;
        False while another owner holds an unexpired one."""
        now = self.clock()
        values = {"owner": owner, "expires_at": expires_at, "details": jsonable(details or {})}
        t = manager_leases.c
        with self.begin() as c:
            taken = c.execute(
                update(manager_leases)
                .where(t.name == name, or_(t.owner == owner, t.expires_at <= now))
                .values(acquired_at=now, **values)
            ).rowcount
        if taken:
            return True
        try:
            with self.begin() as c:
                c.execute(insert(manager_leases).values(name=name, acquired_at=now, **values))
        except IntegrityError:  # held by another owner (or taken by one just now)
            return False
        return True

    def take_over_lease(
        self,
        name: str,
        old_owner: str,
        owner: str,
        expires_at: datetime,
        details: dict[str, Any] | None = None,
    ) -> bool:
        """Take the lease ``name`` from ``old_owner`` (one known to be dead), whatever its
        expiry; False when ``old_owner`` no longer holds it."""
        t = manager_leases.c
        with self.begin() as c:
            return bool(
                c.execute(
                    update(manager_leases)
                    .where(t.name == name, t.owner == old_owner)
                    .values(
                        owner=owner,
                        acquired_at=self.clock(),
                        expires_at=expires_at,
                        details=jsonable(details or {}),
                    )
                ).rowcount
            )

    def renew_lease(self, name: str, owner: str, expires_at: datetime) -> bool:
        """Move the expiry of a lease this owner holds; False when it no longer holds it."""
        t = manager_leases.c
        with self.begin() as c:
            return bool(
                c.execute(
                    update(manager_leases)
                    .where(t.name == name, t.owner == owner)
                    .values(expires_at=expires_at)
                ).rowcount
            )

    def release_lease(self, name: str, owner: str) -> bool:
        """Give a lease back (only its owner can); False when it did not hold it."""
        t = manager_leases.c
        with self.begin() as c:
            return bool(
                c.execute(delete(manager_leases).where(t.name == name, t.owner == owner)).rowcount
            )

    def live_leases(self, prefix: str = "") -> list[dict[str, Any]]:
        """The unexpired leases whose name starts with ``prefix``, oldest first."""
        t = manager_leases.c
        now = self.clock()
        query = select(manager_leases).where(t.expires_at > now)
        if prefix:
            query = query.where(t.name.startswith(prefix, autoescape=True))
        with self.begin() as c:
            rows = c.execute(query.order_by(t.acquired_at, t.name)).mappings().all()
        return [dict(r) for r in rows]


__all__ = ["LeaseQueries"]
