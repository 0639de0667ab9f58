"""The connection every query group shares: engine, transactions, the service clock."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import (
    create_engine,
    event,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError, StatementError

from memory_pipelines.errors import SourceError, ValidationError
from memory_pipelines.sources.tables import (
    create_schema,
    sqlite_pragmas,
)


def chunks(items: Sequence[Any], size: int = 500) -> Iterable[list[Any]]:
    """Slices of ``items`` small enough for one SQL ``IN (...)``."""
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


class SourcesBase:
    """The SQL side of a memory home: source data, audit and cursors."""
    """The SQL side of a memory home: source data, audit and cursors."""

    def __init__(self, url: str, clock: Callable[[], datetime]):
        self.url = url
        self.clock = clock
        try:
            kwargs: dict[str, Any] = {"future": True}
            if url.startswith("sqlite"):
                kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
            else:
                kwargs["pool_pre_ping"] = True
            self.engine: Engine = create_engine(url, **kwargs)
            if url.startswith("sqlite"):
                event.listen(self.engine, "connect", sqlite_pragmas)
            create_schema(self.engine)
        except SQLAlchemyError as e:
            raise SourceError(f"cannot open the SQL database {url!r}: {e}") from e

    @contextmanager
    def begin(self):
        try:
            with self.engine.begin() as conn:
                yield conn
        except (IntegrityError, ValidationError):
            raise
        except StatementError as e:
            if isinstance(e.orig, ValidationError):  # raised by a bind processor (naive datetime)
                raise ValidationError(str(e.orig)) from e
            raise SourceError(f"SQL database error: {e}") from e
        except SQLAlchemyError as e:
            raise SourceError(f"SQL database error: {e}") from e

    def close(self) -> None:
        self.engine.dispose()
