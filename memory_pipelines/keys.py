"""API keys: what binds an HTTP caller to a tenant (CONTRACT §2.8).

A secret looks like ``mp_<key_id>_<random>`` (43 random URL-safe characters); it is shown
once by :func:`create_api_key` and only its SHA-256 is stored (``api_keys`` in the SQL
sources), so a request is looked up by ``key_id`` and compared with
:func:`hmac.compare_digest`.

Once any key was created in a home (revoked ones count, so revoking every key locks the
API instead of reopening it), every API request except ``/healthz`` (and the OpenAPI
schema and docs) needs
``Authorization: Bearer <secret>``: :class:`Authenticator` answers
:class:`~memory_pipelines.errors.AuthenticationError` (401) without one or with an
unknown, wrong or revoked one. :func:`check_context` then holds the request's run context
to the key's binding (:class:`~memory_pipelines.errors.PermissionDeniedError`, 403):

- an admin key may act for any context;
- any other key is bound to a company: the context must name that company (a context
  without a company is refused rather than clamped);
- a key bound to an agent or a user also needs that agent or user in the context;
- a key not bound to a user may name a user only if the sources do not know that user or
  know it as a member of the key's company (user-level notes do not carry the company);
- multi-tenant scopes are claims too: a context may carry a primary scope or secondary
  scopes only if the key was created with them (``--primary-scope``, ``--scope``); every
  secondary dimension it sends must have the key's value. A key created without scopes
  therefore acts only without them, so it never reaches another company's records.

:func:`bind_refusal` is what ``serve`` (and any other server of the API) asks before
listening: a non-loopback address is refused while the home has no key.

**Roles.** Each key has a role, which says what it may do inside its binding:

- ``agent``: write, inject, explain, remember and use the proxy;
- ``analyst``: also read and change notes (list, history, correct, archive) and read
  agents, and use ``/ui``;
- ``admin``: everything (any context, configuring agents, erasing notes).

A key created without a role is an agent key when it is bound to an agent, else an
analyst key (:func:`default_role`); ``admin=True`` is ``role="admin"``. Keys stored
before roles existed are given the same default when the home is opened.
:func:`require_role` is the one check every route and page asks
(:class:`~memory_pipelines.errors.PermissionDeniedError`, 403).

``memory-pipelines keys create|list|revoke`` manages keys from the command line.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memory_pipelines.errors import (
    AuthenticationError,
    NotFoundError,
    PermissionDeniedError,
    ValidationError,
)
from memory_pipelines.limits import check_id

if TYPE_CHECKING:
    from memory_pipelines.context import MemoryContext
    from memory_pipelines.notes import RunContext
    from memory_pipelines.sources import Sources

SECRET_PREFIX = "mp_"
_KEY_ID_BYTES = 6  # 12 hex characters
_SECRET_BYTES = 32

#: Key roles, least privileged first; each may do what the ones before it may.
AGENT = "agent"
ANALYST = "analyst"
ADMIN = "admin"
ROLES: tuple[str, ...] = (AGENT, ANALYST, ADMIN)

#: What a server tells a caller when it refuses to listen without keys.
CREATE_KEY_HINT = "create one with `memory-pipelines keys create --home H --admin` (or --company C)"


# --------------------------------------------------------------------------- secrets


def hash_secret(secret: str) -> str:
    """The stored form of a secret: ``sha256:<hex>`` (secrets are long random tokens)."""
    return "sha256:" + hashlib.sha256(secret.encode("utf-8")).hexdigest()


def key_id_of(secret: str) -> str | None:
    """The key id inside a well-formed secret, else None."""
    if not secret.startswith(SECRET_PREFIX):
        return None
    key_id, sep, rest = secret[len(SECRET_PREFIX) :].partition("_")
    if not sep or not rest or not key_id:
        return None
    return key_id


def _clean(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"{name} must be a non-empty string")
    check_id(name, value)  # bounded, valid UTF-8, no control characters
    return value


def _clean_scopes(value: Any) -> dict[str, str] | None:
    if value is None or value == {}:
        return None
    if not isinstance(value, Mapping):
        raise ValidationError("secondary_scopes must be a mapping of dimension -> value")
    out: dict[str, str] = {}
    for dim, v in value.items():
        if not isinstance(dim, str) or not dim.strip():
            raise ValidationError("secondary_scopes: a dimension must be a non-empty string")
        if v is None or isinstance(v, (dict, list)):
            raise ValidationError(f"secondary_scopes: {dim!r} needs a scalar value")
        check_id("secondary_scopes dimension", dim)
        check_id(f"secondary_scopes[{dim!r}]", str(v))
        out[dim] = str(v)
    return out


# --------------------------------------------------------------------------- service side


def create_api_key(
    mem: MemoryContext,
    *,
    company_id: str | None = None,
    agent_id: str | None = None,
    user_id: str | None = None,
    admin: bool = False,
    primary_scope: tuple[str, str] | None = None,
    secondary_scopes: Mapping[str, Any] | None = None,
    role: str | None = None,
) -> str:
    """Create a key and return its secret (shown once; only its hash is stored).

    ``role`` is one of :data:`ROLES`; None gives :func:`default_role`. ``admin=True`` is
    ``role="admin"`` (giving both with another role is a ``ValidationError``)."""
    company_id = _clean("company_id", company_id)
    agent_id = _clean("agent_id", agent_id)
    user_id = _clean("user_id", user_id)
    scopes = _clean_scopes(secondary_scopes)
    entity = record = None
    if primary_scope is not None:
        if len(primary_scope) != 2:
            raise ValidationError("primary_scope must be (entity_id, record_id)")
        entity = _clean("primary_scope entity_id", primary_scope[0])
        record = _clean("primary_scope record_id", primary_scope[1])
    if not isinstance(admin, bool):
        raise ValidationError("admin must be a boolean")
    if role is not None and role not in ROLES:
        raise ValidationError(
            f"role must be one of {', '.join(ROLES)}, not {role!r}"
        )
    if admin and role not in (None, ADMIN):
        raise ValidationError(f"an admin key has role {ADMIN!r}, not {role!r}")
    admin = admin or role == ADMIN
    bound = any(v is not None for v in (company_id, agent_id, user_id, scopes, record))
    if admin and bound:
        raise ValidationError("an admin key acts for any context: give no company, agent, user or scope")
    if not admin and company_id is None:
        raise ValidationError("a key must be admin or bound to a company (company_id)")
    if user_id is not None:
        known = mem.sources.get_user(user_id)
        if known is not None and known.get("company_id") not in (None, company_id):
            raise ValidationError(
                f"user {user_id!r} belongs to company {known['company_id']!r}, not {company_id!r}"
            )
    key_id = secrets.token_hex(_KEY_ID_BYTES)
    secret = f"{SECRET_PREFIX}{key_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"
    mem.sources.add_api_key(
        {
            "key_id": key_id,
            "secret_hash": hash_secret(secret),
            "company_id": company_id,
            "agent_id": agent_id,
            "user_id": user_id,
            "admin": admin,
            "role": role or default_role(admin=admin, agent_id=agent_id),
            "primary_scope_entity_id": entity,
            "primary_scope_record_id": record,
            "secondary_scopes": scopes,
            "created_at": mem.now(),
        }
    )
    return secret


def revoke_api_key(mem: MemoryContext, key_id: str) -> None:
    """Revoke a key from now on; ``NotFoundError`` if there is no such key."""
    if not isinstance(key_id, str) or not mem.sources.revoke_api_key(key_id):
        raise NotFoundError(f"API key {key_id!r} does not exist")


def default_role(*, admin: bool, agent_id: str | None) -> str:
    """The role of a key created without one: admin for an admin key, agent for a key
    bound to an agent, analyst otherwise."""
    if admin:
        return ADMIN
    return AGENT if agent_id is not None else ANALYST


def role_of(key: Mapping[str, Any] | None) -> str:
    """A key's role (:data:`ROLES`); None (a home without keys) acts as admin. A stored
    value that is not a role acts as the least privileged one."""
    if key is None:
        return ADMIN
    if key.get("admin"):
        return ADMIN
    stored = key.get("role")
    if stored is None:
        return default_role(admin=False, agent_id=key.get("agent_id"))
    return stored if stored in (AGENT, ANALYST) else AGENT


def require_role(key: Mapping[str, Any] | None, needed: str, action: str) -> None:
    """Raise :class:`PermissionDeniedError` unless ``key``'s role is ``needed`` or above
    (None, a home without keys, may do everything). ``action`` says what was refused."""
    have = role_of(key)
    if ROLES.index(have) < ROLES.index(needed):
        raise PermissionDeniedError(
            f"this API key has role {have!r}; {action} needs role {needed!r}"
            + (" or 'admin'" if needed != ADMIN else "")
        )


def binding(key: Mapping[str, Any]) -> str:
    """A key's binding in words, e.g. ``company=c1 agent=a1`` or ``admin``."""
    if key.get("admin"):
        return "admin"
    parts = [f"{name}={key[f'{name}_id']}" for name in ("company", "agent", "user") if key.get(f"{name}_id")]
    if key.get("primary_scope_record_id"):
        parts.append(f"primary={key['primary_scope_entity_id']}:{key['primary_scope_record_id']}")
    for dim, value in sorted((key.get("secondary_scopes") or {}).items()):
        parts.append(f"scope.{dim}={value}")
    return " ".join(parts)


# --------------------------------------------------------------------------- requests


class Authenticator:
    """Checks ``Authorization`` headers against one home's keys.

    Whether keys exist is asked of the database on every request until one does; from
    then on it is remembered (keys are revoked, never deleted). Each authenticated
    request looks its key up by id, so a key created or revoked while a server runs, by
    this process or another, takes effect on the next request.
    """

    def __init__(self, sources: Sources):
        self.sources = sources
        self._enabled = False

    def enabled(self) -> bool:
        """Whether requests need a key (some key was created in this home)."""
        if not self._enabled:
            self._enabled = self.sources.any_api_key()
        return self._enabled

    def authenticate(self, authorization: str | None) -> dict[str, Any] | None:
        """The key row (without hash) of a request, or None when the home has no key.

        Raises :class:`AuthenticationError` when keys exist and the header is missing,
        malformed, or names an unknown, wrong or revoked key.
        """
        if not self.enabled():
            return None
        scheme, _, secret = (authorization or "").strip().partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise AuthenticationError("this API needs an API key: send 'Authorization: Bearer <secret>'")
        key_id = key_id_of(secret)
        row = self.sources.get_api_key(key_id) if key_id else None
        stored = (row or {}).get("secret_hash") or hash_secret("")
        matches = hmac.compare_digest(stored.encode(), hash_secret(secret).encode())
        if row is None or not matches:
            raise AuthenticationError("invalid API key")
        if row.get("revoked_at") is not None:
            raise AuthenticationError("this API key was revoked")
        row.pop("secret_hash", None)
        return row


def _deny(message: str) -> None:
    raise PermissionDeniedError(f"this API key may not act for this context: {message}")


def check_context(
    key: Mapping[str, Any] | None, ctx: RunContext | Mapping[str, Any], sources: Sources | None = None
) -> None:
    """Raise :class:`PermissionDeniedError` unless ``key`` may act for ``ctx`` (see the
    module docstring). ``key`` None (no keys in the home) or an admin key allow anything.
    ``sources``, when given, is asked which company a named user belongs to.

    A ``RunContext`` a key bound to a company but not to a user may act for is marked
    :meth:`~memory_pipelines.notes.RunContext.company_bound`: the notes of its user
    stored without a company belong to no company, so they stay out of its scope."""
    if key is None or key.get("admin"):
        return
    get = ctx.get if isinstance(ctx, Mapping) else (lambda name: getattr(ctx, name, None))
    company = key.get("company_id")
    if get("company_id") != company:
        _deny(f"it is bound to company {company!r}, the context names {get('company_id')!r}")
    for name in ("agent_id", "user_id"):
        if key.get(name) is not None and get(name) != key[name]:
            _deny(f"it is bound to {name} {key[name]!r}, the context names {get(name)!r}")
    user = get("user_id")
    if key.get("user_id") is None and user is not None and sources is not None:
        known = sources.get_user(user)
        if known is not None and known.get("company_id") not in (None, company):
            _deny(f"user {user!r} is not a member of company {company!r}")
    entity, record = get("primary_scope_entity_id"), get("primary_scope_record_id")
    if entity is not None or record is not None:
        if record != key.get("primary_scope_record_id") or entity not in (
            None,
            key.get("primary_scope_entity_id"),
        ):
            _deny("the key is not bound to that primary scope")
    allowed = key.get("secondary_scopes") or {}
    for dim, value in (get("secondary_scopes") or {}).items():
        if value is None:
            continue
        if dim not in allowed or str(value) != str(allowed[dim]):
            _deny(f"the key is not bound to secondary scope {dim}={value!r}")
    if key.get("user_id") is None and hasattr(ctx, "company_bound"):
        ctx.company_bound()


# --------------------------------------------------------------------------- servers


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address: 127.0.0.0/8, ::1 or ``localhost``."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def tcp_port(value: str) -> int:
    """An argparse type for a server's ``--port``: a TCP port in 1..65535 (uvicorn would
    otherwise wrap a larger one and listen elsewhere)."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 1..65535")
    return port


def bind_refusal(host: str, sources: Sources, command: str = "serve") -> str | None:
    """Why a server of the API must not listen on ``host``, or None if it may.

    A non-loopback address is refused while the home has no API key: the API would be
    open to the network.
    """
    if is_loopback(host) or sources.any_api_key():
        return None
    return (
        f"memory-pipelines {command}: refusing to listen on {host!r}: the memory home has no "
        f"API key, so anyone who reaches it could act as any agent, user or company; "
        f"{CREATE_KEY_HINT}, or bind 127.0.0.1"
    )
