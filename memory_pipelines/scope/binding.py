"""What an API key may see of the notes (CONTRACT §2.8, §2.9).

A key is a row of ``api_keys`` (see :mod:`memory_pipelines.keys`), or None when the home
has no key. None and admin keys see every note. Any other key is bound to a company, and
maybe to an agent and a user: those are forced filters of a listing (a filter naming
another company, agent or user is refused, 403), and a note outside them does not exist
for the key (404, never "forbidden", so its existence is not revealed). A note of a
primary scope or of secondary scopes is inside the binding only if the key was created
with that primary scope and those secondary values. A note without a company
(agent-wide, user-level without company, global) is visible to admin keys only, and a
user's note stored without a company also to the keys bound to that user: it belongs to
no company, so no company-bound key reads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from memory_pipelines.errors import PermissionDeniedError

#: The binding columns of a key, in the order a message names them.
BOUND = ("company_id", "agent_id", "user_id")


def unrestricted(key: Mapping[str, Any] | None) -> bool:
    """Whether ``key`` sees every note (no key in the home, or an admin key)."""
    return key is None or bool(key.get("admin"))


def check_filters(key: Mapping[str, Any] | None, filters: Mapping[str, Any]) -> dict[str, Any]:
    """``filters`` with the key's binding forced in; ``PermissionDeniedError`` when a given
    filter names a company, agent or user outside the binding."""
    out = dict(filters)
    if unrestricted(key):
        return out
    assert key is not None
    for name in BOUND:
        bound = key.get(name)
        if bound is None:
            continue
        given = out.get(name)
        if given is not None and given != bound:
            raise PermissionDeniedError(
                f"this API key is bound to {name} {bound!r}; it may not list {name} {given!r}"
            )
        if name == "company_id" and key.get("user_id") is not None and given is None:
            continue  # its user's notes without a company too (in_binding decides)
        out[name] = bound
    return out


def _get(item: Any, name: str) -> Any:
    value = item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)
    return None if isinstance(value, float) and value != value else value  # NaN: a null cell


def _scopes(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {"": value}  # unreadable: matches no key's scopes
    return dict(value) if isinstance(value, Mapping) else {"": value}


def in_binding(key: Mapping[str, Any] | None, note: Any) -> bool:
    """Whether ``note`` (a ``Note`` or a row mapping) lies inside the key's binding."""
    if unrestricted(key):
        return True
    assert key is not None
    own_companyless = (
        key.get("user_id") is not None
        and _get(note, "user_id") == key.get("user_id")
        and _get(note, "company_id") is None
    )
    for name in BOUND:
        bound = key.get(name)
        if name == "company_id" and own_companyless:
            continue  # the key's own user's note, stored without a company
        if bound is not None and _get(note, name) != bound:
            return False
    if key.get("company_id") is None:  # a non-admin key always has one; refuse otherwise
        return False
    record = _get(note, "primary_scope_record_id")
    if record is not None and record != key.get("primary_scope_record_id"):
        return False
    allowed = key.get("secondary_scopes") or {}
    for dim, value in _scopes(_get(note, "secondary_scopes")).items():
        if value is None:
            continue
        if dim not in allowed or str(allowed[dim]) != str(value):
            return False
    return True


#: The columns :func:`in_binding` reads beyond the forced filters.
BINDING_COLUMNS = (
    "company_id",
    "agent_id",
    "user_id",
    "primary_scope_record_id",
    "secondary_scopes",
)
