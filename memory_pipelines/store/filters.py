"""Filters for LanceDB queries: every value rendered through LanceDB's literal encoder, so
an id holding quotes, ``OR 1=1`` or comment markers matches nothing and widens nothing."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lancedb.expr import lit

from memory_pipelines.errors import ValidationError
from memory_pipelines.notes import INJECTABLE_STATUSES

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Cond:
    """A rendered filter. Build it only through the helpers below, never by hand."""

    sql: str

    def __and__(self, other: Cond) -> Cond:
        return and_(self, other)

    def __or__(self, other: Cond) -> Cond:
        return or_(self, other)

    def __invert__(self) -> Cond:
        return Cond(f"NOT ({self.sql})")


_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


TRUE = Cond("TRUE")


FALSE = Cond("FALSE")


def _col(name: str) -> str:
    if not _IDENT.match(name):
        raise ValidationError(f"invalid column name {name!r}")
    return f"`{name}`"


def _lit(value: Any) -> str:
    if hasattr(value, "value") and isinstance(value.value, str):  # StrEnum
        value = value.value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValidationError("filter datetimes must be timezone-aware")
        value = value.astimezone(UTC).replace(tzinfo=None)
        return f"arrow_cast({lit(value).to_sql()}, 'Timestamp(Microsecond, Some(\"UTC\"))')"
    if not isinstance(value, (str, int, float, bool)):
        raise ValidationError(f"unsupported filter value of type {type(value).__name__}")
    if isinstance(value, str):
        # lancedb 0.40's ``lit`` leaves a quote that follows a backslash undoubled
        # (``\' OR 1=1 --`` widened a filter to every row), while Lance's SQL parser
        # treats backslashes literally. Doubling every quote is the exact encoding.
        return "'" + value.replace("'", "''") + "'"
    return lit(value).to_sql()


def eq(column: str, value: Any) -> Cond:
    """``column = value``; ``None`` means ``column IS NULL``."""
    if value is None:
        return is_null(column)
    return Cond(f"{_col(column)} = {_lit(value)}")


def ne(column: str, value: Any) -> Cond:
    if value is None:
        return Cond(f"{_col(column)} IS NOT NULL")
    return Cond(f"({_col(column)} IS NULL OR {_col(column)} <> {_lit(value)})")


def is_null(column: str) -> Cond:
    return Cond(f"{_col(column)} IS NULL")


def not_null(column: str) -> Cond:
    return Cond(f"{_col(column)} IS NOT NULL")


def in_(column: str, values: Iterable[Any]) -> Cond:
    vals = list(values)
    if not vals:
        return FALSE
    return Cond(f"{_col(column)} IN ({', '.join(_lit(v) for v in vals)})")


def cmp(column: str, op: str, value: Any) -> Cond:
    """``column <op> value`` for op in ``< <= > >=``."""
    if op not in ("<", "<=", ">", ">="):
        raise ValidationError(f"invalid comparison operator {op!r}")
    return Cond(f"{_col(column)} {op} {_lit(value)}")


def icontains(column: str, text: str) -> Cond:
    """``column`` contains ``text``, ignoring case; every character of ``text`` is literal
    (``%``, ``_``, quotes and backslashes match themselves: no LIKE pattern)."""
    if not isinstance(text, str):
        raise ValidationError("icontains needs a string")
    return Cond(f"strpos(lower({_col(column)}), {_lit(text.lower())}) > 0")


def and_(*conds: Cond | None) -> Cond:
    parts = [c for c in conds if c is not None and c is not TRUE]
    if not parts:
        return TRUE
    if any(c is FALSE for c in parts):
        return FALSE
    return parts[0] if len(parts) == 1 else Cond(" AND ".join(f"({c.sql})" for c in parts))


def or_(*conds: Cond | None) -> Cond:
    parts = [c for c in conds if c is not None and c is not FALSE]
    if not parts:
        return FALSE
    if any(c is TRUE for c in parts):
        return TRUE
    return parts[0] if len(parts) == 1 else Cond(" OR ".join(f"({c.sql})" for c in parts))


def injectable() -> Cond:
    """Rows whose status is one of ``INJECTABLE_STATUSES``."""
    return in_("status", [s.value for s in INJECTABLE_STATUSES])
