"""The memory browser at ``/ui``: server-rendered HTML over the same service calls and
keys as the API (CONTRACT §2.9; no JavaScript, no external assets).

Pages:

- ``GET /ui``: the notes, filtered by ``agent_id``, ``user_id``, ``company_id``,
  ``status`` and a text search ``q`` (``svc.list_notes``), ``limit`` per page (default
  50, at most 500) and a "Next page" link carrying the cursor and the filters;
- ``GET /ui/notes/{id}``: a note's text, scope, status, tier, importance, access count,
  provenance (source run and conversation, author, derived from / consolidated into),
  comments and history (``svc.history``), with forms to edit its text, type and tier
  (``POST /ui/notes/{id}/edit``), archive it (``.../archive``) and restore it
  (``.../restore``); each answers 303 back to the page with a flash message;
- ``GET /ui/login``, ``POST /ui/login`` (form field ``secret``), ``POST /ui/logout``;
- ``GET /ui/static/ui.css``.

Keys (§2.8): once the home has API keys every ``/ui`` page but the login page and the
stylesheet needs one, given as ``Authorization: Bearer <secret>`` or as the HttpOnly,
SameSite=Strict cookie the login form sets (path ``/ui``); without one the answer is the
login page with status 401. Only analyst and admin keys may use it (an agent key is
answered 403). A key bound to a company (agent, user) lists only its
company's (agent's, user's) notes: its binding is forced into the filters (naming
another value is 403) and a note outside it is answered 404 like an unknown one.

Forms that change state carry a CSRF token: an HMAC of a random per-browser nonce (an
HttpOnly cookie) and the key cookie, so a cross-site form cannot forge one. Requests that
authenticate with an ``Authorization`` header carry no ambient credential and need none.

Errors are readable pages with the status of the API: 404 for an unknown note, 422 for
bad input, 403 outside the key's binding. Every text goes through Jinja2's autoescape.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from memory_pipelines.apps.http.common import Service
from memory_pipelines.errors import (
    AuthenticationError,
    NotFoundError,
    PermissionDeniedError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.keys import ANALYST, binding, require_role
from memory_pipelines.limits import check_id, limits, shown
from memory_pipelines.note_events import NoteEvent
from memory_pipelines.notes import (
    INJECTABLE_STATUSES,
    Note,
    NoteStatus,
    NoteType,
    ProtectionTier,
)
from memory_pipelines.scope import LEVEL_LABELS
from memory_pipelines.service import MemoryService

logger = logging.getLogger(__name__)

T = TypeVar("T")

TEMPLATES = Path(__file__).with_name("templates")
UI_PREFIX = "/ui"
CSS_PATH = "/ui/static/ui.css"
LOGIN_PATH = "/ui/login"
LOGOUT_PATH = "/ui/logout"
#: ``/ui`` paths that answer without a key (the stylesheet, logging in and out).
UI_OPEN_PATHS = frozenset({CSS_PATH, LOGIN_PATH, LOGOUT_PATH})

KEY_COOKIE = "mp_ui_key"
NONCE_COOKIE = "mp_ui_nonce"
CSRF_FIELD = "csrf_token"
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
FILTERS = ("agent_id", "user_id", "company_id", "status", "q")
BOUND = ("company_id", "agent_id", "user_id")
#: The fields of the edit form (``svc.update_note`` checks their values).
EDITABLE = ("note", "type", "protection_tier")
#: Flash messages after a form, by the code the redirect carries (never free text).
FLASHES = {
    "edited": "Saved your changes.",
    "unchanged": "Nothing changed: the note already had these values.",
    "archived": "Archived the note.",
    "restored": "Restored the note.",
}
_NONCE_RE = re.compile(r"^[A-Za-z0-9_-]{20,64}$")
#: Signs CSRF tokens; per process, so a restart asks open forms to be reloaded.
_CSRF_SECRET = secrets.token_bytes(32)


class UIError(Exception):
    """An answer other than the page: ``status`` and a readable ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --------------------------------------------------------------------------- templates


def _when(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _scope(note: Note) -> str:
    parts = [
        f"{name}={value}"
        for name, value in (
            ("agent", note.agent_id),
            ("user", note.user_id),
            ("company", note.company_id),
        )
        if value
    ]
    return " ".join(parts) or "global"


def _level(note: Note) -> str:
    _, label = LEVEL_LABELS[(bool(note.agent_id), bool(note.user_id), bool(note.company_id))]
    return label


ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,
)
ENV.filters.update(when=_when, number=_number, scope=_scope, level=_level)


def is_ui_path(path: str) -> bool:
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def cookie_authorization(request: Request) -> str | None:
    """The ``Authorization`` value of a ``/ui`` request's key cookie (None elsewhere or
    without one): the auth middleware reads it when the request has no header."""
    if not is_ui_path(request.url.path):
        return None
    secret = request.cookies.get(KEY_COOKIE)
    return f"Bearer {secret}" if secret else None


def _nonce(request: Request) -> tuple[str, bool]:
    """The browser's CSRF nonce and whether it is new (to be set as a cookie)."""
    current = request.cookies.get(NONCE_COOKIE) or ""
    if _NONCE_RE.match(current):
        return current, False
    return secrets.token_urlsafe(24), True


def csrf_token(nonce: str, key_secret: str | None) -> str:
    message = f"{nonce}|{key_secret or ''}".encode()
    return hmac.new(_CSRF_SECRET, message, hashlib.sha256).hexdigest()


def _cookie_args(request: Request) -> dict[str, Any]:
    return {
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
        "path": UI_PREFIX,
    }


def render(
    request: Request,
    template: str,
    status: int = 200,
    *,
    headers: Mapping[str, str] | None = None,
    keyed_token: bool = True,
    **values: Any,
) -> HTMLResponse:
    """A page of ``template`` with the values every page needs (CSRF token, login state).
    ``keyed_token`` False: the token does not depend on the key cookie (the login form)."""
    nonce, new = _nonce(request)
    key_secret = request.cookies.get(KEY_COOKIE) if keyed_token else None
    key = getattr(request.state, "api_key", None)
    values.setdefault("flash", None)
    html = ENV.get_template(template).render(
        csrf_field=CSRF_FIELD,
        csrf_token=csrf_token(nonce, key_secret),
        css_path=CSS_PATH,
        logged_in=bool(request.cookies.get(KEY_COOKIE)),
        key_binding=binding(key) if key else None,
        **values,
    )
    response = HTMLResponse(html, status_code=status, headers=dict(headers or {}))
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["Referrer-Policy"] = "same-origin"
    if new:
        response.set_cookie(NONCE_COOKIE, nonce, **_cookie_args(request))
    return response


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    titles = {403: "Not allowed", 404: "Not found", 422: "Invalid input", 500: "Server error"}
    return render(
        request,
        "error.html",
        status,
        title=titles.get(status, "Error"),
        code=status,
        message=message,
    )


def _safe_next(value: str | None) -> str:
    """Where to go after logging in: a ``/ui`` path of this site, else ``/ui``."""
    if value and is_ui_path(value.split("?", 1)[0]) and "\\" not in value and not value.startswith("//"):
        return value
    return UI_PREFIX


def login_page(request: Request, message: str | None = None, status: int = 401) -> HTMLResponse:
    """The login form (what the auth middleware answers a ``/ui`` request without a valid
    key: 401, and a stale key cookie is cleared)."""
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    nxt = request.query_params.get("next") if request.url.path == LOGIN_PATH else target
    response = render(
        request,
        "login.html",
        status,
        headers={"WWW-Authenticate": "Bearer"} if status == 401 else None,
        keyed_token=False,
        title="Log in",
        message=message,
        next=_safe_next(nxt),
    )
    if request.cookies.get(KEY_COOKIE) and status == 401:
        response.delete_cookie(KEY_COOKIE, path=UI_PREFIX)
    return response


# --------------------------------------------------------------------------- helpers


def _run(fn: Callable[[], T]) -> T:
    """A service call, its errors mapped onto :class:`UIError` like ``call_service``."""
    try:
        return fn()
    except AuthenticationError as e:
        raise UIError(401, str(e)) from e
    except PermissionDeniedError as e:
        raise UIError(403, str(e)) from e
    except (UnknownAgentError, NotFoundError) as e:
        raise UIError(404, str(e)) from e
    except ValidationError as e:
        raise UIError(422, str(e)) from e


async def _form(request: Request) -> dict[str, str]:
    """The url-encoded form of a POST (one value per field, the last one wins)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _check_csrf(request: Request, form: Mapping[str, str], *, keyed: bool = True) -> None:
    """403 unless the form carries the token of this browser's nonce (and key cookie,
    when ``keyed``); requests with an ``Authorization`` header need none."""
    if request.headers.get("authorization"):
        return  # no ambient credential: a cross-site form cannot send this header
    nonce = request.cookies.get(NONCE_COOKIE) or ""
    given = form.get(CSRF_FIELD, "")
    expected = csrf_token(nonce, request.cookies.get(KEY_COOKIE) if keyed else None)
    if not _NONCE_RE.match(nonce) or not hmac.compare_digest(given.encode(), expected.encode()):
        raise UIError(403, "the form's security token is missing or stale: reload the page and try again")


def _text(name: str, value: str | None) -> str | None:
    """A query value: None when blank, else checked like an id (bounded, no control
    characters, valid UTF-8)."""
    if value is None or not value.strip():
        return None
    try:
        check_id(name, value)
    except ValidationError as e:
        raise UIError(422, str(e)) from e
    return value.strip()


def _filters(params: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {name: _text(name, params.get(name)) for name in FILTERS}
    if out["status"] is not None and out["status"] not in {s.value for s in NoteStatus}:
        raise UIError(422, f"unknown status {shown(out['status'])}: one of " + ", ".join(s.value for s in NoteStatus))
    return out


def _limit(value: str | None) -> int:
    if value is None or value == "":
        return DEFAULT_LIMIT
    if not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise UIError(422, f"limit must be a whole number from 1 to {MAX_LIMIT}, not {shown(value)}")
    return int(value)


def _key(request: Request) -> Mapping[str, Any] | None:
    """The request's API key row (None while the home has no key)."""
    return getattr(request.state, "api_key", None)


def _locked(key: Mapping[str, Any] | None) -> dict[str, str]:
    """The filters a bound key fixes (shown read-only in the form)."""
    if key is None or key.get("admin"):
        return {}
    return {name: key[name] for name in BOUND if key.get(name)}


def _note_for(request: Request, svc: MemoryService, note_id: str) -> Note:
    """The note, if the request's key may see it; 404 otherwise (another tenant's note
    reads as an unknown one)."""
    return _run(lambda: svc.note(note_id, key=_key(request)))


def _query(filters: Mapping[str, Any], **extra: Any) -> str:
    items = {**{k: v for k, v in filters.items() if v}, **{k: v for k, v in extra.items() if v}}
    return urlencode(items)


def _history_rows(events: list[NoteEvent]) -> list[dict[str, Any]]:
    rows = []
    for ev in events:
        details = {k: v for k, v in ev.details.items() if k != "changes"}
        rows.append(
            {
                "at": ev.at,
                "event": ev.event,
                "actor": ev.actor,
                "phase": ev.phase,
                "run_id": ev.run_id,
                "status_before": ev.status_before,
                "status_after": ev.status_after,
                "text_after": ev.text_after,
                "fields": sorted(k for k in ev.changes if k not in {"note", "status"}) if ev.event != "created" else [],
                "details": sorted((k, shown(v, 200)) for k, v in details.items() if v not in (None, "", [], {})),
                "related": ev.related_note_ids,
            }
        )
    return rows


def _changes(note: Note, form: Mapping[str, str]) -> dict[str, str]:
    """The edit form's fields that differ from the note (its text with the browser's line
    breaks and the outer blanks dropped, as the service stores it); ``svc.update_note``
    validates them."""
    given = {name: form.get(name) for name in EDITABLE}
    if given["note"] is not None:
        given["note"] = given["note"].replace("\r\n", "\n").strip()
    return {k: v for k, v in given.items() if v is not None and v != getattr(note, k)}


def _redirect(note_id: str, done: str) -> RedirectResponse:
    return RedirectResponse(f"/ui/notes/{note_id}?{urlencode({'done': done})}", status_code=303)


# --------------------------------------------------------------------------- routes


router = APIRouter(include_in_schema=False)


@functools.cache
def _css() -> str:
    return (TEMPLATES / "ui.css").read_text(encoding="utf-8")


def page(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Answer a handler's :class:`UIError` as an error page."""

    @functools.wraps(fn)
    async def wrapper(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            if request.url.path not in UI_OPEN_PATHS:
                _run(lambda: require_role(_key(request), ANALYST, "the memory browser"))
            return await fn(request, *args, **kwargs)
        except UIError as e:
            if e.status == 401:
                return login_page(request, e.message)
            return error_page(request, e.status, e.message)
        except Exception:
            logger.exception("memory browser request failed")
            return error_page(request, 500, "internal error; see the server log")

    return wrapper


@router.api_route(CSS_PATH, methods=["GET"])
def stylesheet() -> Response:
    return Response(_css(), media_type="text/css", headers={"Cache-Control": "max-age=3600"})


@router.api_route(UI_PREFIX, methods=["GET"])
@page
async def notes_page(request: Request, svc: Service) -> Response:
    """The notes list with its filters and paging."""
    params = request.query_params
    key = _key(request)
    filters = _filters(params)
    limit = _limit(params.get("limit"))
    cursor = _text("cursor", params.get("cursor"))

    def run() -> Any:
        return _run(lambda: svc.list_notes(**filters, limit=limit, cursor=cursor, key=key))

    page_ = await run_in_threadpool(run)
    notes, next_cursor = page_.notes, page_.next_cursor
    filters = {**filters, **_locked(key)}
    next_limit = limit if limit != DEFAULT_LIMIT else None
    return render(
        request,
        "notes.html",
        title="Notes",
        notes=notes,
        filters=filters,
        locked=_locked(key),
        statuses=[s.value for s in NoteStatus],
        next_url=f"{UI_PREFIX}?{_query(filters, limit=next_limit, cursor=next_cursor)}" if next_cursor else None,
        first_url=f"{UI_PREFIX}?{_query(filters, limit=next_limit)}" if cursor else None,
    )


@router.api_route("/ui/notes/{note_id}", methods=["GET"])
@page
async def note_page(request: Request, note_id: str, svc: Service) -> Response:
    """One note: its fields, provenance, history and forms."""

    def run() -> tuple[Note, list[NoteEvent]]:
        note = _note_for(request, svc, note_id)
        return note, _run(lambda: svc.history(note.id))

    note, events = await run_in_threadpool(run)
    return render(
        request,
        "note.html",
        title=f"Note {note.id}",
        note=note,
        history=_history_rows(events),
        flash=FLASHES.get(request.query_params.get("done", "")),
        types=[t.value for t in NoteType],
        tiers=[t.value for t in ProtectionTier],
        injectable=note.status in INJECTABLE_STATUSES,
        max_chars=limits().max_note_chars,
    )


async def form_action(
    request: Request, note_id: str, fn: Callable[[Note, Mapping[str, str]], str]
) -> Response:
    """A form that changes a note: read it, check its CSRF token, run ``fn(note, form)``
    in the thread pool on the note as the request's key sees it (service errors mapped
    by :func:`_run`), and answer 303 back to the note's page with the flash code ``fn``
    returns."""
    form = await _form(request)
    _check_csrf(request, form)

    def run() -> str:
        note = _note_for(request, request.app.state.svc, note_id)
        return _run(lambda: fn(note, form))

    done = await run_in_threadpool(run)
    return _redirect(note_id, done)


@router.api_route("/ui/notes/{note_id}/edit", methods=["POST"])
@page
async def edit_note(request: Request, note_id: str, svc: Service) -> Response:
    """Change a note's text, type or tier (``svc.update_note``)."""

    def edit(note: Note, form: Mapping[str, str]) -> str:
        changes = _changes(note, form)
        if not changes:
            return "unchanged"
        svc.update_note(note.id, key=_key(request), **changes)
        return "edited"

    return await form_action(request, note_id, edit)


@router.api_route("/ui/notes/{note_id}/archive", methods=["POST"])
@page
async def archive_note(request: Request, note_id: str, svc: Service) -> Response:
    """Archive a note (``svc.archive_note``)."""

    def archive(note: Note, form: Mapping[str, str]) -> str:
        svc.archive_note(note.id, key=_key(request))
        return "archived"

    return await form_action(request, note_id, archive)


@router.api_route("/ui/notes/{note_id}/restore", methods=["POST"])
@page
async def restore_note(request: Request, note_id: str, svc: Service) -> Response:
    """Restore an archived or revoked note (``svc.restore_note``)."""

    def restore(note: Note, form: Mapping[str, str]) -> str:
        svc.restore_note(note.id)
        return "restored"

    return await form_action(request, note_id, restore)


@router.api_route(LOGIN_PATH, methods=["GET"])
@page
async def login_form(request: Request) -> Response:
    """The login form (200; the middleware answers other pages 401 with it)."""
    return login_page(request, status=200)


@router.api_route(LOGIN_PATH, methods=["POST"])
@page
async def login(request: Request) -> Response:
    """Check the secret and keep it in an HttpOnly cookie."""
    form = await _form(request)
    _check_csrf(request, form, keyed=False)
    secret = form.get("secret", "").strip()
    target = _safe_next(form.get("next"))
    try:
        key = await run_in_threadpool(
        request.app.state.authenticator.authenticate, f"Bearer {secret}"
    )
    except AuthenticationError as e:
        return login_page(request, str(e))
    try:
        require_role(key, ANALYST, "the memory browser")
    except PermissionDeniedError as e:
        return login_page(request, str(e), status=403)
    response = RedirectResponse(target, status_code=303)
    if key is not None:  # None: the home has no keys, the browser is open
        response.set_cookie(KEY_COOKIE, secret, **_cookie_args(request))
    return response


@router.api_route(LOGOUT_PATH, methods=["POST"])
@page
async def logout(request: Request) -> Response:
    """Forget the key cookie."""
    form = await _form(request)
    _check_csrf(request, form)
    response = RedirectResponse(LOGIN_PATH, status_code=303)
    response.delete_cookie(KEY_COOKIE, path=UI_PREFIX)
    return response
