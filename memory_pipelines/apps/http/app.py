"""The FastAPI application: authentication, the error handlers and the agent-facing routes
(``/v1/memory-writes``, ``/v1/inject``, ``/v1/explain``, ``/healthz``).

The package docstring (:mod:`memory_pipelines.apps.http`) describes the API."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from memory_pipelines.apps.http import ui
from memory_pipelines.apps.http.admin import add_admin_routes
from memory_pipelines.apps.http.common import (
    BodyLimit,
    call_service,
    describe_errors,
    error_list,
    http_lease_wait,
    result_body,
)
from memory_pipelines.apps.http.history import add_history_routes
from memory_pipelines.apps.http.models import (
    ERROR_RESPONSES,
    RUN_RESPONSES,
    ExplainRequest,
    HealthResponse,
    InjectRequest,
    InjectResponse,
    RememberRequest,
    RememberResponse,
    WritesRequest,
    WritesResponse,
)
from memory_pipelines.apps.http.write_queue import RunLocks, WriteQueue
from memory_pipelines.embeddings import embedder_problem
from memory_pipelines.errors import (
    AuthenticationError,
)
from memory_pipelines.explain import Explanation
from memory_pipelines.home import write_problem
from memory_pipelines.keys import Authenticator, check_context
from memory_pipelines.limits import limits
from memory_pipelines.notes import RunContext
from memory_pipelines.service import MemoryService
from memory_pipelines.store import injectable

logger = logging.getLogger(__name__)

T = TypeVar("T")

API_VERSION = "1"

#: Paths that answer without an API key even when the home has keys (every other path,
#: ``/v1/...`` and any route added later, needs one).
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


# --------------------------------------------------------------------------- payloads


# --------------------------------------------------------------------------- helpers


# --------------------------------------------------------------------------- app


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
    auth = Authenticator(svc.sources)
    writer = WriteQueue(svc) if write_queue else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if writer is not None:
                await run_in_threadpool(writer.close)

    def allow(request: Request, ctx: RunContext) -> None:
        """403 unless the request's key may act for ``ctx`` (call it in every handler)."""
        check_context(getattr(request.state, "api_key", None), ctx, svc.sources)

    app = FastAPI(
        title="memory-pipelines",
        version=API_VERSION,
        description="Durable memory for AI agents: guarded in-flight writes and scoped "
        "injection.",
        lifespan=lifespan,
    )
    run_locks = RunLocks()
    app.state.write_queue = writer
    app.state.lease_wait_s = wait
    app.add_middleware(BodyLimit, max_bytes=limits().max_body_bytes)

    app.state.authorize = allow

    @app.middleware("http")
    async def _authenticate(request: Request, call_next: Any) -> Any:
        """Every path but ``OPEN_PATHS``, before its body is read: the request's API key
        once the home has keys (kept on ``request.state.api_key``; None while it has none)."""
        request.state.api_key = None
        if request.url.path not in OPEN_PATHS | ui.UI_OPEN_PATHS:
            # the browser at /ui may also carry the key in its login cookie
            header = request.headers.get("authorization") or ui.cookie_authorization(request)
            try:
                request.state.api_key = await run_in_threadpool(auth.authenticate, header)
            except AuthenticationError as e:
                if ui.is_ui_path(request.url.path):
                    return ui.login_page(request, str(e))
                return JSONResponse(
                    status_code=401,
                    content={"detail": str(e)},
                    headers={"WWW-Authenticate": "Bearer"},
                )
            except Exception:
                logger.exception("API key check failed")
                return JSONResponse(
                    status_code=500, content={"detail": "internal error; see the server log"}
                )
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        return JSONResponse(
            status_code=422,
            content={"detail": describe_errors(errors), "errors": error_list(errors)},
        )

    @app.post("/v1/memory-writes", response_model=WritesResponse, responses=RUN_RESPONSES)
    def memory_writes(body: WritesRequest, request: Request) -> WritesResponse:
        """Run the agent's memoryWrites through the guard pipeline; one result per write."""
        ctx = body.context

        def run() -> WritesResponse:
            allow(request, ctx)
            if writer is not None:
                results = writer.submit(ctx, body.writes)
            elif ctx.run_id is None:
                results = svc.write(ctx, body.writes)
            else:
                holder = run_locks.get(ctx.run_id)
                with holder.lock:
                    results = svc.write(ctx, body.writes)
            return WritesResponse(
                results=[result_body(r) for r in results],
                feedback=svc.format_write_feedback(results),
            )

        return call_service(run)

    @app.post("/v1/remember", response_model=RememberResponse, responses=RUN_RESPONSES)
    def remember(body: RememberRequest, request: Request) -> RememberResponse:
        """Learn from a conversation now: record the messages, extract durable notes with
        the agent's judge and keep what the in-flight guards let through."""
        ctx = body.context

        def run() -> RememberResponse:
            allow(request, ctx)
            if ctx.run_id is None:
                return RememberResponse(notes=svc.remember(ctx, body.messages))
            holder = run_locks.get(ctx.run_id)
            with holder.lock:
                return RememberResponse(notes=svc.remember(ctx, body.messages))

        return call_service(run)

    @app.post("/v1/inject", response_model=InjectResponse, responses=RUN_RESPONSES)
    def inject(body: InjectRequest, request: Request) -> InjectResponse:
        """The notes and examples to prepend to a run, rendered as one system message."""

        def run() -> InjectResponse:
            allow(request, body.context)
            injection = svc.inject(body.context, body.current_input, as_of=body.as_of)
            return InjectResponse(
                message=injection.message,
                notes=list(injection.notes),
                examples=list(injection.examples),
            )

        return call_service(run)

    @app.post("/v1/explain", response_model=Explanation, responses=ERROR_RESPONSES)
    def explain(body: ExplainRequest, request: Request) -> Explanation:
        """Why the agent does (or does not) remember a topic, note by note (read-only)."""

        def run() -> Explanation:
            allow(request, body.context)
            return svc.explain(
                body.context, body.topic, body.current_input, limit=body.limit, as_of=body.as_of
            )

        return call_service(run)

    @app.get(
        "/healthz",
        response_model=HealthResponse,
        responses={
            503: {
                "model": HealthResponse,
                "description": "The home cannot be written, or the embedding model is missing",
            }
        },
    )
    def healthz() -> Any:
        """Liveness and a glance at the store: table versions and row counts; 503
        ``degraded`` with the reason when the home or the SQL database cannot be written."""
        problem = write_problem(svc.home, svc.sources) or embedder_problem(svc.embedder)
        if problem is not None:
            logger.warning("memory home degraded: %s", problem)
            return JSONResponse(
                status_code=503,
                content=HealthResponse(
                    status="degraded",
                    notes_version=None,
                    examples_version=None,
                    counts={},
                    reason=problem,
                ).model_dump(),
            )

        def run() -> HealthResponse:
            notes, examples = svc.store.notes, svc.store.examples
            return HealthResponse(
                status="ok",
                notes_version=notes.version,
                examples_version=examples.version,
                counts={
                    "notes": notes.count(),
                    "injectable_notes": notes.count(injectable()),
                    "examples": examples.count(),
                    "agents": len(svc.sources.list_agents()),
                },
            )

        return call_service(run)

    add_history_routes(app, svc, allow)
    add_admin_routes(app, svc, allow)
    ui.add_ui_routes(app, svc, allow)
    return app


# --------------------------------------------------------------------------- serving
