"""The SQL schema under Alembic (memory_pipelines.sources.migrations): a fresh database is
stamped at the head, a home from before the revisions (built here with the old DDL) is
upgraded at open and keeps its rows, and ``memory-pipelines db current|upgrade`` say and do
the same. On PostgreSQL when ``MEMORY_TEST_POSTGRES_URL`` is set (see test_postgres.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, inspect, select, text

from memory_pipelines.sources import api_keys, metadata, migrations, write_ledger
from memory_pipelines.sources.tables import create_schema

PG_URL = os.environ.get("MEMORY_TEST_POSTGRES_URL", "")

#: the two tables as they were before the hand migrations (now revisions 0002 and 0003)
OLD_WRITE_LEDGER = """
CREATE TABLE write_ledger (
    run_id VARCHAR(200) NOT NULL, key TEXT NOT NULL, note_id VARCHAR(200) NOT NULL,
    scope_key TEXT NOT NULL, disposition VARCHAR(30) NOT NULL,
    created_at TIMESTAMP NOT NULL, PRIMARY KEY (run_id, key))
"""
OLD_API_KEYS = """
CREATE TABLE api_keys (
    key_id VARCHAR(40) NOT NULL PRIMARY KEY, secret_hash VARCHAR(100) NOT NULL,
    company_id VARCHAR(200), agent_id VARCHAR(200), user_id VARCHAR(200),
    admin BOOLEAN NOT NULL, primary_scope_entity_id VARCHAR(200),
    primary_scope_record_id VARCHAR(200), secondary_scopes JSON,
    created_at TIMESTAMP NOT NULL, revoked_at TIMESTAMP)
"""
OLD_ROWS = [
    "INSERT INTO write_ledger VALUES ('r1', 'agent-a|u1|c1|k1', 'n1', 'agent-a|u1|c1',"
    " 'written', '2026-01-01 00:00:00')",
    "INSERT INTO write_ledger VALUES ('r1', '#slot:1', 'n1', 'agent-b|u1|c1', 'cap-slot',"
    " '2026-01-01 00:00:00')",
    "INSERT INTO api_keys VALUES ('k-admin', 'h1', NULL, NULL, NULL, TRUE, NULL, NULL, NULL,"
    " '2026-01-01 00:00:00', NULL)",
    "INSERT INTO api_keys VALUES ('k-agent', 'h2', 'acme', 'agent-a', NULL, FALSE, NULL, NULL,"
    " NULL, '2026-01-01 00:00:00', NULL)",
    "INSERT INTO api_keys VALUES ('k-analyst', 'h3', 'acme', NULL, NULL, FALSE, NULL, NULL,"
    " NULL, '2026-01-01 00:00:00', NULL)",
]


def _old_home(engine) -> None:
    """A database as a release before the schema revisions left it: every other table at
    today's shape, the two migrated tables at their old one, no revision table."""
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {migrations.VERSION_TABLE}"))
        metadata.drop_all(conn)
        others = [t for t in metadata.sorted_tables if t.name not in {"write_ledger", "api_keys"}]
        metadata.create_all(conn, tables=others)
        conn.execute(text(OLD_WRITE_LEDGER))
        conn.execute(text(OLD_API_KEYS))
        for row in OLD_ROWS:
            conn.execute(text(row))


def _revision(engine) -> str | None:
    with engine.connect() as conn:
        return migrations.stored_revision(conn)


def _assert_upgraded_with_rows(engine) -> None:
    assert _revision(engine) == migrations.SCHEMA_HEAD
    columns = {c["name"] for c in inspect(engine).get_columns("write_ledger")}
    assert "agent_id" in columns
    with engine.connect() as conn:
        ledger = {(r.key, r.agent_id) for r in conn.execute(select(write_ledger))}
        roles = {r.key_id: r.role for r in conn.execute(select(api_keys))}
    assert ledger == {("agent-a|u1|c1|k1", "agent-a"), ("#slot:1", "agent-b")}
    assert roles == {"k-admin": "admin", "k-agent": "agent", "k-analyst": "analyst"}


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request, tmp_path):
    if request.param == "postgresql":
        if not PG_URL:
            pytest.skip("MEMORY_TEST_POSTGRES_URL is not set (see scripts/start_postgres.sh)")
        url = PG_URL
    else:
        url = f"sqlite:///{tmp_path / 'memory.sqlite3'}"
    engine = create_engine(url)
    yield engine
    if request.param == "postgresql":
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {migrations.VERSION_TABLE}"))
            metadata.drop_all(conn)
    engine.dispose()


def test_the_head_constant_is_the_head_of_the_revision_scripts():
    assert migrations.head_revision() == migrations.SCHEMA_HEAD
    assert [r for r, _ in migrations.history()] == [
        migrations.BASELINE, "0002_write_ledger_agent", migrations.SCHEMA_HEAD,
    ]


def test_an_old_home_is_upgraded_at_open_and_keeps_its_rows(engine):
    _old_home(engine)
    assert _revision(engine) is None
    create_schema(engine)
    _assert_upgraded_with_rows(engine)
    create_schema(engine)  # opening it again is a no-op
    _assert_upgraded_with_rows(engine)


def test_a_home_at_an_older_revision_takes_only_the_revisions_after_it(engine):
    _old_home(engine)
    with engine.begin() as conn:  # the ledger migrated and stamped, the keys not yet
        conn.execute(text("DROP TABLE write_ledger"))
        write_ledger.create(conn)
        conn.execute(text(f"CREATE TABLE {migrations.VERSION_TABLE} (version_num VARCHAR(32) PRIMARY KEY)"))
        conn.execute(text(f"INSERT INTO {migrations.VERSION_TABLE} VALUES ('0002_write_ledger_agent')"))
    create_schema(engine)
    assert _revision(engine) == migrations.SCHEMA_HEAD
    with engine.connect() as conn:
        assert {r.key_id: r.role for r in conn.execute(select(api_keys))}["k-agent"] == "agent"


def test_a_fresh_database_is_stamped_at_the_head_with_every_table(engine):
    create_schema(engine)
    assert _revision(engine) == migrations.SCHEMA_HEAD
    assert set(metadata.tables) <= set(inspect(engine).get_table_names())


def test_opening_a_fresh_or_current_home_does_not_import_alembic(tmp_path):
    code = (
        "import sys\n"
        "from sqlalchemy import create_engine\n"
        "from memory_pipelines.sources.tables import create_schema\n"
        f"e = create_engine('sqlite:///{tmp_path / 'm.db'}')\n"
        "create_schema(e); create_schema(e)\n"
        "print('alembic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_db_current_and_db_upgrade_on_an_old_home(tmp_path, capsys):
    from memory_pipelines.apps.cli import main

    home = tmp_path / "home"
    home.mkdir()
    engine = create_engine(f"sqlite:///{home / 'memory.sqlite3'}")
    _old_home(engine)
    assert main(["db", "current", "--home", str(home)]) == 1
    out = capsys.readouterr().out
    assert "no revision" in out and migrations.SCHEMA_HEAD in out
    assert main(["db", "upgrade", "--home", str(home)]) == 0
    assert f"now at {migrations.SCHEMA_HEAD}" in capsys.readouterr().out
    _assert_upgraded_with_rows(engine)
    assert main(["db", "current", "--home", str(home)]) == 0
    assert f"{migrations.SCHEMA_HEAD} (head)" in capsys.readouterr().out
    engine.dispose()


def test_db_commands_refuse_a_home_that_does_not_exist(tmp_path, capsys):
    from memory_pipelines.apps.cli import main

    assert main(["db", "upgrade", "--home", str(tmp_path / "typo")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # no abbreviation, no unknown action
        main(["db", "upgrad", "--home", str(tmp_path)])
    assert exit_.value.code == 2
    assert not (tmp_path / "typo").exists()


def test_a_database_from_a_newer_version_is_refused_with_a_source_error(engine):
    from memory_pipelines.errors import SourceError

    create_schema(engine)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {migrations.VERSION_TABLE} SET version_num = '0099_future'"))
    with pytest.raises(SourceError, match="0099_future.*newer version"):
        create_schema(engine)
