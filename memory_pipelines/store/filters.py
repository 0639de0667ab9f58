"""Filters for LanceDB queries: every value rendered through LanceDB's literal encoder, so
an id holding quotes, ``OR 1=1`` or comment markers matches nothing and widens nothing.

Each helper also builds the filter's row test (:meth:`Cond.matches`): the same condition
evaluated in Python over one row, with SQL's three-valued logic (a comparison with NULL is
unknown, and an unknown row does not match). The read cache uses it to tell whether a row
its own process just wrote belongs to a cached scope without asking the table.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lancedb.expr import lit

from memory_pipelines.errors import ValidationError
from memory_pipelines.notes import INJECTABLE_STATUSES

log = logging.getLogger(__name__)



#: A row test: True, False or None (SQL's unknown) for one row's values by column.
Test = Callable[[Mapping[str, Any]], bool | None]


@dataclass(frozen=True)
class Cond:
    """A rendered filter and its row test. Build it only through the helpers below, never
    by hand."""

    sql: str
    test: Test | None = field(default=None, compare=False, repr=False)

    def __and__(self, other: Cond) -> Cond:
        return and_(self, other)

    def __or__(self, other: Cond) -> Cond:
        return or_(self, other)

    def __invert__(self) -> Cond:
        inner = self.test
        return Cond(
            f"NOT ({self.sql})",
            None if inner is None else lambda row: _not3(inner(row)),
        )

    @property
    def testable(self) -> bool:
        """Whether :meth:`matches` can evaluate this filter."""
        return self.test is not None

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether the table would return ``row`` (its values by column name) for this
        filter. Raises ``LookupError`` for a column the row lacks, ``TypeError`` for values
        that do not compare, and ``ValueError`` for a filter without a row test."""
        if self.test is None:
            raise ValueError(f"filter has no row test: {self.sql}")
        return self.test(row) is True


def _not3(v: bool | None) -> bool | None:
    return None if v is None else not v


def _value(value: Any) -> Any:
    """A filter value as the row test compares it (the value ``_lit`` renders)."""
    if hasattr(value, "value") and isinstance(value.value, str):  # StrEnum
        return value.value
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return value


def _row_value(row: Mapping[str, Any], column: str) -> Any:
    value = row[column]
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _compare(column: str, op: Callable[[Any, Any], bool], value: Any) -> Test:
    want = _value(value)

    def test(row: Mapping[str, Any]) -> bool | None:
        got = _row_value(row, column)
        if isinstance(got, float) and got != got:  # NaN: SQL orders it, Python does not
            raise TypeError(f"NaN in {column}")
        return None if got is None else bool(op(got, want))

    return test


_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


TRUE = Cond("TRUE", lambda row: True)


FALSE = Cond("FALSE", lambda row: False)


def _col(name: str) -> str:
    if not _IDENT.match(name):
        raise ValidationError(f"invalid column name {name!r}")
    return f"`{name}`"


def _lit(value: Any) -> str:
    if isinstance(value, datetime) and value.tzinfo is None:
        raise ValidationError("filter datetimes must be timezone-aware")
    value = _value(value)
    if isinstance(value, datetime):
        value = value.replace(tzinfo=None)
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
    return Cond(f"{_col(column)} = {_lit(value)}", _compare(column, operator.eq, value))


def ne(column: str, value: Any) -> Cond:
    if value is None:
        return not_null(column)
    want = _value(value)
    return Cond(
        f"({_col(column)} IS NULL OR {_col(column)} <> {_lit(value)})",
        lambda row: (got := _row_value(row, column)) is None or got != want,
    )


def is_null(column: str) -> Cond:
    return Cond(f"{_col(column)} IS NULL", lambda row: row[column] is None)


def not_null(column: str) -> Cond:
    return Cond(f"{_col(column)} IS NOT NULL", lambda row: row[column] is not None)


def in_(column: str, values: Iterable[Any]) -> Cond:
    vals = list(values)
    if not vals:
        return FALSE
    rendered = f"{_col(column)} IN ({', '.join(_lit(v) for v in vals)})"
    wanted = [_value(v) for v in vals]
    try:
        members: Any = frozenset(wanted)
    except TypeError:
        members = wanted
    return Cond(rendered, _compare(column, lambda got, _: got in members, None))


def cmp(column: str, op: str, value: Any) -> Cond:
    """``column <op> value`` for op in ``< <= > >=``."""
    if op not in _OPS:
        raise ValidationError(f"invalid comparison operator {op!r}")
    return Cond(f"{_col(column)} {op} {_lit(value)}", _compare(column, _OPS[op], value))


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def icontains(column: str, text: str) -> Cond:
    """``column`` contains ``text``, ignoring case; every character of ``text`` is literal
    (``%``, ``_``, quotes and backslashes match themselves: no LIKE pattern)."""
    if not isinstance(text, str):
        raise ValidationError("icontains needs a string")
    needle = text.lower()
    return Cond(
        f"strpos(lower({_col(column)}), {_lit(needle)}) > 0",
        _compare(column, lambda got, _: needle in got.lower(), None),
    )


def and_(*conds: Cond | None) -> Cond:
    return _junction(conds, "AND", TRUE, FALSE)


def or_(*conds: Cond | None) -> Cond:
    return _junction(conds, "OR", FALSE, TRUE)


def _junction(conds: Iterable[Cond | None], word: str, neutral: Cond, absorbing: Cond) -> Cond:
    """``conds`` joined by ``word`` (None and ``neutral`` left out; ``absorbing`` wins),
    with the row test of SQL's three-valued AND or OR."""
    parts = [c for c in conds if c is not None and c is not neutral]
    if not parts:
        return neutral
    if any(c is absorbing for c in parts):
        return absorbing
    if len(parts) == 1:
        return parts[0]
    tests = [c.test for c in parts]
    decisive = absorbing is TRUE  # OR stops at the first true, AND at the first false
    return Cond(
        f" {word} ".join(f"({c.sql})" for c in parts),
        None if None in tests else lambda row: _fold3((t(row) for t in tests), decisive),  # type: ignore[misc]
    )


def _fold3(values: Iterable[bool | None], decisive: bool) -> bool | None:
    """SQL's AND (``decisive`` False) or OR (True) over three-valued results: the
    decisive value wins, else unknown if any is unknown, else the other value."""
    unknown = False
    for v in values:
        if v is decisive:
            return decisive
        unknown |= v is None
    return None if unknown else not decisive


def injectable() -> Cond:
    """Rows whose status is one of ``INJECTABLE_STATUSES``."""
    return in_("status", [s.value for s in INJECTABLE_STATUSES])


#: a column as :func:`_col` renders it
_COLUMN = re.compile(r"`([a-z_][a-z0-9_]*)`")


def matching_positions(rows: Any, where: Cond) -> list[int]:
    """Positions of the rows of ``rows`` (an Arrow table) that ``where`` matches (its row
    test), the test run once per distinct combination of the columns its SQL names (a
    scope filter names a few columns of a few values each). A name the table lacks (a
    backquoted string value, say) raises ``KeyError``."""
    names = sorted(set(_COLUMN.findall(where.sql)))
    columns = [rows.column(n).to_pylist() if n in rows.column_names else _missing(n) for n in names]
    seen: dict[tuple, bool] = {}
    keep = []
    for k, values in enumerate(zip(*columns, strict=True) if names else ((),) * rows.num_rows):
        try:
            hit = seen.get(values)
        except TypeError:  # a list value: not a key, test the row itself
            hit = where.matches(dict(zip(names, values, strict=True)))
        if hit is None:
            hit = seen[values] = where.matches(dict(zip(names, values, strict=True)))
        if hit:
            keep.append(k)
    return keep


def _missing(name: str) -> list:
    raise KeyError(name)
