"""Input limits and checks at the boundary: text that cannot be stored or sent back,
and input over the size limits, is refused before anything is saved (CONTRACT §2.8).

:class:`Limits` holds every size bound (README "Limits"); ids are bounded and printable
(:func:`check_id`); retrieval reads the end of a long input (:func:`retrieval_text`);
audit rows and echoes of rejected text keep a prefix and a hash (:func:`clipped`).

Text that cannot be encoded as UTF-8 (a lone surrogate such as ``"\\ud800"``, which a
JSON ``"\\ud800"`` escape decodes to) is rejected with a message naming the field:
``rejected-type`` for a write item, :class:`~memory_pipelines.errors.ValidationError`
(HTTP 422) everywhere else.
"""

from __future__ import annotations

import hashlib
import os
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from memory_pipelines.errors import ConfigError, ValidationError

#: ``limit`` of one page of a note listing: 1..MAX_PAGE_LIMIT, DEFAULT_PAGE_LIMIT when not
#: given (here, not in admin.notes, so the CLI's parsers need no storage import)
DEFAULT_PAGE_LIMIT = 50
MAX_PAGE_LIMIT = 500

@dataclass(frozen=True)
class Limits:
    """Every bound on input size in one place (README "Limits").

    Each default can be overridden by the environment variable ``MEMORY_`` + the field
    name in upper case (``MEMORY_MAX_INJECTED_ITEMS=50``), read when the value is used.
    """

    #: largest HTTP request body in bytes (a bigger one is answered 413)
    max_body_bytes: int = 1 << 20
    #: most write items in one write request (``writes``; more is a ValidationError / 422)
    max_writes_per_request: int = 100
    #: longest note, in characters after trimming (a longer write is ``rejected-type``)
    max_note_chars: int = 2000
    #: retrieval reads only the last this many characters of ``current_input``/``topic``
    max_retrieval_chars: int = 4000
    #: note extraction (the Memory Manager's and ``remember``'s) reads only the last this
    #: many characters of each conversation message and of each rating comment; the
    #: message is stored whole
    max_judged_message_chars: int = 16_000
    #: longest id (agent, user, company, run, conversation ...); the SQL columns hold 200
    max_id_chars: int = 200
    #: characters of a rejected text kept in the audit row and the echo (plus its sha256)
    audit_text_prefix: int = 200
    #: most notes (or examples) an agent may inject, and most notes ``explain`` shows
    max_injected_items: int = 100
    #: most a reranker may over-fetch (``reranker_config.retrievalMultiplier``)
    max_retrieval_multiplier: int = 10
    #: longest record an import reads, in bytes: a ``.jsonl`` line or a ``.parquet``
    #: payload (an export's records are a note or example with its vector, kilobytes)
    max_import_record_bytes: int = 8 << 20
    #: largest ``.parquet`` row group an import reads at once (uncompressed bytes)
    max_import_row_group_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"limit {f.name} must be a positive integer, got {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The defaults, overridden by ``MEMORY_<FIELD>`` variables of ``environ``."""
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for f in fields(cls):
            raw = env.get(f"MEMORY_{f.name.upper()}")
            if raw is None or not raw.strip():
                continue
            try:
                values[f.name] = int(raw)
            except ValueError as e:
                raise ConfigError(f"MEMORY_{f.name.upper()} must be an integer, got {raw!r}") from e
        return cls(**values)


_ENV_NAMES = tuple(f"MEMORY_{f.name.upper()}" for f in fields(Limits))
_BY_ENV: dict[tuple[Any, ...], Limits] = {}
# CPython keeps the environment as an encoded dict behind ``os.environ`` (every change
# through ``os.environ`` lands in it): reading it directly costs a dict lookup per name
_RAW: Any = getattr(os.environ, "_data", None)
if isinstance(_RAW, dict) and all(isinstance(k, bytes) for k in list(_RAW)[:1]):
    _ENV_KEYS: tuple[Any, ...] = tuple(os.fsencode(n) for n in _ENV_NAMES)
    _lookup = _RAW.get
else:
    _ENV_KEYS, _lookup = _ENV_NAMES, os.environ.get


def limits() -> Limits:
    """The limits in force (defaults overridden by the environment, read on every call;
    the parsed limits are kept per set of values, so a changed variable applies at once)."""
    key = tuple(map(_lookup, _ENV_KEYS))
    found = _BY_ENV.get(key)
    if found is None:
        found = Limits.from_env()
        if len(_BY_ENV) < 64:
            _BY_ENV[key] = found
    return found


def check_id(field: str, value: Any) -> None:
    """``ValidationError`` naming the field for an id that is not text, is longer than
    ``max_id_chars``, or holds a control character (None is allowed: no id)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise ValidationError(f"{field} must be a string, got {type(value).__name__}")
    check_text(field, value)
    bound = limits().max_id_chars
    if len(value) > bound:
        raise ValidationError(f"{field} is longer than {bound} characters ({len(value)})")
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in value):
        raise ValidationError(f"{field} must not contain control characters or line breaks")


def check_ids(fields: Mapping[str, Any]) -> None:
    """:func:`check_id` on each named value."""
    for name, value in fields.items():
        check_id(name, value)


def retrieval_text(text: str | None) -> str | None:
    """The part of ``text`` retrieval reads: its last ``max_retrieval_chars`` characters
    (the end of a long input is the part the run is about); not an error."""
    if not isinstance(text, str):
        return text
    bound = limits().max_retrieval_chars
    return text if len(text) <= bound else text[-bound:]


def clipped(text: str, prefix: int | None = None) -> str:
    """A long text as audit rows and echoes keep it: its first ``audit_text_prefix``
    characters, then its length and sha256 (of the UTF-8 bytes, surrogates passed)."""
    keep = limits().audit_text_prefix if prefix is None else prefix
    if len(text) <= keep:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{text[:keep]}… [{len(text)} characters, sha256 {digest}]"


def clip_texts(value: Any, prefix: int | None = None) -> Any:
    """``value`` with every long text :func:`clipped`; the same object when none is."""
    if isinstance(value, str):
        return clipped(value, prefix)
    if isinstance(value, Mapping):
        pairs = [(k, v, clip_texts(v, prefix)) for k, v in value.items()]
        if all(v is v2 for _, v, v2 in pairs):
            return value
        return {k: v2 for k, _, v2 in pairs}
    if isinstance(value, (list, tuple)):
        items = [clip_texts(v, prefix) for v in value]
        if all(a is b for a, b in zip(value, items, strict=True)):
            return value
        return items
    return value


def check_count(field: str, value: Any, maximum: int, minimum: int = 0) -> int:
    """``value`` when it is an integer (not a bool) in ``[minimum, maximum]``, else a
    ``ValidationError`` naming the field."""
    if type(value) is not int or not minimum <= value <= maximum:
        raise ValidationError(
            f"{field} must be an integer between {minimum} and {maximum}, got {shown(value)}"
        )
    return value


def shown(value: Any, limit: int = 80) -> str:
    """A short ``repr`` of ``value`` for an error message (huge numbers and texts cut)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value[: limit + 1] if isinstance(value, (str, bytes)) else value)
    return text if len(text) <= limit else text[:limit] + "…"


def _bad_utf8(text: str) -> int | None:
    """The index of the first character UTF-8 cannot encode, or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def unencodable_field(value: Any, field: str) -> str | None:
    """The path (``field``, ``field.key``, ``field[2]``) of the first text in ``value``
    (a string, or a mapping/list of them, keys included) that is not valid UTF-8."""
    if isinstance(value, str):
        return field if _bad_utf8(value) is not None else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and _bad_utf8(key) is not None:
                return f"{field} (a key)"
            found = unencodable_field(item, f"{field}.{key}" if isinstance(key, str) else field)
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = unencodable_field(item, f"{field}[{i}]")
            if found:
                return found
    return None


def utf8_message(field: str) -> str:
    """The message for text that cannot be encoded as UTF-8, naming the field."""
    return f"{field} contains text that cannot be encoded as UTF-8 (a lone surrogate)"


def check_text(field: str, value: Any) -> None:
    """``ValidationError`` naming the field when ``value`` holds text that is not UTF-8."""
    found = unencodable_field(value, field)
    if found:
        raise ValidationError(utf8_message(found))


def check_fields(fields: Mapping[str, Any]) -> None:
    """:func:`check_text` on each named value."""
    for name, value in fields.items():
        check_text(name, value)


def printable(value: Any) -> Any:
    """``value`` with every text made UTF-8-safe (unencodable characters become U+FFFD),
    for echoes and audit rows; the same object when nothing needed changing."""
    if isinstance(value, str):
        if _bad_utf8(value) is None:
            return value
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    if isinstance(value, Mapping):
        pairs = [(k, v, printable(k), printable(v)) for k, v in value.items()]
        if all(k is k2 and v is v2 for k, v, k2, v2 in pairs):
            return value
        return {k2: v2 for _, _, k2, v2 in pairs}
    if isinstance(value, (list, tuple)):
        items = [printable(v) for v in value]
        if all(a is b for a, b in zip(value, items, strict=True)):
            return value
        return items
    return value
