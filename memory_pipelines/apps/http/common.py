"""What every route shares: the body-size limit, the error mapping of service calls and
the readable 422 messages."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request
from pydantic import BaseModel

from memory_pipelines.apps.http.models import WriteResultBody
from memory_pipelines.errors import (
    AuthenticationError,
    ConfigError,
    MemoryPipelineError,
    NotFoundError,
    PermissionDeniedError,
    RunConflictError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.phases.lease import ManagerBusyError
from memory_pipelines.service import MemoryService

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds an HTTP request that needs the home's Memory Manager lease (erasing a note)
#: waits for a running Memory Manager before answering 503 (``MEMORY_HTTP_LEASE_WAIT``).
DEFAULT_HTTP_LEASE_WAIT_S = 5.0
#: The ``Retry-After`` of that 503, in seconds.
BUSY_RETRY_AFTER_S = 30


def http_lease_wait(value: float | None = None) -> float:
    """``value``, else ``MEMORY_HTTP_LEASE_WAIT``, else :data:`DEFAULT_HTTP_LEASE_WAIT_S`:
    a finite number of seconds, 0 or more (else a ``ConfigError`` naming the setting)."""
    name = "lease_wait_s"
    if value is None:
        raw = os.environ.get("MEMORY_HTTP_LEASE_WAIT", "").strip()
        if not raw:
            return DEFAULT_HTTP_LEASE_WAIT_S
        name = "MEMORY_HTTP_LEASE_WAIT"
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a finite number of seconds, 0 or more, got {value!r}")
    return float(value)


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


def call_service(fn: Callable[[], T]) -> T:
    """Run a service call, mapping project errors onto HTTP errors."""
    try:
        return fn()
    except AuthenticationError as e:
        raise HTTPException(
            status_code=401, detail=str(e), headers={"WWW-Authenticate": "Bearer"}
        ) from e
    except PermissionDeniedError as e:
        raise HTTPException(status_code=403, detail=str(e)) from e
    except RunConflictError as e:
        raise HTTPException(status_code=409, detail=str(e)) from e
    except (UnknownAgentError, NotFoundError) as e:
        raise HTTPException(status_code=404, detail=str(e)) from e
    except ValidationError as e:
        raise HTTPException(status_code=422, detail=str(e)) from e
    except ManagerBusyError as e:  # the holder (host, pid) goes to the log, not the client
        logger.warning("memory API request refused while the home is busy: %s", e)
        raise HTTPException(
            status_code=503,
            detail="A Memory Manager run holds this home, so nothing was changed: retry "
            f"in {BUSY_RETRY_AFTER_S} seconds.",
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
        ) from e
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


def result_body(result: Any) -> WriteResultBody:
    data = result.model_dump(exclude={"request"})
    return WriteResultBody(**data, request=_json_safe(result.request))


def describe_errors(errors: Sequence[Any]) -> str:
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


def error_list(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Validation errors without the echoed input (which may not be valid JSON)."""
    return [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors
    ]


# --------------------------------------------------------------------------- dependencies


async def service(request: Request) -> MemoryService:
    """The service of the app serving ``request`` (``app.state.svc``)."""
    return request.app.state.svc


async def api_key(request: Request) -> Any:
    """The request's API key row (None while the home has no keys)."""
    return getattr(request.state, "api_key", None)


#: A route's parameter for the app's service, and for the caller's API key row.
Service = Annotated[MemoryService, Depends(service)]
ApiKey = Annotated[Any, Depends(api_key)]
