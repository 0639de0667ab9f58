"""``svc.api_keys``: the HTTP API keys of a memory home (CONTRACT §2.8). Each method is
also ``svc.<name>``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memory_pipelines.keys import create_api_key, revoke_api_key
from memory_pipelines.service.parts import Host


class ApiKeys:
    """Create, list and revoke the keys that bind HTTP callers to a tenant and a role."""

    def __init__(self, service: Host):
        self._service = service

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
            self._service.context,
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
        revoke_api_key(self._service.context, key_id)

    def list_api_keys(self) -> list[dict[str, Any]]:
        """Every API key, oldest first: id, binding columns, role, created_at, revoked_at
        (never the secret or its hash)."""
        return self._service.sources.list_api_keys()
