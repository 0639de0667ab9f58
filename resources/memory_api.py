"""The agent-facing Dagster resource: a thin, config-only handle on ``MemoryService``.

``MemoryApiResource`` holds where the memory lives (``home``, optional LanceDB and SQL
URLs), the judge's litellm model and the embedding model. The service itself is private
state: opened in ``setup_for_execution`` and closed in ``teardown_after_execution`` when
Dagster runs an asset or op, or opened lazily by :meth:`MemoryApiResource.get_service`
(and closed by :meth:`~MemoryApiResource.close` or the :meth:`~MemoryApiResource.open`
context manager) when a plain Python agent uses the resource outside Dagster.

Optional settings left unset fall back to the environment when the service opens
(``MEMORY_LANCE_URI``, ``MEMORY_SQL_URL``, ``MEMORY_LLM_MODEL``,
``MEMORY_EMBEDDING_MODEL``), so :func:`memory_api_from_env` only binds ``MEMORY_HOME``
through ``dagster.EnvVar``: an ``EnvVar`` of an unset variable fails the run's config
resolution, and these are optional.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from memory_pipelines import Injection, MemoryService, Note, RunContext, WriteResult
from memory_pipelines.embeddings import embedder_from_name

#: The embedding cache file inside a memory home (the same file ``MemoryService.open`` uses).
EMBEDDING_CACHE_FILE = "embedding-cache.sqlite3"


class MemoryApiResource(dg.ConfigurableResource):
    """Agent memory for assets, ops and plain Python: ``write`` and ``inject`` over one
    memory home.

    Reads and writes the home's LanceDB note tables and SQL sources through
    :class:`memory_pipelines.MemoryService`; holds no state of its own beyond the open
    service, which lives from setup to teardown of a Dagster execution (or, outside
    Dagster, from the first call that needs it until :meth:`close`).
    """

    home: str = Field(description="Memory home folder (LanceDB tables and the SQLite file).")
    lance_uri: str | None = Field(
        default=None,
        description="LanceDB URI of the note tables (default: $MEMORY_LANCE_URI or <home>/lance).",
    )
    sql_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the sources (default: $MEMORY_SQL_URL or SQLite in home).",
    )
    llm_model: str | None = Field(
        default=None,
        description="litellm model of the judge (default: $MEMORY_LLM_MODEL or the offline judge).",
    )
    embedding_model: str | None = Field(
        default=None,
        description="Embedding model: 'default' (offline MiniLM), 'hash' (tests) or a litellm "
        "embedding model (default: $MEMORY_EMBEDDING_MODEL or MiniLM).",
    )

    _service: MemoryService | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    # -- lifecycle ----------------------------------------------------------------------

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Open the service for the duration of a Dagster execution."""
        self.get_service()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Close the service opened for the execution."""
        self.close()

    def _open_service(self) -> MemoryService:
        overrides: dict[str, Any] = {}
        if self.lance_uri:
            overrides["lance_uri"] = self.lance_uri
        if self.sql_url:
            overrides["sql_url"] = self.sql_url
        if self.llm_model:
            overrides["llm"] = self.llm_model
        if self.embedding_model:
            cache = Path(self.home) / EMBEDDING_CACHE_FILE
            overrides["embedder"] = embedder_from_name(self.embedding_model, cache_path=cache)
        return MemoryService.from_env(self.home, **overrides)

    def get_service(self) -> MemoryService:
        """The open service (opened now if this resource is used outside Dagster)."""
        with self._lock:
            if self._service is None:
                self._service = self._open_service()
            return self._service

    def close(self) -> None:
        """Close the service if it is open (a later call opens a fresh one)."""
        with self._lock:
            svc, self._service = self._service, None
        if svc is not None:
            svc.close()

    @contextmanager
    def open(self) -> Iterator[MemoryService]:
        """``with resource.open() as svc:``; closes the service on exit unless it was
        already open (e.g. inside a Dagster execution)."""
        with self._lock:
            was_open = self._service is not None
        svc = self.get_service()
        try:
            yield svc
        finally:
            if not was_open:
                self.close()

    # -- agent calls ----------------------------------------------------------------------

    def write(
        self, ctx: RunContext | Mapping[str, Any], writes: Sequence[Any]
    ) -> list[WriteResult]:
        """Run in-flight memory writes (``MemoryService.write``)."""
        return self.get_service().write(ctx, writes)

    def inject(
        self, ctx: RunContext | Mapping[str, Any], current_input: str | None = None
    ) -> Injection:
        """The injection for a run start (``MemoryService.inject``)."""
        return self.get_service().inject(ctx, current_input)

    def remember(self, ctx: RunContext | Mapping[str, Any], messages: Sequence[Any]) -> list[Note]:
        """Learn from a conversation now (``MemoryService.remember``): the notes kept."""
        return self.get_service().remember(ctx, messages)

    def format_write_feedback(self, results: Sequence[WriteResult]) -> str:
        """The next-turn message reporting each write's disposition."""
        return self.get_service().format_write_feedback(results)

    def write_instructions(self, agent_id: str) -> str:
        """The "Durable Memory" system-prompt block for an agent ("" if it may not write)."""
        return self.get_service().write_instructions(agent_id)


def memory_api_from_env() -> MemoryApiResource:
    """The resource as the definitions assemble it: ``home`` from ``MEMORY_HOME`` via
    ``dagster.EnvVar`` (resolved at run launch, hidden in the UI); the optional URLs and
    models come from their environment variables when the service opens."""
    return MemoryApiResource(home=dg.EnvVar("MEMORY_HOME"))
