"""One turn of the memory proxy: identity headers, OpenAI-format errors, the
``memoryWrites`` taken out of an answer, and the filter a streamed choice goes through.

:func:`split_memory_writes` takes the ``memoryWrites`` array out of a JSON answer (the
whole content one JSON object, optionally in a ```` ```json ```` fence) and
:func:`tool_writes` out of ``memory_write`` tool-call arguments; :class:`ChoiceFilter`
does both for a streamed choice. :class:`ProxyError` is an answer in the OpenAI error
format; :func:`proxy_error` and :func:`upstream_error` map exceptions to it. See
:mod:`memory_pipelines.apps.proxy` for the protocol.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError as PydanticValidationError

from memory_pipelines.errors import (
    AuthenticationError,
    MemoryPipelineError,
    NotFoundError,
    PermissionDeniedError,
    RunConflictError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.litellm_loader import import_litellm
from memory_pipelines.notes import RunContext
from memory_pipelines.writes.protocol import ANSWER_FIELD, BLOCK_OPEN, scrub, split_memory_writes

logger = logging.getLogger(__name__)

#: The function tool tool-calling models get to save a memory.
MEMORY_TOOL = "memory_write"
MEMORY_TOOL_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": MEMORY_TOOL,
        "description": "Save one durable fact or preference for future runs (see Durable "
        "Memory). The result arrives on the next turn.",
        "parameters": {
            "type": "object",
            "properties": {
                "note": {"type": "string", "description": "one atomic third-person fact"},
                "type": {"type": "string", "enum": ["Preference", "Context"]},
                "scopeHint": {"type": "string", "enum": ["user", "agent"]},
            },
            "required": ["note", "type"],
        },
    },
}

#: Identity headers -> RunContext fields.
HEADERS = {
    "agent_id": "x-memory-agent",
    "user_id": "x-memory-user",
    "company_id": "x-memory-company",
    "run_id": "x-memory-run",
    "conversation_id": "x-memory-conversation",
}

FEEDBACK_KEY = "proxy.write-feedback"
#: How a JSON answer envelope opens, without its whitespace.
ENVELOPE_HEAD = '{"' + ANSWER_FIELD + '":"'
_ENVELOPE = re.compile(r'\s*\{\s*"' + ANSWER_FIELD + r'"\s*:\s*"')
_BLOCK_END = re.compile(r"```memorywrites.*?```", re.IGNORECASE | re.DOTALL)
_LENIENT = json.JSONDecoder(strict=False)


def _hex(digits: str) -> int:
    try:
        return int(digits, 16)
    except ValueError:
        return -1


def _decode(raw: str) -> str:
    """A complete stretch of a JSON string's body as text (raw if it does not decode)."""
    if not raw:
        return ""
    try:
        return scrub(str(_LENIENT.decode('"' + raw + '"')))
    except ValueError:
        return scrub(raw)


# --------------------------------------------------------------------------- errors


# The OpenAI chat-completion request fields a client may set; every other body field is
# dropped before the upstream call. The proxy's operator alone chooses where the call goes
# and with which credentials (the `upstream` arguments of `create_app`).
FORWARDED_FIELDS = frozenset({
    "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "modalities", "n", "parallel_tool_calls",
    "prediction", "presence_penalty", "reasoning_effort", "response_format", "seed",
    "service_tier", "stop", "stream_options", "temperature", "tool_choice", "tools",
    "top_logprobs", "top_p", "user", "web_search_options",
})
# Fields that would choose the upstream's address, credentials, headers or answer: a
# request naming one is refused, so a client learns at once that it cannot set them.
REFUSED_FIELDS = frozenset({
    "api_base", "base_url", "api_key", "api_version", "organization", "project",
    "custom_llm_provider", "extra_headers", "headers", "extra_body", "extra_query",
    "mock_response", "mock_tool_calls", "mock_timeout", "timeout", "request_timeout",
    "num_retries", "max_retries", "fallbacks", "litellm_params", "metadata",
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "aws_region_name",
    "vertex_credentials", "vertex_project", "vertex_location", "azure_ad_token",
    "deployment_id", "client", "proxy_server_request",
})


def forwarded_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The client's request fields that reach the upstream call: the allow-listed
    OpenAI parameters only. Raises :class:`ProxyError` (400) for a field that would
    choose the upstream's address, credentials, headers or a mock answer."""
    refused = sorted(k for k in body if isinstance(k, str) and k.lower() in REFUSED_FIELDS)
    if refused:
        raise ProxyError(
            400,
            f"invalid request: {', '.join(repr(k) for k in refused)} may not be set by a "
            "client; the proxy's operator chooses the upstream and its credentials",
            code="forbidden_field",
        )
    return {k: v for k, v in body.items() if k in FORWARDED_FIELDS}


class ProxyError(Exception):
    """An answer in the OpenAI error format."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: Any = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}
        return JSONResponse(status_code=self.status, content=body, headers=dict(headers or {}))


def proxy_error(e: Exception) -> ProxyError:
    """A project error (or anything else) as a :class:`ProxyError`."""
    if isinstance(e, ProxyError):
        return e
    if isinstance(e, AuthenticationError):
        return ProxyError(401, str(e), "invalid_request_error", "invalid_api_key")
    if isinstance(e, PermissionDeniedError):
        return ProxyError(403, str(e), "permission_error", "permission_denied")
    if isinstance(e, RunConflictError):
        return ProxyError(409, str(e), "invalid_request_error", "run_conflict")
    if isinstance(e, UnknownAgentError):
        return ProxyError(404, str(e), "invalid_request_error", "agent_not_found")
    if isinstance(e, NotFoundError):
        return ProxyError(404, str(e), "invalid_request_error", "not_found")
    if isinstance(e, (ValidationError, PydanticValidationError)):
        return ProxyError(400, f"invalid request: {e}", "invalid_request_error", None)
    logger.error("memory proxy request failed: %s", type(e).__name__)
    logger.debug("memory proxy failure", exc_info=e)
    kind = "memory pipeline error" if isinstance(e, MemoryPipelineError) else "internal error"
    return ProxyError(500, f"{kind}; see the proxy log", "server_error", None)


def upstream_error(e: Exception) -> ProxyError:
    """An upstream (litellm) failure as the client's error: the upstream's status for its
    client errors (400, 404, 413, 422, 429, ...) and for 503/504, 502 for any other
    failing or unreachable upstream or its own authentication, 504 for a timeout."""
    litellm = import_litellm()

    status = getattr(e, "status_code", None)
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, litellm.Timeout):
        code = 504
    elif isinstance(e, litellm.APIConnectionError) or not isinstance(status, int):
        code = 502
    elif status in (401, 403, 407) or not 400 <= status < 600:
        code = 502
    elif status >= 500:
        code = status if status in (503, 504) else 502
    else:
        code = status
    logger.warning("upstream model error: %s (status %s)", type(e).__name__, status)
    return ProxyError(code, f"upstream model error: {message}", "upstream_error", status)


# --------------------------------------------------------------------------- answers


def text_of(content: Any) -> str | None:
    """The text of a message's ``content`` (a string or a list of parts), or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        return "\n".join(parts) if parts else None
    return None


def tool_writes(arguments: Any) -> list[Any]:
    """The writes of one ``memory_write`` call: its arguments object (or the items of a
    ``memoryWrites`` array in it); unparseable arguments become one malformed write."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return [arguments]
    if isinstance(args, Mapping) and isinstance(args.get("memoryWrites"), list):
        return list(args["memoryWrites"])
    return [args]


# --------------------------------------------------------------------------- turns


@dataclass
class Turn:
    """One chat completion of one agent run, and what it must record."""

    ctx: RunContext
    completion_id: str
    user_text: str | None
    user_message_id: str | None
    intercept_tools: bool
    pending: str = ""  # the previous turn's write feedback this turn delivers
    keep_json: bool = False  # the client asked for JSON: a JSON answer stays JSON
    writes: list[Any] = field(default_factory=list)
    answer: str = ""

    def headers(self) -> dict[str, str]:
        return {
            "X-Memory-Run": self.ctx.run_id or "",
            "X-Memory-Conversation": self.ctx.conversation_id or "",
            "X-Memory-Message": self.completion_id,
        }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def last_user(msgs: Sequence[Any]) -> tuple[int | None, str | None]:
    for i in range(len(msgs) - 1, -1, -1):
        m = msgs[i]
        if isinstance(m, Mapping) and m.get("role") == "user":
            return i, text_of(m.get("content"))
    return None, None


class ChoiceFilter:
    """The stream state of one choice: what of its content the client gets now, what is
    held back, and its tool calls.

    ``strip`` False passes content through untouched. Otherwise the memory protocol is
    removed as the text streams: a ``{"answer": "..."}`` envelope streams its answer's
    text as it is decoded; a trailing ``memoryWrites`` block is held back from its opening
    fence on (and so is a tail that may be the start of one); any other JSON answer is
    buffered to the end and sent stripped. ``keep_json`` (the client asked for JSON): a
    JSON answer is buffered and sent as JSON without ``memoryWrites``. The writes come
    from the whole content at the end (:meth:`flush`), parsed once."""

    def __init__(self, strip: bool, intercept: bool, keep_json: bool = False):
        self.mode = "undecided" if strip else "raw"
        self.intercept = intercept
        self.keep_json = keep_json
        self.raw = ""  # every content piece received
        self.held = ""  # content received and not (yet) sent
        self.sent = ""  # content the client got
        self.tools: dict[int, int | None] = {}  # upstream index -> client index (None: ours)
        self.args: dict[int, str] = {}
        self.passed_tools = 0
        self.finished = False

    def content(self, piece: str) -> str:
        """What to send now of a content delta."""
        piece = scrub(piece)
        if self.mode == "raw":
            self.sent += piece
            return piece
        self.raw += piece
        self.held += piece
        out = self._advance()
        self.sent += out
        return out

    def _advance(self) -> str:
        if self.mode == "undecided":
            head = self.held.lstrip()
            if not head:
                return ""
            if head[0] == "{":
                if self.keep_json:
                    self.mode = "buffer"
                    return ""
                compact = "".join(head.split())
                if ENVELOPE_HEAD.startswith(compact):
                    return ""  # may still become the answer envelope
                match = _ENVELOPE.match(self.held)
                if match is None:
                    self.mode = "buffer"
                    return ""
                self.mode, self.held = "envelope", self.held[match.end():]
            elif head[0] == "`":
                if "\n" not in head and len(head) < len(BLOCK_OPEN) + 8:
                    return ""  # the fence's info string decides
                if head[: len(BLOCK_OPEN)].lower() == BLOCK_OPEN.lower():
                    self.mode = "block"
                    return ""
                if re.match(r"```(?:json)?\s*(?:\{|$)", head, re.IGNORECASE):
                    self.mode = "buffer"
                    return ""
                self.mode = "text"
            else:
                self.mode = "text"
        if self.mode == "text":
            return self._text()
        if self.mode == "envelope":
            return self._envelope()
        return ""  # buffer, block, tail: held to the end

    def _text(self) -> str:
        """Plain text: everything up to a trailing block's fence (or what may start one)."""
        lower = self.held.lower()
        at = lower.find(BLOCK_OPEN.lower())
        if at >= 0:
            out = self.held[:at].rstrip()
            self.held, self.mode = self.held[at:], "block"
            return out
        keep = 0
        for k in range(min(len(BLOCK_OPEN) - 1, len(lower)), 0, -1):
            if BLOCK_OPEN.lower().startswith(lower[-k:]):
                keep = k
                break
        cut = len(self.held) - keep
        while cut > 0 and self.held[cut - 1].isspace():
            cut -= 1
        out, self.held = self.held[:cut], self.held[cut:]
        return out

    def _envelope(self) -> str:
        """The envelope's answer string, decoded as far as it is complete."""
        text, i = self.held, 0
        while i < len(text):
            c = text[i]
            if c == '"':
                out = _decode(text[:i])
                self.held, self.mode = text[i + 1 :], "tail"
                return out
            if c == "\\":
                if i + 1 >= len(text):
                    break
                if text[i + 1] == "u":
                    if i + 6 > len(text):
                        break
                    if 0xD800 <= _hex(text[i + 2 : i + 6]) < 0xDC00:  # a pair: wait for its low half
                        low = text[i + 6 : i + 12]
                        if len(low) < 6 and "\\u".startswith(low[:2]):
                            break
                        if low[:2] == "\\u" and 0xDC00 <= _hex(low[2:]) < 0xE000:
                            i += 12
                            continue
                    i += 6
                    continue
                i += 2
                continue
            i += 1
        out = _decode(text[:i])
        self.held = text[i:]
        return out

    def flush(self) -> tuple[str, list[Any]]:
        """At the end of the choice: the held content still due and the writes."""
        if self.mode == "raw":
            return "", []
        text, writes = split_memory_writes(self.raw, keep_json=self.keep_json)
        out = ""
        if self.mode in ("buffer", "undecided"):
            out = text
        elif self.mode == "text":
            out = self.held.rstrip() if writes is not None else self.held
        elif self.mode == "block":
            # text after a closed block is the answer's too
            after = _BLOCK_END.split(self.held, maxsplit=1)
            rest = after[1].strip() if len(after) > 1 else ""
            if rest:
                out = ("\n\n" if self.sent else "") + rest
        self.held = ""
        self.sent += out
        return out, writes or []

    def tool_delta(self, call: Mapping[str, Any]) -> dict[str, Any] | None:
        """A tool-call delta as the client gets it (None: held back)."""
        index = int(call.get("index") or 0)
        fn = call.get("function") or {}
        if index not in self.tools:
            ours = self.intercept and fn.get("name") == MEMORY_TOOL
            self.tools[index] = None if ours else self.passed_tools
            if not ours:
                self.passed_tools += 1
        client_index = self.tools[index]
        if client_index is None:
            self.args[index] = self.args.get(index, "") + (fn.get("arguments") or "")
            return None
        out: dict[str, Any] = {"index": client_index}
        if call.get("id"):
            out["id"] = call["id"]
        if call.get("type") or call.get("id"):
            out["type"] = call.get("type") or "function"
        function = {k: fn[k] for k in ("name", "arguments") if fn.get(k) is not None}
        if function:
            out["function"] = function
        return out

    def tool_writes(self) -> list[Any]:
        writes: list[Any] = []
        for index in sorted(self.args):
            writes.extend(tool_writes(self.args[index]))
        return writes

    def finish_reason(self, reason: str | None) -> str | None:
        if reason == "tool_calls" and self.tools and not self.passed_tools:
            return "stop"
        return reason
