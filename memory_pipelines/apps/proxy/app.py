"""The memory proxy's application: ``create_app(svc, model)`` builds the
OpenAI-compatible endpoint over an open service and :func:`serve` serves it until
stopped. The protocol (identity headers, injection, ``memoryWrites``, recording,
streaming, keys, errors) is described in :mod:`memory_pipelines.apps.proxy`; the routes
are in :mod:`.routes`, the steps of a turn in :mod:`.engine`, a streamed answer in
:mod:`.streaming`.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from memory_pipelines.apps.http import run_server, write_queue_enabled
from memory_pipelines.apps.http.common import BodyLimit
from memory_pipelines.apps.proxy.engine import (
    DEFAULT_TIMEOUT,
    AnswerResponse,
    ProxyEngine,
    json_requested,
)
from memory_pipelines.apps.proxy.routes import authenticate, router
from memory_pipelines.errors import MemoryPipelineError
from memory_pipelines.injection.attribution import buffer_attribution
from memory_pipelines.keys import bind_refusal
from memory_pipelines.service import MemoryService

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_TIMEOUT",
    "AnswerResponse",
    "ProxyBodyLimit",
    "create_app",
    "json_requested",
    "serve",
]

#: Largest request body the proxy takes (``--max-body-bytes``, ``MEMORY_PROXY_MAX_BODY_BYTES``):
#: larger than ``serve``'s, as a chat turn carries the whole history and may carry images.
DEFAULT_MAX_BODY_BYTES = 8 << 20


class ProxyBodyLimit(BodyLimit):
    """``serve``'s body limit, answering 413 in the OpenAI error format."""

    async def _too_large(self, send: Any) -> None:
        body = json.dumps({"error": {
            "message": f"request body is larger than {self.max_bytes} bytes (the proxy's "
            "--max-body-bytes / MEMORY_PROXY_MAX_BODY_BYTES)",
            "type": "invalid_request_error", "param": None, "code": "request_too_large",
        }}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]})
        await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------- app


def create_app(
    svc: MemoryService,
    model: str,
    *,
    passthrough: bool = False,
    upstream: Mapping[str, Any] | None = None,
    write_queue: bool = True,
    timeout: float | None = None,
    max_body_bytes: int | None = None,
    max_injected_tokens: int | Mapping[str, int] | None = None,
) -> FastAPI:
    """The proxy over an open service (the caller keeps ownership of it), in front of the
    litellm ``model`` (``"offline"``: the built-in offline demo model,
    :mod:`~memory_pipelines.apps.proxy.offline`); ``upstream`` adds keyword arguments to
    every litellm call (e.g. ``api_base``, ``api_key``). ``write_queue``: the turns'
    ``memoryWrites`` go through one group-commit writer
    (:class:`~memory_pipelines.apps.http.WriteQueue`, on ``app.state.write_queue``, stopped
    with the app); False runs them in the request threads. ``timeout``: seconds to wait
    for the upstream (default :data:`DEFAULT_TIMEOUT`; then 504). ``max_body_bytes``: the
    largest request body (default :data:`DEFAULT_MAX_BODY_BYTES`; larger is 413).
    ``max_injected_tokens``: a token budget for the system message the proxy adds, one
    number for every agent or a mapping agent id -> budget (key ``"*"``: the others);
    the lowest-ranked examples, then notes, are left out until it fits."""
    engine = ProxyEngine(
        svc, model, passthrough=passthrough, upstream=upstream, write_queue=write_queue,
        timeout=timeout, max_injected_tokens=max_injected_tokens,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await run_in_threadpool(engine.close)

    app = FastAPI(
        title="memory-pipelines proxy",
        description="An OpenAI-compatible endpoint that gives any agent memory.",
        lifespan=lifespan,
    )
    app.state.proxy = engine
    app.state.write_queue = engine.writer
    app.add_middleware(ProxyBodyLimit, max_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES)
    app.middleware("http")(authenticate)
    app.include_router(router)
    return app


# --------------------------------------------------------------------------- serving


def serve(
    home: str | None,
    model: str,
    host: str,
    port: int,
    *,
    passthrough: bool = False,
    log_level: str = "info",
    timeout: float | None = None,
    max_body_bytes: int | None = None,
    max_injected_tokens: int | Mapping[str, int] | None = None,
) -> int:
    """``memory-pipelines proxy``: serve the OpenAI-compatible memory proxy until stopped."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        svc = MemoryService.from_env(home)
    except MemoryPipelineError as e:
        print(f"memory-pipelines proxy: {e}", file=sys.stderr)
        return 1
    try:
        refusal = bind_refusal(host, svc.sources, "proxy")
        if refusal is not None:
            print(refusal, file=sys.stderr)
            return 1
        buffer_attribution(svc.context)
        app = create_app(
            svc, model, passthrough=passthrough, write_queue=write_queue_enabled(), timeout=timeout,
            max_body_bytes=max_body_bytes, max_injected_tokens=max_injected_tokens,
        )
        return run_server(app, host, port, log_level)
    finally:
        svc.close()

