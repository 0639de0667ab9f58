"""Who may call the HTTP API, and what a route reads: the middleware that checks the
caller's API key before a body is read (:func:`authenticate`), the dependencies through
which routes get the service (:data:`Service`) and the caller's key (:data:`ApiKey`, both
from :mod:`.common`),
and :func:`allow`, the context check every agent-facing route makes."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from memory_pipelines.apps.http import ui
from memory_pipelines.apps.http.common import ApiKey, Service, describe_errors, error_list
from memory_pipelines.errors import AuthenticationError
from memory_pipelines.keys import check_context

logger = logging.getLogger(__name__)

__all__ = ["OPEN_PATHS", "ApiKey", "Service", "allow", "authenticate", "invalid_request"]

#: Paths that answer without an API key even when the home has keys (every other path,
#: ``/v1/...`` and any route added later, needs one).
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def allow(request: Request, ctx: Any) -> None:
    """403 unless the request's key may act for ``ctx`` (call it in every handler)."""
    check_context(getattr(request.state, "api_key", None), ctx, request.app.state.svc.sources)


async def authenticate(request: Request, call_next: Any) -> Any:
    """Every path but ``OPEN_PATHS``, before its body is read: the request's API key
    once the home has keys (kept on ``request.state.api_key``; None while it has none)."""
    request.state.api_key = None
    if request.url.path not in OPEN_PATHS | ui.UI_OPEN_PATHS:
        # the browser at /ui may also carry the key in its login cookie
        header = request.headers.get("authorization") or ui.cookie_authorization(request)
        try:
            request.state.api_key = await run_in_threadpool(
                request.app.state.authenticator.authenticate, header
            )
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


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A 422 naming each invalid field (``detail``) with the list of errors (``errors``)."""
    errors = exc.errors()
    return JSONResponse(
        status_code=422,
        content={"detail": describe_errors(errors), "errors": error_list(errors)},
    )
