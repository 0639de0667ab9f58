"""The run ledger: a run's within-run write state in the ``write_ledger`` table, its keys
and its rows (idempotency and the per-run cap across processes)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.scope.placement import WriteScope
from memory_pipelines.writes.models import Disposition

#: Ledger bookkeeping: one 'cap-slot' row per created note makes the cap hold for two
#: writers of one run. A slot key never contains '|', so it cannot collide with a text key.
SLOT_DISPOSITION = "cap-slot"
SLOT_KEY_PREFIX = "#slot:"


def ledger_key(scope: str, normalised_text: str) -> str:
    """The within-run idempotency key: the scope key, then a digest of the normalised text.

    Equality of keys is equality of (scope, normalised text), as in the reference; the
    digest keeps the key short enough for any SQL primary key (a 2000-character note can
    exceed PostgreSQL's btree row limit).
    """
    digest = hashlib.sha256(normalised_text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{scope}|{digest}"


@dataclass(frozen=True)
class RunLedger:
    """A run's within-run write state, read from the ``write_ledger`` table."""

    keys: dict[str, dict[str, Any]]
    own: dict[str, str]  # note id -> scope key, for notes this run created
    written: int

    @classmethod
    def load(cls, mem: MemoryContext, run_id: str, agent_id: str) -> RunLedger:
        keys: dict[str, dict[str, Any]] = {}
        own: dict[str, str] = {}
        written = 0
        for row in mem.sources.ledger_rows(run_id, agent_id):
            if row["disposition"] == SLOT_DISPOSITION:
                continue
            keys[row["key"]] = row
            if row["disposition"] == Disposition.WRITTEN:
                written += 1
                own[row["note_id"]] = row["scope_key"]
        return cls(keys=keys, own=own, written=written)

    @classmethod
    def empty(cls) -> RunLedger:
        """The ledger of a run nothing has written yet."""
        return cls(keys={}, own={}, written=0)


def ledger_row(
    run_id: str, key: str, note_id: str, scope: WriteScope, disposition: str
) -> dict[str, Any]:
    return {
        "agent_id": scope.agent_id,
        "run_id": run_id,
        "key": key,
        "note_id": note_id,
        "scope_key": scope.key,
        "disposition": disposition,
    }
