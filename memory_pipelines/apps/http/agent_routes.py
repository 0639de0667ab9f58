"""The agent-facing routes: ``POST /v1/memory-writes``, ``/v1/remember``, ``/v1/inject``,
``/v1/explain`` and ``GET /healthz``. Each reads the service through the
:data:`~.access.Service` dependency and checks the caller's key with
:func:`~.access.allow`; writes go through the app's write queue when it has one."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from memory_pipelines.apps.http.access import Service, allow
from memory_pipelines.apps.http.common import call_service, result_body
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
from memory_pipelines.embeddings import embedder_problem
from memory_pipelines.explain import Explanation
from memory_pipelines.home import write_problem
from memory_pipelines.store import injectable

logger = logging.getLogger(__name__)

router = APIRouter()


@router.post("/v1/memory-writes", response_model=WritesResponse, responses=RUN_RESPONSES)
def memory_writes(body: WritesRequest, request: Request, svc: Service) -> WritesResponse:
    """Run the agent's memoryWrites through the guard pipeline; one result per write."""
    ctx = body.context
    writer, run_locks = request.app.state.write_queue, request.app.state.run_locks

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


@router.post("/v1/remember", response_model=RememberResponse, responses=RUN_RESPONSES)
def remember(body: RememberRequest, request: Request, svc: Service) -> RememberResponse:
    """Learn from a conversation now: record the messages, extract durable notes with
    the agent's judge and keep what the in-flight guards let through."""
    ctx = body.context
    run_locks = request.app.state.run_locks

    def run() -> RememberResponse:
        allow(request, ctx)
        if ctx.run_id is None:
            return RememberResponse(notes=svc.remember(ctx, body.messages))
        holder = run_locks.get(ctx.run_id)
        with holder.lock:
            return RememberResponse(notes=svc.remember(ctx, body.messages))

    return call_service(run)


@router.post("/v1/inject", response_model=InjectResponse, responses=RUN_RESPONSES)
def inject(body: InjectRequest, request: Request, svc: Service) -> InjectResponse:
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


@router.post("/v1/explain", response_model=Explanation, responses=ERROR_RESPONSES)
def explain(body: ExplainRequest, request: Request, svc: Service) -> Explanation:
    """Why the agent does (or does not) remember a topic, note by note (read-only)."""

    def run() -> Explanation:
        allow(request, body.context)
        return svc.explain(
            body.context, body.topic, body.current_input, limit=body.limit, as_of=body.as_of
        )

    return call_service(run)


@router.get(
    "/healthz",
    response_model=HealthResponse,
    responses={
        503: {
            "model": HealthResponse,
            "description": "The home cannot be written, or the embedding model is missing",
        }
    },
)
def healthz(svc: Service) -> Any:
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
