"""Helpers for tests and benchmarks: a movable clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class FakeClock:
    """A service clock that tests move by hand; always aware UTC."""

    def __init__(self, start: datetime | None = None):
        self.current = start or datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.current

    def advance(self, **delta: float) -> datetime:
        self.current = self.current + timedelta(**delta)
        return self.current

    def set(self, when: datetime) -> None:
        self.current = when
