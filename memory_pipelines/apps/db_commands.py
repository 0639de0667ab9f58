"""``memory-pipelines db current|upgrade [--home H]``: the schema revision of a home's SQL
database (SQLite in the home, or ``MEMORY_SQL_URL``), and its upgrade to today's schema
(the same upgrade a service runs when it opens the home; see
:mod:`memory_pipelines.sources.migrations`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from memory_pipelines.apps.terminal import printable

HOME_HELP = "memory home (default: $MEMORY_HOME or ./.memory)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines db",
        description="The schema of a home's SQL database (the home's SQLite file, or "
        "MEMORY_SQL_URL): 'current' prints its revision and the head (exit 0 at the head, "
        "1 behind it); 'upgrade' brings it to the head, as opening the home does.",
        allow_abbrev=False,
    )
    parser.add_argument("action", choices=["current", "upgrade"])
    parser.add_argument("--home", default=None, help=HOME_HELP)
    return parser


def _stored_revision(url: str) -> str | None:
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    from memory_pipelines.errors import SourceError
    from memory_pipelines.sources import migrations

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return migrations.stored_revision(conn)
    except SQLAlchemyError as e:
        raise SourceError(f"cannot read the SQL database: {e}") from e
    finally:
        engine.dispose()


def db_command(argv: list[str]) -> int:
    """Print (``current``) or upgrade (``upgrade``) the schema revision of a home."""
    args = _parser().parse_args(argv)
    from memory_pipelines.home import display_url, existing_home
    from memory_pipelines.sources import migrations
    from memory_pipelines.sources.base import SourcesBase

    home = existing_home(args.home)
    url = os.environ.get("MEMORY_SQL_URL") or f"sqlite:///{(home / 'memory.sqlite3').resolve()}"
    stored = _stored_revision(url)
    head = migrations.SCHEMA_HEAD
    shown = stored or "no revision (a home from before the schema revisions)"
    if args.action == "current":
        if stored == head:
            print(printable(f"{display_url(url)}: {head} (head)"))
            return 0
        print(printable(f"{display_url(url)}: {shown}; head: {head} (memory-pipelines db upgrade)"))
        return 1
    SourcesBase(url, clock=None).engine.dispose()  # opens it as a service does: the upgrade
    now = _stored_revision(url)
    print(printable(f"{display_url(url)}: was at {shown}; now at {now}"))
    return 0 if now == head else 1


#: subcommand -> (its function, one-line help)
COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "db": (db_command, "print (current) or upgrade (upgrade) the SQL schema revision of a home"),
}


__all__ = ["COMMANDS", "db_command"]
