"""The service's administration calls: notes and agents for operators (CONTRACT §2.9),
export and import (§2.7) and API keys (§2.8); a mixin of
:class:`~memory_pipelines.service.MemoryService`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from memory_pipelines import admin
from memory_pipelines.history import transfer
from memory_pipelines.keys import create_api_key, revoke_api_key
from memory_pipelines.notes import (
    AgentConfig,
    Note,
)


class AdminCalls:
    """Operators' calls: list, correct, archive and erase notes; export/import; keys."""

    # -- administration (CONTRACT §2.9; memory_pipelines.admin) ---------------------------

    def list_notes(
        self,
        *,
        agent_id: str | None = None,
        user_id: str | None = None,
        company_id: str | None = None,
        status: str | None = None,
        q: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        key: Mapping[str, Any] | None = None,
    ) -> admin.NotePage:
        """One page of notes, newest first, filtered and searched (every word of ``q``,
        ignoring case), with the cursor of the next page; ``key`` (an API key row) keeps
        the page inside its binding."""
        return admin.list_notes(
            self.context,
            agent_id=agent_id,
            user_id=user_id,
            company_id=company_id,
            status=status,
            q=q,
            limit=limit,
            cursor=cursor,
            key=key,
        )

    def note(self, note_id: str, *, key: Mapping[str, Any] | None = None) -> Note:
        """The note; ``NotFoundError`` for an unknown id or one outside ``key``'s binding."""
        return admin.get_note(self.context, note_id, key)

    def update_note(
        self,
        note_id: str,
        *,
        note: str | None = None,
        type: str | None = None,
        status: str | None = None,
        protection_tier: str | None = None,
        key: Mapping[str, Any] | None = None,
    ) -> Note:
        """Correct a note (a changed text is re-embedded): one event, one audit step."""
        return admin.update_note(
            self.context,
            note_id,
            note=note,
            type=type,
            status=status,
            protection_tier=protection_tier,
            key=key,
        )

    def archive_note(self, note_id: str, *, key: Mapping[str, Any] | None = None) -> Note:
        """Archive a note (an ``archived`` event and an audit step)."""
        return admin.archive_note(self.context, note_id, key)

    def erase_note(
        self, note_id: str, *, key: Mapping[str, Any] | None = None, lease_wait_s: float | None = None
    ) -> dict[str, Any]:
        """Erase a note for good (row, events, injection rows, old versions); records a
        ``purged`` event without text; returns counts. Admin keys only. While a Memory
        Manager run holds the home it waits up to ``lease_wait_s`` (default
        ``manager_config.lease_wait_s``), then raises ``ManagerBusyError`` having changed
        nothing."""
        return admin.erase_note(self.context, note_id, key, lease_wait_s=lease_wait_s)

    def list_agents(self) -> list[AgentConfig]:
        """Every configured agent (active or not), by id."""
        return self.sources.list_agents()

    def delete_agent_run(self, run_id: str) -> None:
        """Delete an agent run's source row (stale-reference pruning then archives the
        notes it sourced)."""
        self.sources.delete_agent_run(run_id)

    # -- export and import (memory_pipelines.history.transfer) -----------------------------

    def export_notes(
        self,
        path: str | os.PathLike[str],
        *,
        agent_id: str | None = None,
        user_id: str | None = None,
        company_id: str | None = None,
        include_vectors: bool = True,
    ) -> int:
        """Write every note and example of the selection (any status, every field, their
        history and, unless told not to, vectors) to a ``.jsonl`` or ``.parquet`` file
        outside the home; returns how many notes and examples it wrote."""
        return transfer.export_notes(
            self.context,
            path,
            agent_id=agent_id,
            user_id=user_id,
            company_id=company_id,
            include_vectors=include_vectors,
        )

    def import_notes(self, path: str | os.PathLike[str]) -> dict[str, int]:
        """Import an export file (validated whole first), keeping ids, fields and history;
        idempotent. Returns counts: ``imported``, ``skipped``, ``notes``, ``examples``,
        ``events``, ``reembedded``."""
        return transfer.import_notes(self.context, path)

    # -- API keys ---------------------------------------------------------------------------

    def create_api_key(
        self,
        *,
        company_id: str | None = None,
        agent_id: str | None = None,
        user_id: str | None = None,
        admin: bool = False,
        primary_scope: tuple[str, str] | None = None,
        secondary_scopes: Mapping[str, Any] | None = None,
        role: str | None = None,
    ) -> str:
        """Create an HTTP API key and return its secret, shown once (only its hash is
        stored). A key is ``admin`` or bound to a company, optionally also to an agent, a
        user and the multi-tenant scopes it may claim; its ``role`` ("agent", "analyst" or
        "admin"; by default agent when bound to an agent, else analyst) says what it may
        do there (see :mod:`memory_pipelines.keys`)."""
        return create_api_key(
            self.context,
            company_id=company_id,
            agent_id=agent_id,
            user_id=user_id,
            admin=admin,
            primary_scope=primary_scope,
            secondary_scopes=secondary_scopes,
            role=role,
        )

    def revoke_api_key(self, key_id: str) -> None:
        """Revoke an API key from now on (``NotFoundError`` for an unknown id)."""
        revoke_api_key(self.context, key_id)

    def list_api_keys(self) -> list[dict[str, Any]]:
        """Every API key, oldest first: id, binding columns, role, created_at, revoked_at
        (never the secret or its hash)."""
        return self.sources.list_api_keys()
