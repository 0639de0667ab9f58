"""The SQL schema's history under Alembic: one revision per change of the schema.

``create_schema`` (:mod:`memory_pipelines.sources.tables`) brings a database to
:data:`SCHEMA_HEAD` when a service opens it: a fresh database gets today's tables and is
stamped at the head without Alembic; one stamped at the head is left as it is; any other
(an older revision, or a home from before these revisions, which is taken as the
baseline) is upgraded here, revision by revision. ``memory-pipelines db upgrade`` and
``db current`` do the same from the command line. Alembic is imported only here, and only
when a revision runs.

Each revision after the baseline checks the shape it changes first (a home may have been
migrated by hand before the revisions existed), so it is a no-op where its change is there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memory_pipelines.errors import SourceError

#: the revision of today's schema (``versions/``'s head; a test checks they agree)
SCHEMA_HEAD = "0003_api_key_roles"
#: the first revision: the schema of a home from before the revisions
BASELINE = "0001_baseline"
#: Alembic's table of the stored revision
VERSION_TABLE = "alembic_version"


def _config(conn: Any) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    config.attributes["connection"] = conn
    return config


def upgrade(conn: Any, revision: str = "head") -> None:
    """Upgrade the database of ``conn`` (in the caller's transaction) to ``revision``; a
    database with no stored revision is stamped at the baseline first."""
    from alembic import command

    stored = stored_revision(conn)
    if stored is not None and stored not in {r for r, _ in history()}:
        raise SourceError(
            f"the SQL database is at schema revision {stored!r}, which this version of"
            " memory-pipelines does not know (a newer version wrote it): upgrade the package"
        )
    config = _config(conn)
    if stored is None:
        command.stamp(config, BASELINE)
    command.upgrade(config, revision)


def stored_revision(conn: Any) -> str | None:
    """The revision stored in the database, or None (no revision table, or no row)."""
    from sqlalchemy import inspect, text

    if VERSION_TABLE not in inspect(conn).get_table_names():
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def head_revision() -> str:
    """The head of the revision scripts, as Alembic reads them."""
    from alembic.script import ScriptDirectory

    config = _config(None)
    return ScriptDirectory.from_config(config).get_current_head()


def history() -> list[tuple[str, str]]:
    """Every revision, oldest first: (revision id, its one-line description)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_config(None))
    return [(r.revision, r.doc) for r in reversed(list(script.walk_revisions()))]
