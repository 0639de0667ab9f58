"""The FastAPI application: ``create_app`` puts together the key check
(:mod:`.access`), the error handlers and the routers: the agent-facing routes
(:mod:`.agent_routes`: ``/v1/memory-writes``, ``/v1/inject``, ``/v1/explain``,
``/v1/remember``, ``/healthz``), a note's history (:mod:`.history`), the administration
routes (:mod:`.admin`) and the memory browser (:mod:`.ui`). Routes read the service
and the caller's key through dependencies, from ``app.state``.

The package docstring (:mod:`memory_pipelines.apps.http`) describes the API."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from memory_pipelines.apps.http import admin, agent_routes, history, ui
from memory_pipelines.apps.http.access import OPEN_PATHS, allow, authenticate, invalid_request
from memory_pipelines.apps.http.common import BodyLimit, http_lease_wait
from memory_pipelines.apps.http.write_queue import RunLocks, WriteQueue
from memory_pipelines.keys import Authenticator
from memory_pipelines.limits import limits
from memory_pipelines.service import MemoryService

logger = logging.getLogger(__name__)

__all__ = ["API_VERSION", "OPEN_PATHS", "create_app"]

API_VERSION = "1"


def create_app(
    svc: MemoryService, *, write_queue: bool = True, lease_wait_s: float | None = None
) -> FastAPI:
    """The FastAPI application over an open service (the caller keeps ownership of it).

    ``write_queue``: route writes through one :class:`WriteQueue` (group commit; kept on
    ``app.state.write_queue``, drained and stopped when the app shuts down); False runs
    them in the handler threads, serialised per run. ``lease_wait_s``: how long a request
    that needs the home's Memory Manager lease (erasing a note) waits for a running
    Memory Manager before answering 503 with ``Retry-After`` (default
    ``MEMORY_HTTP_LEASE_WAIT``, else 5 seconds; kept on ``app.state.lease_wait_s``)."""
    wait = http_lease_wait(lease_wait_s)  # a bad setting fails here, at start-up
    writer = WriteQueue(svc) if write_queue else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if writer is not None:
                await run_in_threadpool(writer.close)

    app = FastAPI(
        title="memory-pipelines",
        version=API_VERSION,
        description="Durable memory for AI agents: guarded in-flight writes and scoped "
        "injection.",
        lifespan=lifespan,
    )
    app.state.svc = svc
    app.state.authenticator = Authenticator(svc.sources)
    app.state.write_queue = writer
    app.state.run_locks = RunLocks()
    app.state.lease_wait_s = wait
    app.state.authorize = allow
    app.add_middleware(BodyLimit, max_bytes=limits().max_body_bytes)
    app.middleware("http")(authenticate)
    app.add_exception_handler(RequestValidationError, invalid_request)  # type: ignore[arg-type]
    for router in (agent_routes.router, history.router, admin.router, ui.router):
        app.include_router(router)
    return app
