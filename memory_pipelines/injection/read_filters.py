"""The store filters an injection reads through, built from the run's
:class:`~memory_pipelines.scope.RunScope`: the note and example filters of injection, the
read cache's filter without the clock, and the cache cells a scope is held in."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memory_pipelines.injection.cache import ScopeView, read_cache
from memory_pipelines.notes import ExampleStatus
from memory_pipelines.scope import RunScope
from memory_pipelines.store import Cond, and_, cmp, eq, injectable, is_null, or_


def not_expired(now: datetime) -> Cond:
    """Rows without ``expires_at`` or expiring after ``now``."""
    return or_(is_null("expires_at"), cmp("expires_at", ">", now))


def note_filter(scope: RunScope, now: datetime) -> Cond:
    """Injectable, unexpired notes inside the run's lattice and multi-tenant prefilter."""
    return and_(
        injectable(),
        not_expired(now),
        scope.lattice(),
        scope.prefilter(),
    )


def injectable_in_scope(scope: RunScope) -> Cond:
    """:func:`note_filter` without the clock: what the read cache holds for a scope."""
    return and_(
        injectable(),
        scope.lattice(),
        scope.prefilter(),
    )


def scope_cells(scope: RunScope) -> list[Cond]:
    """Disjoint filters whose rows together are :func:`injectable_in_scope`'s: for a run
    with a user, the user's own notes and the notes without a user (the latter the very
    filter of the same run without a user, so every user of an agent shares one cached
    entry of them); otherwise the one filter. The read cache holds each cell on its own
    (:func:`cached_scope`), so a million notes over a thousand users cost one small entry
    per user plus the shared ones, not a copy of the shared notes per user."""
    if scope.user_id is None:
        return [injectable_in_scope(scope)]
    shared = and_(
        injectable(),
        scope.lattice(user=False),
        scope.prefilter(),
    )
    own = and_(
        injectable(),
        scope.lattice(),
        scope.own_user(),
        scope.prefilter(),
    )
    return [own, shared]


def cached_scope(table: Any, scope: RunScope) -> list[ScopeView] | None:
    """The read cache's views of the scope's cells (:func:`scope_cells`), or None when
    the cache is off or a cell is too large to cache."""
    cache = read_cache(table)
    views = []
    for where in scope_cells(scope):
        view = cache.rows(where)
        if view is None:
            return None
        views.append(view)
    return views


def example_filter(scope: RunScope, now: datetime) -> Cond:
    """Active, unexpired examples of the run's agent inside its user/company scope."""
    return and_(
        eq("status", ExampleStatus.ACTIVE.value),
        not_expired(now),
        scope.example_lattice(),
        scope.prefilter(),
    )
