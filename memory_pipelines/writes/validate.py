"""The type guard: a write request's raw fields and its valid form, or why it is rejected."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memory_pipelines.config import WriteConfig
from memory_pipelines.judge import reads_as_instruction
from memory_pipelines.limits import clipped, unencodable_field
from memory_pipelines.writes.models import (
    ALLOWED_SCOPE_HINTS,
    ALLOWED_TYPES,
    REASON_EMPTY,
    REASON_INSTRUCTION,
    MemoryWrite,
    length_reason,
    type_reason,
)

MISSING = object()


@dataclass(frozen=True)
class RequestFields:
    """The raw fields of a request (``note`` is ``MISSING`` when absent)."""

    shape_ok: bool
    note: Any
    type: Any
    scope_hint: Any

    def audit(self) -> dict[str, Any]:
        note = None if self.note is MISSING else self.note
        return {"note": note, "type": self.type, "scopeHint": self.scope_hint}


@dataclass(frozen=True)
class ValidRequest:
    text: str  # trimmed
    type: str
    scope_hint: str | None


def request_fields(request: Any) -> RequestFields:
    if isinstance(request, MemoryWrite):
        return RequestFields(True, request.note, request.type, request.scope_hint)
    if isinstance(request, Mapping):
        hint = request.get("scopeHint", request.get("scope_hint"))
        return RequestFields(
            True, request.get("note", MISSING), request.get("type", "Preference"), hint
        )
    return RequestFields(False, MISSING, None, None)


def validate_request(
    request: Any, fields: RequestFields, config: WriteConfig
) -> ValidRequest | str:
    """The request's valid form, or the reason it is rejected."""
    if not fields.shape_ok:
        return (
            "Memory write request must be an object with a 'note' string,"
            f" got {type(request).__name__}."
        )
    for name, value in (
        ("note", fields.note),
        ("type", fields.type),
        ("scopeHint", fields.scope_hint),
    ):
        if isinstance(value, str) and unencodable_field(value, name):
            return (
                f"Memory write field '{name}' contains text that cannot be encoded as UTF-8"
                " (a lone surrogate); nothing was saved."
            )
    if fields.note is MISSING:
        return "Memory write request has no 'note' field."
    if not isinstance(fields.note, str):
        return f"Memory note must be a string, got {type(fields.note).__name__}."
    if not isinstance(fields.type, str) or fields.type not in ALLOWED_TYPES:
        return type_reason(fields.type)
    if fields.scope_hint is not None and fields.scope_hint not in ALLOWED_SCOPE_HINTS:
        return (
            f"Memory scopeHint \"{clipped(str(fields.scope_hint))}\" is not allowed — only 'user' or"
            " 'agent' (or leave it out)."
        )
    text = fields.note.strip()
    if not text:
        return REASON_EMPTY
    if len(text) > config.max_note_length:
        return length_reason(config.max_note_length, len(text))
    if reads_as_instruction(text):
        return REASON_INSTRUCTION
    return ValidRequest(text=text, type=fields.type, scope_hint=fields.scope_hint)
