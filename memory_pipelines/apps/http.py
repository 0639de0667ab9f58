"""The HTTP API: in-flight memory writes and run-start injection over FastAPI.

``create_app(svc)`` builds the application over an open :class:`MemoryService`;
:func:`serve` (``memory-pipelines serve [--home H] [--host 127.0.0.1] [--port 8765]
[--llm MODEL]``) opens the service from the environment and serves it with uvicorn (loopback by default;
it refuses a non-loopback address while the home has no API key).

Authentication (CONTRACT §2.8, :mod:`memory_pipelines.keys`): once any API key exists in
the home, every route but ``/healthz`` needs ``Authorization: Bearer <secret>`` (401
without, or with an unknown, wrong or revoked key), and each handler holds its run
context to the key's binding (403 outside it). Without keys the API is open, as before.

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
  be written (writes and injections would fail).
- ``GET /openapi.json`` (FastAPI's schema).

Errors: no or a bad API key -> 401; a context outside the key's binding -> 403;
a body that is not JSON or fails validation -> 422 with a readable ``detail``;
an unknown agent (or other missing row) -> 404; a project ``ValidationError`` -> 422;
a body larger than ``Limits.max_body_bytes`` (1 MiB by default) -> 413;
anything else -> 500 with a generic message (the traceback goes to the server log).
Handlers are synchronous, so FastAPI runs them in its thread pool.

Group commit: every ``/v1/memory-writes`` request goes through one :class:`WriteQueue`
owned by the app: handlers enqueue their request and wait; one writer thread takes what
has arrived, in arrival order, and runs the requests back to back, so concurrent writers
never retry their table commits against each other in this process, and a run's cap and
idempotency checks see its earlier requests. Each request gets exactly its own results
(or its own error). The writer starts with the first write, stops after a few idle
seconds, and is drained and stopped when the app shuts down. ``create_app(svc,
write_queue=False)`` (``MEMORY_WRITE_QUEUE=off`` for ``serve``) runs writes in the
handler threads instead, serialised per run by a lock (the baseline of ``bench load``).
Across processes (two servers, or a server and a Dagster run on one home) commit
conflicts are retried with backoff by the store.

Injection attribution (``injection_events`` rows) is buffered by ``serve`` and flushed in
batches (:func:`memory_pipelines.injection.attribution.buffer_attribution`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from memory_pipelines.errors import (
    AuthenticationError,
    MemoryPipelineError,
    NotFoundError,
    PermissionDeniedError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.explain import Explanation
from memory_pipelines.home import write_problem
from memory_pipelines.injection.attribution import buffer_attribution
from memory_pipelines.keys import Authenticator, bind_refusal, check_context
from memory_pipelines.limits import limits
from memory_pipelines.notes import Example, Note, RunContext
from memory_pipelines.service import MemoryService
from memory_pipelines.store import injectable
from memory_pipelines.writes import WriteResult
from memory_pipelines.writes.validate import ValidRequest, request_fields, validate_request

logger = logging.getLogger(__name__)

T = TypeVar("T")

API_VERSION = "1"

#: Paths that answer without an API key even when the home has keys (every other path,
#: ``/v1/...`` and any route added later, needs one).
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


# --------------------------------------------------------------------------- payloads


class WritesRequest(BaseModel):
    """Body of ``POST /v1/memory-writes``."""

    model_config = ConfigDict(extra="forbid")

    context: RunContext
    writes: list[Any] = Field(
        description='The agent\'s memoryWrites: objects like {"note": "...", "type": '
        '"Preference", "scopeHint": "user"}; a malformed item is answered rejected-type.'
    )


class WriteResultBody(BaseModel):
    """One write's outcome, in request order."""

    disposition: str
    note_id: str | None = None
    reason: str = ""
    final_scope: dict[str, str | None] | None = None
    duration_ms: float = 0.0
    request: Any = None


class WritesResponse(BaseModel):
    """Body answered by ``POST /v1/memory-writes``."""

    results: list[WriteResultBody]
    feedback: str


class InjectRequest(BaseModel):
    """Body of ``POST /v1/inject``."""

    model_config = ConfigDict(extra="forbid")

    context: RunContext
    current_input: str | None = None


class InjectResponse(BaseModel):
    """Body answered by ``POST /v1/inject``: the system message and the items in it."""

    message: str
    notes: list[Note]
    examples: list[Example]


class ExplainRequest(BaseModel):
    """Body of ``POST /v1/explain``."""

    model_config = ConfigDict(extra="forbid")

    context: RunContext
    topic: str = Field(min_length=1, description="words to look for in the notes")
    current_input: str | None = Field(
        default=None, description="the run's input to rank with (default: the topic)"
    )
    limit: int = Field(default=10, ge=1, le=100, description="notes to explain")


class HealthResponse(BaseModel):
    """Body answered by ``GET /healthz``."""

    status: str
    notes_version: int | None
    examples_version: int | None
    counts: dict[str, int]
    reason: str | None = None


class ErrorItem(BaseModel):
    """One request validation error."""

    loc: list[str]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    """Body of every error answer: a readable message (and, for 422, the errors)."""

    detail: str
    errors: list[ErrorItem] | None = None


_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "Missing, unknown or revoked API key"},
    403: {"model": ErrorResponse, "description": "Context outside the API key's binding"},
    404: {"model": ErrorResponse, "description": "Unknown agent"},
    413: {"model": ErrorResponse, "description": "Request body over the size limit"},
    422: {"model": ErrorResponse, "description": "Body is not JSON or fails validation"},
    500: {"model": ErrorResponse, "description": "Internal error (details in the server log)"},
}


# --------------------------------------------------------------------------- helpers


class _Lock:
    """A lock that can be held in a weak-value map (``threading.Lock`` cannot)."""

    __slots__ = ("lock", "__weakref__")

    def __init__(self) -> None:
        self.lock = threading.Lock()


class RunLocks:
    """One lock per run id, forgotten once no request holds it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: weakref.WeakValueDictionary[str, _Lock] = weakref.WeakValueDictionary()

    def get(self, run_id: str) -> _Lock:
        """The lock of ``run_id`` (keep a reference while holding it)."""
        with self._guard:
            lock = self._locks.get(run_id)
            if lock is None:
                lock = _Lock()
                self._locks[run_id] = lock
            return lock


@dataclass
class _Pending:
    """One enqueued write request and the future its handler waits on."""

    ctx: RunContext
    writes: Sequence[Any]
    future: Future


class WriteQueue:
    """One writer for a service's in-flight writes (group commit).

    :meth:`submit` enqueues a request and blocks until the writer thread has run it; the
    writer drains whatever has arrived and runs those requests back to back in arrival
    order (``svc.write`` each, so dispositions are exactly those of sequential calls),
    handing each caller its own results or exception. The thread is started by the first
    submit and exits after ``idle_seconds`` without work (started again when needed);
    :meth:`close` runs what is queued and stops it. A round of several requests embeds
    all their note texts in one call first (the cached vectors are what each write then
    uses). ``stats`` counts requests and rounds
    (drains): requests per round is how much arrived together.
    """

    def __init__(self, svc: MemoryService, *, idle_seconds: float = 5.0) -> None:
        self._svc = svc
        self._idle = idle_seconds
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.stats = {"requests": 0, "rounds": 0, "largest_round": 0}

    def submit(self, ctx: RunContext, writes: Sequence[Any]) -> list[WriteResult]:
        """Run ``svc.write(ctx, writes)`` on the writer thread; its results (or error)."""
        item = _Pending(ctx, writes, Future())
        with self._guard:
            if self._closed:
                raise MemoryPipelineError("the write queue is closed (the server is stopping)")
            self._queue.put(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="memory-writer", daemon=True)
                self._thread.start()
        return item.future.result()

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=self._idle)
            except queue.Empty:
                with self._guard:  # submit enqueues under this lock: nothing can slip in
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            batch = [first]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch  # close() enqueues None after the last request
            self._write([item for item in batch if item is not None])
            if stop:
                with self._guard:
                    self._thread = None
                return

    def _write(self, batch: list[_Pending]) -> None:
        """Run one round: the requests that arrived together, back to back."""
        if not batch:
            return
        self.stats["rounds"] += 1
        self.stats["requests"] += len(batch)
        self.stats["largest_round"] = max(self.stats["largest_round"], len(batch))
        if len(batch) > 1:
            self._embed_round(batch)
        for item in batch:
            if not item.future.set_running_or_notify_cancel():
                continue
            try:
                item.future.set_result(self._svc.write(item.ctx, item.writes))
            except BaseException as e:  # handed to the request's own handler
                item.future.set_exception(e)

    def _embed_round(self, batch: list[_Pending]) -> None:
        """One embedding call for the round's note texts (the embedding cache, keyed by
        content, then answers each write's own call: same vectors, fewer model calls)."""
        texts: list[str] = []
        for item in batch:
            for request in item.writes if isinstance(item.writes, list) else ():
                valid = validate_request(request, request_fields(request), self._svc.write_config)
                if isinstance(valid, ValidRequest):
                    texts.append(valid.text)
        if len(texts) > 1:
            try:
                self._svc.embed(list(dict.fromkeys(texts)))
            except Exception as e:  # each write embeds (and fails open) on its own
                logger.warning("batched embedding of a write round failed: %s", e)

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new requests, run the queued ones and stop the writer thread."""
        with self._guard:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout)


def write_queue_enabled() -> bool:
    """``MEMORY_WRITE_QUEUE`` (read when a server starts): ``off``/``0``/``false``
    disables the group-commit writer (a baseline for ``bench load``)."""
    value = os.environ.get("MEMORY_WRITE_QUEUE", "on").strip().lower()
    return value not in ("off", "0", "false", "no")


class BodyLimit:
    """ASGI middleware: a request body larger than ``max_bytes`` is answered 413 in the
    error shape before any handler runs (``Limits.max_body_bytes``, 1 MiB by default)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                chunks = []
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Any:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any) -> None:
        detail = f"request body is larger than {self.max_bytes} bytes (MEMORY_MAX_BODY_BYTES)"
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _call(fn: Callable[[], T]) -> T:
    """Run a service call, mapping project errors onto HTTP errors."""
    try:
        return fn()
    except AuthenticationError as e:
        raise HTTPException(
            status_code=401, detail=str(e), headers={"WWW-Authenticate": "Bearer"}
        ) from e
    except PermissionDeniedError as e:
        raise HTTPException(status_code=403, detail=str(e)) from e
    except (UnknownAgentError, NotFoundError) as e:
        raise HTTPException(status_code=404, detail=str(e)) from e
    except ValidationError as e:
        raise HTTPException(status_code=422, detail=str(e)) from e
    except HTTPException:
        raise
    except Exception as e:  # logged with its traceback; the client gets a generic message
        logger.exception("memory API request failed")
        kind = "memory pipeline error" if isinstance(e, MemoryPipelineError) else "internal error"
        raise HTTPException(status_code=500, detail=f"{kind}; see the server log") from e


def _json_safe(value: Any) -> Any:
    """``value`` as plain JSON (no NaN/Infinity); anything else becomes its ``repr``."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return repr(value)


def _result_body(result: Any) -> WriteResultBody:
    data = result.model_dump(exclude={"request"})
    return WriteResultBody(**data, request=_json_safe(result.request))


def _describe(errors: Sequence[Any]) -> str:
    """A one-line, human-readable summary of request validation errors."""
    parts: list[str] = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            reason = (err.get("ctx") or {}).get("error")
            parts.append("body is not valid JSON" + (f" ({reason})" if reason else ""))
            continue
        where = ".".join(loc) or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts or ["invalid body"])


def _error_list(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Validation errors without the echoed input (which may not be valid JSON)."""
    return [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors
    ]


# --------------------------------------------------------------------------- app


def create_app(svc: MemoryService, *, write_queue: bool = True) -> FastAPI:
    """The FastAPI application over an open service (the caller keeps ownership of it).

    ``write_queue``: route writes through one :class:`WriteQueue` (group commit; kept on
    ``app.state.write_queue``, drained and stopped when the app shuts down); False runs
    them in the handler threads, serialised per run."""
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
        "injection (CONTRACT §4).",
        lifespan=lifespan,
    )
    run_locks = RunLocks()
    app.state.write_queue = writer
    app.add_middleware(BodyLimit, max_bytes=limits().max_body_bytes)

    app.state.authorize = allow

    @app.middleware("http")
    async def _authenticate(request: Request, call_next: Any) -> Any:
        """Every path but ``OPEN_PATHS``, before its body is read: the request's API key
        once the home has keys (kept on ``request.state.api_key``; None while it has none)."""
        request.state.api_key = None
        if request.url.path not in OPEN_PATHS:
            header = request.headers.get("authorization")
            try:
                request.state.api_key = await run_in_threadpool(auth.authenticate, header)
            except AuthenticationError as e:
                return JSONResponse(
                    status_code=401, content={"detail": str(e)}, headers={"WWW-Authenticate": "Bearer"}
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
            status_code=422, content={"detail": _describe(errors), "errors": _error_list(errors)}
        )

    @app.post("/v1/memory-writes", response_model=WritesResponse, responses=_ERROR_RESPONSES)
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
                results=[_result_body(r) for r in results],
                feedback=svc.format_write_feedback(results),
            )

        return _call(run)

    @app.post("/v1/inject", response_model=InjectResponse, responses=_ERROR_RESPONSES)
    def inject(body: InjectRequest, request: Request) -> InjectResponse:
        """The notes and examples to prepend to a run, rendered as one system message."""

        def run() -> InjectResponse:
            allow(request, body.context)
            injection = svc.inject(body.context, body.current_input)
            return InjectResponse(
                message=injection.message,
                notes=list(injection.notes),
                examples=list(injection.examples),
            )

        return _call(run)

    @app.post("/v1/explain", response_model=Explanation, responses=_ERROR_RESPONSES)
    def explain(body: ExplainRequest, request: Request) -> Explanation:
        """Why the agent does (or does not) remember a topic, note by note (read-only)."""

        def run() -> Explanation:
            allow(request, body.context)
            return svc.explain(body.context, body.topic, body.current_input, limit=body.limit)

        return _call(run)

    @app.get(
        "/healthz",
        response_model=HealthResponse,
        responses={503: {"model": HealthResponse, "description": "The home cannot be written"}},
    )
    def healthz() -> Any:
        """Liveness and a glance at the store: table versions and row counts; 503
        ``degraded`` with the reason when the home or the SQL database cannot be written."""
        problem = write_problem(svc.home, svc.sources)
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

        return _call(run)

    return app


# --------------------------------------------------------------------------- serving


def serve(
    home: str | None, host: str, port: int, *, llm: str | None = None, log_level: str = "info"
) -> int:
    """``memory-pipelines serve``: open the memory home and serve the API until stopped.

    Writes go through the group-commit writer unless ``MEMORY_WRITE_QUEUE=off``; the
    injection attribution is buffered (flushed in batches, and when the server stops)."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides: dict[str, Any] = {}
    if llm:
        overrides["llm"] = llm
    try:
        svc = MemoryService.from_env(home, **overrides)
    except MemoryPipelineError as e:
        print(f"memory-pipelines serve: {e}", file=sys.stderr)
        return 1
    try:
        refusal = bind_refusal(host, svc.sources)
        if refusal is not None:
            print(refusal, file=sys.stderr)
            return 1
        buffer_attribution(svc.context)
        return run_server(create_app(svc, write_queue=write_queue_enabled()), host, port, log_level)
    finally:
        svc.close()


@contextmanager
def serving_in_thread(app: Any, *, start_timeout: float = 30) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a background thread for the
    block (tests, benchmarks); yields its base URL. The socket is bound before the server
    starts, so no other process can take the port meanwhile."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def run_server(app: Any, host: str, port: int, log_level: str) -> int:
    """Serve ``app`` with uvicorn in the foreground until SIGINT or SIGTERM; the exit code
    of a server command (1 when it never started, e.g. its port was taken)."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10
    )
    server = uvicorn.Server(config)

    def stop(signum: int, frame: Any) -> None:
        # uvicorn handles SIGINT/SIGTERM itself while serving and re-raises the signal
        # after its graceful shutdown; answering it here lets the caller close its service
        # and the command exit 0 instead of dying by the default handler.
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else 1

