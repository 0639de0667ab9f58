"""The memory proxy's routes: an OpenAI-compatible chat endpoint, its model list, a
rating endpoint and a liveness probe. Each route reads the app's
:class:`~.engine.ProxyEngine` through the :func:`engine` dependency; :func:`authenticate`
is the middleware that checks the caller's key (every answer in the OpenAI error format).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from memory_pipelines.apps.http import OPEN_PATHS
from memory_pipelines.apps.proxy.engine import ProxyEngine, in_thread, json_requested
from memory_pipelines.apps.proxy.turns import (
    HEADERS,
    MEMORY_TOOL_SPEC,
    ProxyError,
    forwarded_fields,
    new_id,
    proxy_error,
)
from memory_pipelines.errors import AuthenticationError
from memory_pipelines.notes import RunContext

router = APIRouter()


def engine(request: Request) -> ProxyEngine:
    """The proxy engine of the app serving ``request``."""
    return request.app.state.proxy


Engine = Annotated[ProxyEngine, Depends(engine)]


async def authenticate(request: Request, call_next: Any) -> Any:
    """Middleware: the caller's API key on ``request.state.api_key`` (None for the open
    paths), or a 401/403 in the OpenAI format."""
    request.state.api_key = None
    if request.url.path not in OPEN_PATHS:
        auth = request.app.state.proxy.auth
        try:
            request.state.api_key = await in_thread(
                lambda: auth.authenticate(request.headers.get("authorization"))
            )
        except Exception as e:  # noqa: BLE001 - every failure answers in the OpenAI format
            headers = {"WWW-Authenticate": "Bearer"} if isinstance(e, AuthenticationError) else None
            return proxy_error(e).response(headers)
    return await call_next(request)


@router.get("/healthz")
def healthz(proxy: Engine) -> dict[str, Any]:
    """Liveness (no key needed)."""
    return {"status": "ok", "model": proxy.model}


@router.get("/v1/models")
def models(proxy: Engine) -> dict[str, Any]:
    """The one model this proxy serves."""
    return {
        "object": "list",
        "data": [
            {"id": proxy.model, "object": "model", "created": 0, "owned_by": "memory-pipelines"}
        ],
    }


async def json_body(request: Request) -> Any:
    """The request's JSON body; a 400 ``ProxyError`` when it is not JSON."""
    try:
        return await request.json()
    except ValueError:
        raise ProxyError(400, "invalid request: the body is not valid JSON") from None


def turn_ids(request: Request, body: dict[str, Any]) -> dict[str, str | None]:
    """The run context's fields from the identity headers (and the body's ``user``),
    with a new run and conversation id where the client sent none."""
    ids = {name: (request.headers.get(h) or "").strip() or None for name, h in HEADERS.items()}
    if ids["user_id"] is None and isinstance(body.get("user"), str) and body["user"].strip():
        ids["user_id"] = body["user"]
    ids["run_id"] = ids["run_id"] or new_id("run")
    ids["conversation_id"] = ids["conversation_id"] or new_id("conv")
    return ids


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, proxy: Engine) -> Any:
    """One turn of an agent run (see the module docstring)."""
    try:
        body = await json_body(request)
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("messages"), list)
            or not body["messages"]
        ):
            raise ProxyError(400, "invalid request: 'messages' must be a non-empty array")
        forwarded_fields(body)
    except ProxyError as e:
        return e.response()
    stream = bool(body.get("stream"))
    if not (request.headers.get(HEADERS["agent_id"]) or "").strip():
        if not proxy.passthrough:
            return ProxyError(
                400,
                "invalid request: the X-Memory-Agent header is required (the proxy "
                "was not started with --passthrough)",
                code="missing_agent",
            ).response()
        return await proxy.call(body, list(body["messages"]), stream, None)
    try:
        ctx = RunContext(**turn_ids(request, body))
        api_key = request.state.api_key
        turn, system = await in_thread(
            lambda: proxy.prepare(
                api_key, ctx, body["messages"], body.get("tools"), json_requested(body)
            )
        )
    except Exception as e:  # noqa: BLE001 - mapped onto the OpenAI error format
        return proxy_error(e).response()
    msgs = ([{"role": "system", "content": system}] if system else []) + list(body["messages"])
    if turn.intercept_tools:
        body = {**body, "tools": [*body["tools"], MEMORY_TOOL_SPEC]}
    return await proxy.call(body, msgs, stream, turn)


def rating_request(body: Any) -> tuple[str, str, int, str | None]:
    """``(conversation_id, message_id, rating, comment)`` of a rating; 400 when malformed."""
    if not isinstance(body, dict):
        raise ProxyError(400, "invalid request: the body must be a JSON object")
    cid, mid = body.get("conversation_id"), body.get("message_id")
    rating, comment = body.get("rating"), body.get("comment")
    if not isinstance(cid, str) or not cid or not isinstance(mid, str) or not mid:
        raise ProxyError(400, "invalid request: conversation_id and message_id are required")
    if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 10:
        raise ProxyError(400, f"invalid request: rating must be an integer 1-10, got {rating!r}")
    if comment is not None and not isinstance(comment, str):
        raise ProxyError(400, "invalid request: comment must be a string")
    return cid, mid, rating, comment


@router.post("/v1/feedback")
async def feedback(request: Request, proxy: Engine) -> Any:
    """Rate a recorded message: ``{"conversation_id", "message_id", "rating" (1-10),
    "comment"}`` -> the stored rating."""
    try:
        cid, mid, rating, comment = rating_request(await json_body(request))
    except ProxyError as e:
        return e.response()
    api_key = request.state.api_key
    try:
        return await in_thread(lambda: proxy.rate(api_key, cid, mid, rating, comment))
    except Exception as e:  # noqa: BLE001
        return proxy_error(e).response()
