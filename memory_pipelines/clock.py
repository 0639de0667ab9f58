"""The service clock: every time-dependent rule reads aware UTC time from one of these.

:class:`FakeClock` is the clock tests and benchmarks move by hand."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from memory_pipelines.errors import ConfigError


def utc_now() -> datetime:
    """The default service clock: the current aware UTC time."""
    return datetime.now(UTC)


class AwareClock:
    """Wraps a clock callable (tests move theirs) and refuses naive datetimes.

    ``AwareClock(clock)()`` returns the clock's time converted to UTC; a clock that returns
    a naive datetime (at construction or any later call) is a ``ConfigError``."""

    def __init__(self, clock: Callable[[], datetime] | None = None):
        self._clock = clock or utc_now
        probe = self._clock()
        if probe.tzinfo is None or probe.utcoffset() is None:
            raise ConfigError("clock must return timezone-aware UTC datetimes")

    def __call__(self) -> datetime:
        value = self._clock()
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigError("clock returned a naive datetime; it must be timezone-aware UTC")
        return value.astimezone(UTC)


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
