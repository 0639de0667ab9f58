"""Retry policies: one named policy per kind of transient failure, run by ``tenacity``.

Each policy says which errors it retries (a commit conflict, a race with a concurrent
creator or compactor, a locked SQLite file; never any other error), how many attempts or
seconds it allows and how long it waits between them. The first attempt runs directly,
so a call that succeeds at once costs nothing and ``tenacity`` is imported only when a
retry is needed (it stays out of start-up); the later attempts run under ``tenacity``
with the same attempt numbering, so the waits are those the policy names.

A policy re-raises the last error unchanged once it gives up, and at once an error it does
not retry: the caller turns it into its own :class:`~memory_pipelines.errors.MemoryPipelineError`
(``StoreError``, ``SourceError``, ...), as it does for a first failure.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

T = TypeVar("T")

#: a callable told the attempt that failed, the error and the wait before the next one
BeforeSleep = Callable[[int, BaseException, float], None]


def _message_has(*words: str) -> Callable[[BaseException], bool]:
    def check(exc: BaseException) -> bool:
        text = str(exc).lower()
        return any(w in text for w in words)

    return check


def _instance_of(module: str, name: str) -> Callable[[BaseException], bool]:
    """True for an instance of ``module.name``; the module is not imported here (an error
    of that class means its module is loaded)."""

    def check(exc: BaseException) -> bool:
        loaded = sys.modules.get(module)
        return loaded is not None and isinstance(exc, getattr(loaded, name))

    return check


def _store_conflict(exc: BaseException) -> bool:
    # LanceDB raises plain exceptions on commit conflicts, naming the conflict in the text
    return _message_has("conflict", "commit", "retry")(exc)


def _sql_error(exc: BaseException) -> bool:
    return _instance_of("sqlalchemy.exc", "SQLAlchemyError")(exc)


def _sqlite_locked(exc: BaseException) -> bool:
    return _instance_of("sqlite3", "OperationalError")(exc) and "locked" in str(exc).lower()


def _compaction_conflict(exc: BaseException) -> bool:
    from_store = _instance_of("memory_pipelines.errors", "StoreError")(exc)
    return from_store and _message_has("conflict", "retry")(exc)


@dataclass(frozen=True)
class RetryPolicy:
    """A named retry policy: which errors are retried (``retry_if``), for how many
    ``attempts`` (or ``seconds``), waiting ``first_wait`` after the first failure, then a
    wait that doubles (``growth="double"``, at most ``max_wait``) or grows by ``first_wait``
    each time (``growth="linear"``)."""

    name: str
    retry_if: Callable[[BaseException], bool]
    first_wait: float
    growth: Literal["double", "linear"]
    attempts: int | None = None
    seconds: float | None = None
    max_wait: float | None = None

    def with_seconds(self, seconds: float) -> RetryPolicy:
        """This policy, giving up after ``seconds`` rather than its own limit."""
        return replace(self, seconds=seconds, attempts=None)

    def call(
        self, fn: Callable[..., T], /, *args: Any, before_sleep: BeforeSleep | None = None,
        sleep: Callable[[float], None] | None = None, **kwargs: Any,
    ) -> T:
        """``fn(*args, **kwargs)``, again while it raises an error this policy retries;
        ``before_sleep`` is told each retry, ``sleep`` replaces ``time.sleep``."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not self.retry_if(e) or self.attempts == 1:
                raise
            first: list[BaseException] = [e]

        def attempt() -> T:
            if first:  # the failure above is attempt 1 of the tenacity loop
                raise first.pop()
            return fn(*args, **kwargs)

        return self._retrying(before_sleep, sleep)(attempt)

    def _retrying(
        self, before_sleep: BeforeSleep | None, sleep: Callable[[float], None] | None
    ) -> Any:
        import tenacity

        stops = []
        if self.attempts is not None:
            stops.append(tenacity.stop_after_attempt(self.attempts))
        if self.seconds is not None:
            stops.append(tenacity.stop_after_delay(self.seconds))
        if self.growth == "double":
            wait = tenacity.wait_exponential(
                multiplier=self.first_wait, min=self.first_wait, max=self.max_wait or float("inf"),
            )
        else:
            wait = tenacity.wait_incrementing(
                start=self.first_wait, increment=self.first_wait,
                max=self.max_wait or float("inf"),
            )

        def hook(state: tenacity.RetryCallState) -> None:
            if before_sleep is not None:
                exc = state.outcome.exception() if state.outcome else None
                sleep = state.next_action.sleep if state.next_action else 0.0
                before_sleep(state.attempt_number, exc, sleep)

        return tenacity.Retrying(
            stop=tenacity.stop_any(*stops),
            wait=wait,
            retry=tenacity.retry_if_exception(self.retry_if),
            before_sleep=hook,
            reraise=True,
            **({} if sleep is None else {"sleep": sleep}),
        )


#: a LanceDB write (append, merge, delete, index build) that meets a concurrent commit
STORE_COMMIT_CONFLICT = RetryPolicy(
    "store commit conflict", _store_conflict, first_wait=0.02, growth="double", attempts=8,
)
#: a version listing that meets a compaction deleting an old manifest ("Not found")
STORE_VERSION_LISTING_RACE = RetryPolicy(
    "store version listing race", _message_has("not found"), first_wait=0.01, growth="linear",
    attempts=8,
)
#: a background compaction whose rewrite a concurrent commit made Lance reject
COMPACTION_CONFLICT = RetryPolicy(
    "compaction conflict", _compaction_conflict, first_wait=0.05, growth="linear", attempts=3,
)
#: creating the SQL schema while another process creates it ("table already exists")
SQL_SCHEMA_RACE = RetryPolicy(
    "SQL schema race", _sql_error, first_wait=0.05, growth="linear", attempts=10,
)
#: a SQLite file that another connection is switching to WAL ("database is locked")
SQLITE_LOCKED = RetryPolicy(
    "SQLite locked", _sqlite_locked, first_wait=0.005, growth="double", seconds=30.0,
    max_wait=0.2,
)

#: every policy, by name
POLICIES = {
    p.name: p
    for p in (
        STORE_COMMIT_CONFLICT, STORE_VERSION_LISTING_RACE, COMPACTION_CONFLICT, SQL_SCHEMA_RACE,
        SQLITE_LOCKED,
    )
}
