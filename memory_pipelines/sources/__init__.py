"""SQL source data and the audit store, through SQLAlchemy 2: every query a named method.

Agents, users, companies, conversations, messages and agent runs are the data the
Memory Manager mines; ``run_steps`` is the append-only audit table every write and every
phase records to; ``write_ledger`` holds within-run write state keyed by (agent, run id);
``injection_events`` records which notes and examples were injected for which run;
``note_events`` holds the lifecycle events of notes; ``manager_state`` holds cursors; ``manager_leases`` says who runs the Memory Manager; ``api_keys`` holds the HTTP API keys (hashed). SQLite in
the home folder by default (WAL, busy timeout), any SQLAlchemy URL otherwise.

``Sources`` is one object composed of query groups, one module each: people,
conversations, audit, events, manager, erasure, keys; the schema lives in ``tables``.
"""

from __future__ import annotations

from memory_pipelines.sources.audit import AuditQueries
from memory_pipelines.sources.base import SourcesBase
from memory_pipelines.sources.conversations import ConversationQueries
from memory_pipelines.sources.erasure import ErasureQueries, UserFootprint
from memory_pipelines.sources.event_log import EventQueries
from memory_pipelines.sources.keys import KeyQueries
from memory_pipelines.sources.leases import LeaseQueries
from memory_pipelines.sources.manager_state import ManagerQueries
from memory_pipelines.sources.people import PeopleQueries
from memory_pipelines.sources.tables import (
    AGENT_FIELDS,
    PURGED_USER,
    UTCDateTime,
    agent_runs,
    agents,
    api_keys,
    companies,
    conversations,
    create_schema,
    deleted_entities,
    injection_events,
    jsonable,
    ledger_agent,
    manager_leases,
    manager_runs,
    manager_state,
    messages,
    metadata,
    note_events,
    run_steps,
    sqlite_pragmas,
    users,
    write_ledger,
)


class Sources(
    PeopleQueries,
    ConversationQueries,
    AuditQueries,
    ManagerQueries,
    ErasureQueries,
    EventQueries,
    KeyQueries,
    LeaseQueries,
    SourcesBase,
):
    """The SQL side of a memory home: source data, audit and cursors."""


__all__ = [
    "AGENT_FIELDS",
    "PURGED_USER",
    "Sources",
    "UTCDateTime",
    "UserFootprint",
    "agent_runs",
    "agents",
    "api_keys",
    "companies",
    "conversations",
    "create_schema",
    "deleted_entities",
    "injection_events",
    "jsonable",
    "ledger_agent",
    "manager_leases",
    "manager_runs",
    "manager_state",
    "messages",
    "metadata",
    "note_events",
    "run_steps",
    "sqlite_pragmas",
    "users",
    "write_ledger",
]
