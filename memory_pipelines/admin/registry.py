"""Registration follows use (CONTRACT §2.9): the user and company a context names are
registered the first time this service sees them (a user with its company).

The hot path stays one set lookup: each service keeps the ``(user, company)`` pairs it
has registered; only a new pair costs one SQL insert-if-missing, which two processes may
run at once without failing. Deleting a user or company through the service forgets it
here, so a later write registers it again.
"""

from __future__ import annotations

import threading
from typing import Any

#: How many pairs one service remembers before it starts over (a bound on memory).
MAX_KNOWN = 100_000


class Registry:
    """Registers the users and companies of run contexts, once per service."""

    def __init__(self, sources: Any):
        self.sources = sources
        self._known: set[tuple[str | None, str | None]] = set()
        self._lock = threading.Lock()

    def register(self, user_id: str | None, company_id: str | None) -> bool:
        """Register ``user_id`` (with ``company_id``) and ``company_id`` unless known;
        returns whether the database was asked."""
        pair = (user_id or None, company_id or None)
        if pair == (None, None) or pair in self._known:
            return False
        self.sources.register_people(pair[0], pair[1])
        with self._lock:
            if len(self._known) >= MAX_KNOWN:
                self._known.clear()
            self._known.add(pair)
        return True

    def forget(self, *, user_id: str | None = None, company_id: str | None = None) -> None:
        """Drop the pairs naming this user or company (it was deleted)."""
        with self._lock:
            self._known = {
                (u, c)
                for u, c in self._known
                if not ((user_id is not None and u == user_id) or (company_id is not None and c == company_id))
            }
