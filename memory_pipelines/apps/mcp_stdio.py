"""The MCP stdio transport the ``memory-pipelines mcp`` server runs on: every request gets
an answer.

The ``mcp`` SDK's own stdio transport drops a line it cannot validate: a client that sends
malformed JSON, or a ``tools/call`` whose arguments hold a lone surrogate escape
(``"\\ud800"``, valid JSON that the SDK's strict parser refuses), waits forever, and the
good writes of that call are lost. This transport reads each line itself:

- a line the SDK's parser accepts goes to the server unchanged;
- a line that is JSON but not strict (a lone surrogate) is parsed by Python's ``json``
  and validated as a message from the parsed object, so the server sees the call and
  its tools report the bad field (a write item ``rejected-type``, another argument a tool
  error), while the other writes of the call are saved;
- a line longer than ``MEMORY_MAX_BODY_BYTES`` (1 MiB, the HTTP API's body limit) is
  answered with an invalid-request error carrying its id, and skipped unread;
- a line that is not JSON is answered with a JSON-RPC parse error (-32700, id null);
  JSON that is not a JSON-RPC message, with an invalid-request error (-32600) carrying
  its id when it has one.

Answers are written one line each; text the server's answer holds that UTF-8 cannot
encode is replaced (U+FFFD), so an answer is never lost either. While serving, file
descriptor 1 points at stderr, so a stray ``print`` never corrupts the protocol stream.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, BinaryIO

import anyio
from mcp import types
from mcp.shared.message import SessionMessage

from memory_pipelines.limits import limits, printable

logger = logging.getLogger(__name__)


def error_line(request_id: Any, code: int, message: str) -> str:
    """One JSON-RPC error answer as a line of JSON."""
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    )


def parse_line(line: str) -> SessionMessage | str | None:
    """The message a line holds, or the error line to answer it with (None: nothing to do)."""
    if not line.strip():
        return None
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError:
        pass
    else:
        if isinstance(message, types.JSONRPCNotification) and '"id"' in line:
            return _checked_notification(message, json.loads(line))
        return SessionMessage(message)
    try:
        obj = json.loads(line)
    except ValueError as e:
        return error_line(None, types.PARSE_ERROR, f"Parse error: {e}")
    try:
        message = types.jsonrpc_message_adapter.validate_python(obj, by_name=False)
        if isinstance(message, types.JSONRPCNotification):
            return _checked_notification(message, obj)
        return SessionMessage(message)
    except ValueError:
        request_id = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
            request_id = None
        if request_id is None and isinstance(obj, dict) and "method" in obj:
            logger.warning("dropped an invalid JSON-RPC notification")
            return None  # a notification is never answered
        return error_line(
            request_id, types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message"
        )


def _checked_notification(message: Any, obj: Any) -> SessionMessage | str:
    """A notification, unless the object has an ``id`` that is not a valid request id (the
    SDK reads such a request as a notification, which is never answered)."""
    if isinstance(obj, dict) and "id" in obj:
        return error_line(
            None, types.INVALID_REQUEST, "Invalid Request: id must be a string or a number"
        )
    return SessionMessage(message)


_LEADING_ID = re.compile(rb'^\s*\{[^{]*?"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')


def too_large(head: bytes, bound: int) -> str:
    """The answer to a message longer than ``bound`` bytes (``MEMORY_MAX_BODY_BYTES``, as an
    HTTP body): an invalid-request error, carrying the request's id when the start of the
    line shows it, so the client waiting for that id gets its answer."""
    found = _LEADING_ID.match(head[:4096])
    request_id = json.loads(found.group(1)) if found else None
    return error_line(
        request_id,
        types.INVALID_REQUEST,
        f"Invalid Request: a message is at most {bound} bytes (MEMORY_MAX_BODY_BYTES)",
    )


def answer_line(message: SessionMessage) -> str:
    """A message of the server as one line of JSON (unencodable text replaced)."""
    try:
        return message.message.model_dump_json(by_alias=True, exclude_unset=True)
    except ValueError:  # a lone surrogate in the answer: replace it rather than lose it
        data = message.message.model_dump(mode="python", by_alias=True, exclude_unset=True)
        return json.dumps(printable(data), default=str)


@asynccontextmanager
async def stdio_streams(
    stdin: BinaryIO | None = None, stdout: BinaryIO | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """``(read_stream, write_stream)`` for ``Server.run`` over stdin/stdout (or the given
    binary streams), answering what the server cannot read (see the module docstring)."""
    restore: list[tuple[int, int]] = []
    if stdout is None:  # the wire gets a private descriptor; fd 1 points at stderr
        wire = os.dup(1)
        restore.append((1, os.dup(1)))
        os.dup2(2, 1)
        stdout = os.fdopen(wire, "wb", buffering=0)
    wire_in: BinaryIO = sys.stdin.buffer if stdin is None else stdin
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    out_lock = anyio.Lock()
    sink = anyio.wrap_file(stdout)

    async def emit(line: str) -> None:
        async with out_lock:
            await sink.write((line + "\n").encode("utf-8"))
            await sink.flush()

    async def reader() -> None:
        async with read_send:
            while True:
                bound = limits().max_body_bytes
                raw = await anyio.to_thread.run_sync(wire_in.readline, bound + 1)
                if not raw:
                    break
                if len(raw) > bound and not raw.endswith(b"\n"):
                    await emit(too_large(raw, bound))
                    while raw and not raw.endswith(b"\n"):  # skip the rest of the line
                        raw = await anyio.to_thread.run_sync(wire_in.readline, bound + 1)
                    continue
                parsed = parse_line(raw.decode("utf-8", errors="replace").strip())
                if isinstance(parsed, SessionMessage):
                    await read_send.send(parsed)
                elif parsed is not None:
                    await emit(parsed)

    async def writer() -> None:
        async with write_recv:
            async for message in write_recv:
                await emit(answer_line(message))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            yield read_recv, write_send
            tg.cancel_scope.cancel()
    finally:
        for fd, saved in restore:
            os.dup2(saved, fd)
            os.close(saved)
