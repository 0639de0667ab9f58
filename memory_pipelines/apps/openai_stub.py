"""A scripted OpenAI-compatible chat server: the upstream of the proxy's fast tests and
of ``memory-pipelines bench proxy``.

``create_stub_app(script=None)`` builds a FastAPI app answering
``POST /v1/chat/completions`` (streaming or not) and ``GET /v1/models``. Every request
body it receives is appended to ``app.state.requests``; each answer is the next item of
``app.state.script`` (a :class:`collections.deque` the caller may extend at any time),
or ``app.state.default`` when the script is empty. A scripted reply is a dict:

- ``{"content": "text"}``: an assistant message (streamed in ``chunks`` pieces, default 3);
- ``{"tool_calls": [{"name": "...", "arguments": {...} | "json"}], "content": None}``:
  tool calls (``finish_reason`` ``tool_calls``);
- ``{"status": 500, "message": "..."}``: an error answer in the OpenAI error format;
- ``{"fail_after": N, "content": ...}`` (streaming only): the stream sends N content
  pieces and then an error event instead of finishing;
- ``"delay": seconds`` in any reply: wait that long before answering (a slow upstream).

It has no memory of its own and no dependency on the rest of the project.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

STUB_MODEL = "stub"


def _pieces(text: str, n: int) -> list[str]:
    if not text:
        return []
    n = max(1, min(n, len(text)))
    size = -(-len(text) // n)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _tool_calls(reply: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for i, call in enumerate(reply.get("tool_calls") or []):
        args = call.get("arguments", {})
        calls.append(
            {
                "id": call.get("id", f"call_{i}"),
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    return calls


def _completion(reply: dict[str, Any], n: int) -> dict[str, Any]:
    calls = _tool_calls(reply)
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-stub-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": STUB_MODEL,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def _sse(reply: dict[str, Any], n: int) -> Iterator[str]:
    base = {"id": f"chatcmpl-stub-{n}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": STUB_MODEL}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        body = dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])
        return f"data: {json.dumps(body)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    pieces = _pieces(reply.get("content") or "", int(reply.get("chunks", 3)))
    fail_after = reply.get("fail_after")
    for i, piece in enumerate(pieces):
        if fail_after is not None and i >= fail_after:
            break
        yield chunk({"content": piece})
    if fail_after is not None:
        error = {"error": {"message": "stub stream failure", "type": "server_error", "code": None}}
        yield f"data: {json.dumps(error)}\n\n"
        return
    calls = _tool_calls(reply)
    for i, call in enumerate(calls):
        args = call["function"]["arguments"]
        half = len(args) // 2
        first = {"index": i, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": args[:half]}}
        yield chunk({"tool_calls": [first]})
        yield chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]})
    yield chunk({}, "tool_calls" if calls else "stop")
    yield "data: [DONE]\n\n"


def create_stub_app(script: list[dict[str, Any]] | None = None) -> FastAPI:
    """The scripted server (see the module docstring)."""
    app = FastAPI(title="openai-stub")
    app.state.requests = []
    app.state.script = deque(script or [])
    app.state.default = {"content": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": STUB_MODEL, "object": "model", "owned_by": "stub"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        app.state.requests.append(body)
        n = len(app.state.requests)
        reply = app.state.script.popleft() if app.state.script else app.state.default
        if reply.get("delay"):
            await asyncio.sleep(float(reply["delay"]))
        if "status" in reply:
            error = {"message": reply.get("message", "stub error"), "type": "server_error",
                     "param": None, "code": None}
            return JSONResponse(status_code=int(reply["status"]), content={"error": error})
        if body.get("stream"):
            return StreamingResponse(_sse(reply, n), media_type="text/event-stream")
        # ASCII JSON, as json.dumps writes it: a lone surrogate travels as its escape
        return Response(json.dumps(_completion(reply, n)), media_type="application/json")

    return app
