"""The HTTP API: in-flight memory writes and run-start injection over FastAPI.

``create_app(svc)`` builds the application over an open :class:`MemoryService`;
:func:`serve` (``memory-pipelines serve [--home H] [--host 127.0.0.1] [--port 8765]
[--llm MODEL]``) opens the service from the environment and serves it with uvicorn (loopback by default;
it refuses a non-loopback address while the home has no API key).

Authentication (CONTRACT §2.8, :mod:`memory_pipelines.keys`): once any API key exists in
the home, every route but ``/healthz`` needs ``Authorization: Bearer <secret>`` (401
without, or with an unknown, wrong or revoked key), and each handler holds its run
context to the key's binding (403 outside it). Without keys the API is open, as before.

Modules: :mod:`.app` (``create_app``: the app from its routers), :mod:`.access` (the key
check and the context check), :mod:`.agent_routes` (the agent-facing routes),
:mod:`.history` and :mod:`.admin` (notes and agents), :mod:`.models` (bodies),
:mod:`.common` (body limit, error mapping, the route dependencies), :mod:`.write_queue`
(group commit), :mod:`.serving` (uvicorn), :mod:`.ui` (the memory browser at ``/ui``:
HTML pages that also accept the key as the login form's cookie).

Endpoints (CONTRACT §4):

- ``POST /v1/memory-writes`` ``{"context": {RunContext}, "writes": [...]}`` ->
  ``{"results": [WriteResult], "feedback": "..."}``. Each item of ``writes`` is passed
  through as given, so one malformed write comes back ``rejected-type`` instead of failing
  the whole batch.
- ``POST /v1/inject`` ``{"context": {RunContext}, "current_input": "..." | null}`` ->
  ``{"message": "...", "notes": [Note], "examples": [Example]}``.
- ``POST /v1/explain`` ``{"context": {RunContext}, "topic": "...", "current_input": null}``
  -> the :class:`~memory_pipelines.explain.Explanation` of every note about the topic.
- ``GET /healthz`` -> ``{"status": "ok", table versions, counts}``; 503 with
  ``{"status": "degraded", "reason": "..."}`` when the home or the SQL database cannot
  be written (writes and injections would fail); from ``serve``, 503 ``{"status":
  "starting"}`` while the home is still opening (see :mod:`.serving`).
- ``GET /openapi.json`` (FastAPI's schema).

Errors: no or a bad API key -> 401; a context outside the key's binding -> 403;
a body that is not JSON or fails validation -> 422 with a readable ``detail``;
an unknown agent (or other missing row) -> 404; a project ``ValidationError`` -> 422;
a body larger than ``Limits.max_body_bytes`` (1 MiB by default) -> 413;
anything else -> 500 with a generic message (the traceback goes to the server log).
Handlers are synchronous, so FastAPI runs them in its thread pool.

Group commit: every ``/v1/memory-writes`` request goes through one :class:`WriteQueue`
owned by the app: handlers enqueue their request and wait; one writer thread takes what
has arrived (up to 64 requests) and runs it as one group commit in arrival order
(``svc.write_group``: one note commit and one ledger claim for the round, results as if
the requests ran one after another), so concurrent writers never retry their table
commits against each other in this process, and a run's cap and idempotency checks see
its earlier requests. Each request gets exactly its own results
(or its own error). The writer starts with the first write, stops after a few idle
seconds, and is drained and stopped when the app shuts down. ``create_app(svc,
write_queue=False)`` (``MEMORY_WRITE_QUEUE=off`` for ``serve``) runs writes in the
handler threads instead, serialised per run by a lock, and ``MEMORY_WRITE_QUEUE=each``
keeps the writer but runs each request as its own batch (the baselines of ``bench load``).
Across processes (two servers, or a server and a Dagster run on one home) commit
conflicts are retried with backoff by the store.

Injection attribution (``injection_events`` rows) is buffered by ``serve`` and flushed in
batches (:func:`memory_pipelines.injection.attribution.buffer_attribution`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memory_pipelines.apps.http.app import API_VERSION, OPEN_PATHS, create_app
    from memory_pipelines.apps.http.serving import run_server, serve, serving_in_thread
    from memory_pipelines.apps.http.write_queue import (
        RunLocks,
        WriteQueue,
        write_queue_enabled,
        write_queue_mode,
    )

#: each public name and the module it is imported from when first used (``serve`` binds
#: its port before the service, FastAPI and LanceDB are imported)
_HOMES = {
    "API_VERSION": "app",
    "OPEN_PATHS": "app",
    "create_app": "app",
    "run_server": "serving",
    "serve": "serving",
    "serving_in_thread": "serving",
    "RunLocks": "write_queue",
    "WriteQueue": "write_queue",
    "write_queue_enabled": "write_queue",
    "write_queue_mode": "write_queue",
}

__all__ = [
    "API_VERSION",
    "OPEN_PATHS",
    "RunLocks",
    "WriteQueue",
    "create_app",
    "run_server",
    "serve",
    "serving_in_thread",
    "write_queue_enabled",
    "write_queue_mode",
]


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
