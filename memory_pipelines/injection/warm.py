"""A warm start: the read cache of a home just opened, filled in a background thread with
the scopes injected most recently, so the first request of those users after a restart
does not pay the scope read (at a million notes, a restart's first inject read the
agent's shared notes and the user's own: over half a second).

The scopes come from the injection events the SQL sources keep (the newest
:data:`RECENT_EVENTS` note injections, distinct by agent, user and company, newest first),
so they are those of any process that served the home, not only this one. Each is read as
an inject would read it (:func:`~memory_pipelines.injection.read_filters.cached_scope`:
the user's own notes and the notes of the agent without a user), which also opens the
table's dataset and its scope indexes, and each cell's lexical index is built (at 1M
notes an agent's shared notes took a restart's first inject 0.24 s to index). A scope whose agent is gone is skipped. Runs with
multi-tenant records are not warmed (the events do not keep them), and the read cache's
bound (``DEFAULT_MAX_ROWS`` rows per table) holds for the warmed scopes as for any.

Off by default: ``MemoryService.warm_up(scopes=N)`` (what ``serve`` and ``mcp`` run in
the background at start-up) reads the ``N`` most recent scopes after loading the model;
``MEMORY_WARM_START_SCOPES=N`` sets its default. ``close()`` stops it between two scopes.
"""

from __future__ import annotations

import logging
import os
import threading

from memory_pipelines.agents import get_agent
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import ConfigError, UnknownAgentError
from memory_pipelines.injection.read_filters import cached_scope
from memory_pipelines.notes import RunContext
from memory_pipelines.scope import RunScope

log = logging.getLogger(__name__)

#: the newest note injection events a warm start looks at for scopes
RECENT_EVENTS = 2_000
#: the environment variable of :meth:`MemoryService.warm_up`'s default ``scopes``
ENV = "MEMORY_WARM_START_SCOPES"


def recent_contexts(mem: MemoryContext, most: int) -> list[RunContext]:
    """Run contexts of the ``most`` scopes injected most recently, newest first."""
    return [
        RunContext(agent_id=agent, user_id=user, company_id=company)
        for agent, user, company in mem.sources.recent_injection_scopes(most, RECENT_EVENTS)
    ]


def warm_scopes(mem: MemoryContext, most: int, stop: threading.Event | None = None) -> int:
    """Read the ``most`` most recently injected scopes into the read cache (until ``stop``
    is set); returns how many were read. A scope whose agent is gone is skipped."""
    warmed = 0
    for ctx in recent_contexts(mem, most):
        if stop is not None and stop.is_set():
            break
        try:
            agent = get_agent(mem.sources, ctx.agent_id)
        except UnknownAgentError:
            continue
        views = cached_scope(mem.store.notes, RunScope.of(ctx, agent))
        if views is not None:
            for view in views:  # and what a first ranking builds: the lexical indexes
                for segment in view.segments:
                    segment.lexical(mem.inject_config.lexical_stemmer)
            warmed += 1
    return warmed


def scopes_from_env(default: int = 0) -> int:
    """``MEMORY_WARM_START_SCOPES`` (a count; unset or blank: ``default``)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV} must be a whole number of scopes, not {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{ENV} must be 0 or more, not {value}")
    return value
