"""MemoryService: the agent-facing facade over the note store, the SQL sources, the
embedder and the judge.

Every time-dependent rule reads ``self.clock``; every vector comes from ``self.embedder``
(a content-hash cache around the configured model, so unchanged text is never embedded
twice); every LanceDB access goes through ``self.store``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from memory_pipelines.embeddings import CachedEmbedder, Embedder, embedder_from_env
from memory_pipelines.errors import (
    ConfigError,
    EmbeddingError,
    HomeError,
    MemoryPipelineError,
    NotFoundError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.home import (
    check_sqlite_file,
    display_url,
    note_references,
    prepare_home,
    sqlite_file,
)
from memory_pipelines.limits import (
    check_count,
    check_fields,
    check_ids,
    check_text,
    limits,
    retrieval_text,
    shown,
)
from memory_pipelines.notes import (
    AgentConfig,
    AuthorType,
    Example,
    ExampleStatus,
    Note,
    NoteStatus,
    NoteType,
    ProtectionTier,
    RunContext,
)
from memory_pipelines.partitions import check_agent_id
from memory_pipelines.sources import Sources
from memory_pipelines.storage import lance_storage_options
from memory_pipelines.store import NoteStore, and_, eq, in_

if TYPE_CHECKING:
    from memory_pipelines.explain import Explanation
    from memory_pipelines.injection import InjectConfig, Injection
    from memory_pipelines.judge import Judge
    from memory_pipelines.maintenance import MaintenanceConfig
    from memory_pipelines.manager import MemoryManager
    from memory_pipelines.writes import WriteConfig, WriteResult


log = logging.getLogger(__name__)

#: The agent settings that count injected items (bounded by ``Limits.max_injected_items``).
COUNT_FIELDS = ("max_notes_to_inject", "max_examples_to_inject")
_RERANKER_FLAGS = (
    "enabled",
    "fallbackOnError",
    "fallback_on_error",
    "rerankExamples",
    "rerank_examples",
)


def check_agent_fields(fields: Mapping[str, Any]) -> None:
    """``ValidationError`` naming the field for an agent setting out of range (CONTRACT
    §2.8): counts above ``Limits.max_injected_items`` (or below 0, or not integers), a
    ``scope_config`` the scope layer cannot parse, a malformed ``reranker_config``."""
    bound = limits()
    for name in COUNT_FIELDS:
        if name in fields:
            check_count(name, fields[name], bound.max_injected_items)
    if fields.get("scope_config") is not None:
        from memory_pipelines.scoping import SecondaryScopeConfig

        value = fields["scope_config"]
        if not isinstance(value, Mapping):
            raise ValidationError(f"scope_config must be an object, got {shown(value)}")
        try:
            SecondaryScopeConfig.from_value(value)
        except (ConfigError, TypeError, ValueError) as e:
            raise ValidationError(f"scope_config is malformed: {e}") from e
    if fields.get("reranker_config") is not None:
        _check_reranker(fields["reranker_config"], bound.max_retrieval_multiplier)


def _check_reranker(value: Any, max_multiplier: int) -> None:
    if not isinstance(value, Mapping):
        raise ValidationError(f"reranker_config must be an object, got {shown(value)}")
    for key in _RERANKER_FLAGS:
        if key in value and not isinstance(value[key], bool):
            raise ValidationError(f"reranker_config.{key} must be true or false, got {shown(value[key])}")
    for key in ("retrievalMultiplier", "retrieval_multiplier"):
        if key in value and value[key] is not None:
            check_count(f"reranker_config.{key}", value[key], max_multiplier, minimum=1)
    if "type" in value and value["type"] is not None and not isinstance(value["type"], str):
        raise ValidationError(f"reranker_config.type must be a string, got {shown(value['type'])}")
    if "model" in value and value["model"] is not None and not isinstance(value["model"], str):
        raise ValidationError(f"reranker_config.model must be a string, got {shown(value['model'])}")


def clamp_agent(agent: AgentConfig) -> AgentConfig:
    """An agent row as reads use it: counts above ``Limits.max_injected_items`` (stored
    before ``configure_agent`` checked them) are clamped, with a logged warning."""
    bound = limits().max_injected_items
    update = {f: bound for f in COUNT_FIELDS if getattr(agent, f) > bound}
    if not update:
        return agent
    log.warning(
        "agent %r has %s above the limit %d; using %d (fix it with configure_agent)",
        agent.agent_id,
        ", ".join(f"{f}={getattr(agent, f)}" for f in update),
        bound,
        bound,
    )
    return agent.model_copy(update=update)


def utc_now() -> datetime:
    """The default service clock: the current aware UTC time."""
    return datetime.now(UTC)


def append_comment(existing: str | None, text: str) -> str:
    """Append an audit marker to a note's comments; earlier comments are never replaced."""
    text = text.strip()
    if not existing:
        return text
    return f"{existing.rstrip()} {text}"


def default_home() -> Path:
    return Path(os.environ.get("MEMORY_HOME") or ".memory")


class MemoryService:
    """Durable agent memory: in-flight writes, injection and the Memory Manager."""

    def __init__(
        self,
        *,
        home: Path | None,
        store: NoteStore,
        sources: Sources,
        embedder: Embedder,
        llm: Any,
        clock: Callable[[], datetime],
        write_config: WriteConfig | None = None,
        inject_config: InjectConfig | None = None,
        maintenance_config: MaintenanceConfig | None = None,
    ):
        self.home = home
        self.store = store
        self.sources = sources
        self.embedder = embedder
        self.llm = llm
        self._clock = clock
        self._judge: Judge | None = None
        self._manager: MemoryManager | None = None
        from memory_pipelines.injection import InjectConfig
        from memory_pipelines.writes import WriteConfig

        self.write_config = write_config or WriteConfig()
        self.inject_config = inject_config or InjectConfig()
        from memory_pipelines.maintenance import MaintenanceConfig

        self.maintenance_config = maintenance_config or MaintenanceConfig()

    # -- construction -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        home: str | Path | None = None,
        *,
        lance_uri: str | None = None,
        sql_url: str | None = None,
        embedder: Embedder | None = None,
        llm: Any = None,
        clock: Callable[[], datetime] | None = None,
        write_config: WriteConfig | None = None,
        inject_config: InjectConfig | None = None,
        storage_options: dict[str, str] | None = None,
        maintenance_config: MaintenanceConfig | None = None,
    ) -> MemoryService:
        """Open (creating if needed) the memory home.

        ``home`` defaults to ``$MEMORY_HOME`` or ``./.memory``; ``lance_uri`` and ``sql_url``
        override where the note tables and the SQL sources live. ``embedder`` defaults to
        the offline MiniLM model; ``llm`` is a litellm model string, a judge object, or
        None for the offline deterministic judge; ``clock`` returns aware UTC datetimes.
        ``storage_options`` for an object-store ``lance_uri`` are merged over those from
        the environment (see :func:`memory_pipelines.storage.lance_storage_options`).
        """
        home_path = Path(home) if home is not None else default_home()
        prepare_home(home_path)
        clock = clock or utc_now
        probe = clock()
        if probe.tzinfo is None or probe.utcoffset() is None:
            raise ConfigError("clock must return timezone-aware UTC datetimes")
        cache_path = home_path / "embedding-cache.sqlite3"
        lance_uri = lance_uri or str((home_path / "lance").resolve())
        sql_url = sql_url or f"sqlite:///{(home_path / 'memory.sqlite3').resolve()}"
        check_sqlite_file(sqlite_file(sql_url))
        check_sqlite_file(cache_path)
        if embedder is None:
            embedder = embedder_from_env(cache_path=cache_path)
        elif not isinstance(embedder, CachedEmbedder):
            for attr in ("model_id", "dim", "embed"):
                if not hasattr(embedder, attr):
                    raise ConfigError(f"embedder is missing {attr!r} (see the Embedder protocol)")
            embedder = CachedEmbedder(embedder, cache_path)
        sources = Sources(sql_url, clock)
        try:
            store = _open_store(sources, lance_uri, embedder.dim, storage_options)
        except BaseException:
            sources.close()
            raise
        return cls(
            home=home_path,
            store=store,
            sources=sources,
            embedder=embedder,
            llm=llm,
            clock=clock,
            write_config=write_config,
            inject_config=inject_config,
            maintenance_config=maintenance_config,
        )

    @classmethod
    def from_env(cls, home: str | Path | None = None, **kwargs: Any) -> MemoryService:
        """Open with ``MEMORY_HOME``, ``MEMORY_LANCE_URI``, ``MEMORY_SQL_URL`` and
        ``MEMORY_LLM_MODEL`` from the environment (explicit arguments win)."""
        kwargs.setdefault("lance_uri", os.environ.get("MEMORY_LANCE_URI") or None)
        kwargs.setdefault("sql_url", os.environ.get("MEMORY_SQL_URL") or None)
        kwargs.setdefault("llm", os.environ.get("MEMORY_LLM_MODEL") or None)
        return cls.open(home, **kwargs)

    def close(self) -> None:
        """Release the SQL connections and the embedding cache's file handle."""
        self.sources.close()
        close_embedder = getattr(self.embedder, "close", None)
        if callable(close_embedder):
            close_embedder()

    def __enter__(self) -> MemoryService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------

    def now(self) -> datetime:
        """The service clock (aware UTC)."""
        value = self._clock()
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigError("clock returned a naive datetime; it must be timezone-aware UTC")
        return value.astimezone(UTC)

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.now

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts (cached by content hash; batched). Any failure of the embedder is
        an ``EmbeddingError``, so callers can fail open or fall back on one error type."""
        try:
            return self.embedder.embed(list(texts))
        except MemoryPipelineError:
            raise
        except Exception as e:
            raise EmbeddingError(str(e) or type(e).__name__) from e

    @property
    def judge(self) -> Judge:
        """The LLM judge: offline deterministic by default, litellm for a model string."""
        if self._judge is None:
            from memory_pipelines.judge import make_judge

            self._judge = make_judge(self.llm, embedder=self.embedder)
        return self._judge

    @property
    def manager(self) -> MemoryManager:
        """The Memory Manager phases over this service."""
        if self._manager is None:
            from memory_pipelines.manager import MemoryManager

            self._manager = MemoryManager(self)
        return self._manager

    # -- agents, users, companies, sources ----------------------------------------------------

    def configure_agent(self, agent_id: str, **fields: Any) -> AgentConfig:
        """Create or update an agent's memory configuration (unknown fields are an error;
        out-of-range values are a ``ValidationError``, see :func:`check_agent_fields`)."""
        if not isinstance(agent_id, str) or not agent_id.strip():
            raise ValidationError("agent_id must be a non-empty string")
        check_ids({"agent_id": agent_id})
        check_agent_id(agent_id)
        unknown = set(fields) - set(AgentConfig.model_fields)
        if unknown:
            raise ValidationError(f"unknown agent field(s): {', '.join(sorted(unknown))}")
        check_fields(fields)
        check_agent_fields(fields)
        current = self.sources.get_agent(agent_id)
        base = current.model_dump() if current else {"agent_id": agent_id}
        try:
            config = AgentConfig.model_validate({**base, **fields})
        except Exception as e:
            raise ValidationError(f"invalid agent configuration: {e}") from e
        return self.sources.upsert_agent(config)

    def get_agent(self, agent_id: str) -> AgentConfig:
        """The agent's configuration; ``UnknownAgentError`` if it is not configured."""
        agent = self.sources.get_agent(agent_id) if isinstance(agent_id, str) else None
        if agent is None:
            raise UnknownAgentError(f"unknown agent {agent_id!r}")
        return clamp_agent(agent)

    def deactivate_agent(self, agent_id: str) -> None:
        self.get_agent(agent_id)
        self.sources.set_agent_status(agent_id, "Inactive")

    def add_company(self, company_id: str, name: str | None = None) -> None:
        check_ids({"company_id": company_id})
        check_fields({"name": name})
        self.sources.add_company(company_id, name)

    def add_user(self, user_id: str, company_id: str | None = None, name: str | None = None) -> None:
        check_ids({"user_id": user_id, "company_id": company_id})
        check_fields({"name": name})
        self.sources.add_user(user_id, company_id, name)

    def delete_user(self, user_id: str) -> None:
        self.sources.delete_user(user_id)

    def delete_company(self, company_id: str) -> None:
        self.sources.delete_company(company_id)

    def add_conversation(
        self, conversation_id: str, agent_id: str, user_id: str | None = None, company_id: str | None = None
    ) -> None:
        check_ids(
            {
                "conversation_id": conversation_id,
                "agent_id": agent_id,
                "user_id": user_id,
                "company_id": company_id,
            }
        )
        self.sources.add_conversation(conversation_id, agent_id, user_id, company_id)

    def add_message(
        self,
        conversation_id: str,
        message_id: str,
        role: str,
        text: str,
        rating: int | None = None,
        rating_comment: str | None = None,
        created_at: datetime | None = None,
    ) -> None:
        check_ids({"conversation_id": conversation_id, "message_id": message_id})
        check_fields(
            {
                "role": role,
                "text": text,
                "rating_comment": rating_comment,
            }
        )
        self.sources.add_message(
            conversation_id, message_id, role, text, rating, rating_comment, created_at
        )

    def delete_conversation(self, conversation_id: str) -> None:
        self.sources.delete_conversation(conversation_id)

    def add_agent_run(
        self,
        run_id: str,
        agent_id: str,
        user_id: str | None = None,
        company_id: str | None = None,
        conversation_id: str | None = None,
        status: str = "Completed",
        success: bool | None = True,
        error_message: str | None = None,
        **fields: Any,
    ) -> None:
        check_ids(
            {
                "run_id": run_id,
                "agent_id": agent_id,
                "user_id": user_id,
                "company_id": company_id,
                "conversation_id": conversation_id,
            }
        )
        check_fields({"error_message": error_message, **fields})
        self.sources.add_agent_run(
            run_id,
            agent_id,
            user_id=user_id,
            company_id=company_id,
            conversation_id=conversation_id,
            status=status,
            success=success,
            error_message=error_message,
            **fields,
        )

    # -- notes and examples -------------------------------------------------------------------

    def save_notes(self, notes: Sequence[Note], vectors: np.ndarray | None = None) -> list[Note]:
        """Upsert notes (embedding their text unless vectors are given); stamps timestamps."""
        if not notes:
            return []
        now = self.now()
        stamped = [
            n.model_copy(
                update={
                    "created_at": n.created_at or now,
                    "updated_at": now,
                    "embedding_model_id": self.embedder.model_id,
                }
            )
            for n in notes
        ]
        if vectors is None:
            vectors = self.embed([n.note for n in stamped])
        self.store.notes.upsert(stamped, vectors)
        return stamped

    def save_examples(self, examples: Sequence[Example], vectors: np.ndarray | None = None) -> list[Example]:
        """Upsert examples (their input text is what gets embedded)."""
        if not examples:
            return []
        now = self.now()
        stamped = [
            e.model_copy(
                update={
                    "created_at": e.created_at or now,
                    "updated_at": now,
                    "embedding_model_id": self.embedder.model_id,
                }
            )
            for e in examples
        ]
        if vectors is None:
            vectors = self.embed([e.example_input for e in stamped])
        self.store.examples.upsert(stamped, vectors)
        return stamped

    def add_note(
        self,
        note: str,
        *,
        type: str = NoteType.PREFERENCE,
        status: str = NoteStatus.ACTIVE,
        author_type: str = AuthorType.USER,
        protection_tier: str = ProtectionTier.STANDARD,
        agent_id: str | None = None,
        user_id: str | None = None,
        company_id: str | None = None,
        **other_fields: Any,
    ) -> Note:
        """Store a note manually (any type, any status)."""
        if not isinstance(note, str) or not note.strip():
            raise ValidationError("note must be a non-empty string")
        check_fields(
            {
                "note": note,
                "type": type,
                "status": status,
                "author_type": author_type,
                "protection_tier": protection_tier,
                **other_fields,
            }
        )
        check_ids({"agent_id": agent_id, "user_id": user_id, "company_id": company_id})
        try:
            obj = Note(
                note=note.strip(),
                type=type,
                status=status,
                author_type=author_type,
                protection_tier=protection_tier,
                agent_id=agent_id,
                user_id=user_id,
                company_id=company_id,
                **other_fields,
            )
        except Exception as e:
            raise ValidationError(f"invalid note: {e}") from e
        return self.save_notes([obj])[0]

    def add_example(
        self,
        agent_id: str,
        example_input: str,
        example_output: str,
        *,
        success_score: float | None = None,
        user_id: str | None = None,
        company_id: str | None = None,
        status: str = ExampleStatus.ACTIVE,
        **other_fields: Any,
    ) -> Example:
        """Store a curated example for an agent."""
        for name, value in (("example_input", example_input), ("example_output", example_output)):
            if not isinstance(value, str) or not value.strip():
                raise ValidationError(f"{name} must be a non-empty string")
        check_fields(
            {
                "example_input": example_input,
                "example_output": example_output,
                "status": status,
                **other_fields,
            }
        )
        check_ids({"agent_id": agent_id, "user_id": user_id, "company_id": company_id})
        if success_score is not None and not (0 <= float(success_score) <= 100):
            raise ValidationError(f"success_score must be between 0 and 100, got {success_score!r}")
        try:
            obj = Example(
                agent_id=agent_id,
                example_input=example_input,
                example_output=example_output,
                success_score=success_score,
                user_id=user_id,
                company_id=company_id,
                status=status,
                **other_fields,
            )
        except Exception as e:
            raise ValidationError(f"invalid example: {e}") from e
        return self.save_examples([obj])[0]

    def get_note(self, note_id: str) -> Note | None:
        return self.store.notes.get(note_id)

    def get_example(self, example_id: str) -> Example | None:
        return self.store.examples.get(example_id)

    def notes(self, **filters: Any) -> pd.DataFrame:
        """The notes as a pandas DataFrame; keyword filters match columns exactly
        (a list or tuple value matches any of its items, None matches null)."""
        return self.store.notes.scan(self._filters(Note, filters))

    def examples(self, **filters: Any) -> pd.DataFrame:
        return self.store.examples.scan(self._filters(Example, filters))

    @staticmethod
    def _filters(model: type, filters: Mapping[str, Any]):
        unknown = set(filters) - set(model.model_fields)
        if unknown:
            raise ValidationError(f"unknown filter field(s): {', '.join(sorted(unknown))}")
        conds = []
        for key, value in filters.items():
            if isinstance(value, (list, tuple, set, frozenset)):
                conds.append(in_(key, list(value)))
            else:
                conds.append(eq(key, value))
        return and_(*conds)

    def update_notes(self, changes: Iterable[tuple[Note, Mapping[str, Any]]]) -> list[Note]:
        """Apply field changes to notes and save them in one upsert."""
        updated: list[Note] = []
        for n, ch in changes:  # validated (and enum values normalised) like a new note
            try:
                updated.append(Note.model_validate({**n.model_dump(), **dict(ch)}))
            except ValueError as e:  # pydantic's ValidationError is a ValueError
                raise ValidationError(f"invalid note update for {n.id!r}: {e}") from e
        return self.save_notes(updated)

    def set_note_status(self, note_id: str, status: str, comment: str | None = None) -> Note:
        """Change a note's status, appending ``comment`` to its audit trail."""
        try:
            status = NoteStatus(status).value
        except ValueError as e:
            raise ValidationError(f"unknown note status {status!r}") from e
        note = self.get_note(note_id)
        if note is None:
            raise NotFoundError(f"note {note_id!r} does not exist")
        update: dict[str, Any] = {"status": status}
        if comment:
            update["comments"] = append_comment(note.comments, comment)
        return self.update_notes([(note, update)])[0]

    # -- agent-facing calls --------------------------------------------------------------------

    def write(self, ctx: RunContext | Mapping[str, Any], writes: Sequence[Any]) -> list[WriteResult]:
        """Run in-flight memory writes through the guard pipeline (reference §2)."""
        from memory_pipelines.writes import execute_writes

        return execute_writes(self, _context(ctx), writes)

    def format_write_feedback(self, results: Sequence[WriteResult]) -> str:
        """The next-turn message reporting each write's disposition (reference §2.4)."""
        from memory_pipelines.writes import format_write_feedback

        return format_write_feedback(results)

    def write_instructions(self, agent_id: str) -> str:
        """The "Durable Memory" prompt block; empty for agents that may not write."""
        from memory_pipelines.writes import write_instructions

        return write_instructions(self.get_agent(agent_id), self.write_config)

    def inject(self, ctx: RunContext | Mapping[str, Any], current_input: str | None = None) -> Injection:
        """The notes and examples to prepend to a run, rendered as one system message.

        Retrieval reads only the last ``Limits.max_retrieval_chars`` characters of
        ``current_input`` (4,000 by default)."""
        from memory_pipelines.injection import inject

        check_text("current_input", current_input)
        return inject(self, _context(ctx), retrieval_text(current_input))

    def explain(
        self,
        ctx: RunContext | Mapping[str, Any],
        topic: str,
        current_input: str | None = None,
        *,
        limit: int = 10,
        all_agents: bool = False,
        all_scopes: bool = False,
    ) -> Explanation:
        """Why the agent does (or does not) remember ``topic``: status, scope, rank,
        provenance and retirement of each note about it that the context may see
        (read-only); ``all_scopes`` is the operator view of every note of the agent."""
        from memory_pipelines.explain import explain

        check_fields({"topic": topic, "current_input": current_input})
        return explain(
            self,
            _context(ctx),
            retrieval_text(topic),
            retrieval_text(current_input),
            limit=limit,
            all_agents=all_agents,
            all_scopes=all_scopes,
        )

    def purge_user(self, user_id: str) -> dict[str, Any]:
        """Erase every note, example, audit and history row of a user, old table versions
        included, and return counts (see :mod:`memory_pipelines.purge`)."""
        from memory_pipelines.purge import purge_user

        return purge_user(self, user_id)

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
    ) -> str:
        """Create an HTTP API key and return its secret, shown once (only its hash is
        stored). A key is ``admin`` or bound to a company, optionally also to an agent, a
        user and the multi-tenant scopes it may claim (see :mod:`memory_pipelines.keys`)."""
        from memory_pipelines.keys import create_api_key

        return create_api_key(
            self,
            company_id=company_id,
            agent_id=agent_id,
            user_id=user_id,
            admin=admin,
            primary_scope=primary_scope,
            secondary_scopes=secondary_scopes,
        )

    def revoke_api_key(self, key_id: str) -> None:
        """Revoke an API key from now on (``NotFoundError`` for an unknown id)."""
        from memory_pipelines.keys import revoke_api_key

        revoke_api_key(self, key_id)

    def list_api_keys(self) -> list[dict[str, Any]]:
        """Every API key, oldest first: id, binding columns, created_at, revoked_at (never
        the secret or its hash)."""
        return self.sources.list_api_keys()


def _open_store(
    sources: Sources, lance_uri: str, dim: int, storage_options: dict[str, str] | None
) -> NoteStore:
    """The note store at ``lance_uri``; its tables are created only while no SQL row
    references notes, so a deleted store is a ``HomeError``, not a silent empty one."""
    # an in-memory store starts empty every time: nothing on disk could have been lost
    referenced = 0 if lance_uri.startswith("memory://") else note_references(sources)
    try:
        return NoteStore(
            lance_uri,
            dim,
            storage_options=lance_storage_options(lance_uri, storage_options),
            create=not referenced,
        )
    except HomeError as e:
        raise HomeError(
            f"the note store {lance_uri} is missing ({e}), but the SQL database"
            f" {display_url(sources.url)} still references its notes ({referenced} ledger,"
            " injection or cycle rows): restore the LanceDB folder (or point"
            " MEMORY_LANCE_URI at it) rather than start an empty one"
        ) from None


def _context(ctx: RunContext | Mapping[str, Any]) -> RunContext:
    if isinstance(ctx, RunContext):
        return ctx
    if isinstance(ctx, Mapping):
        try:
            return RunContext.model_validate(dict(ctx))
        except Exception as e:
            raise ValidationError(f"invalid run context: {e}") from e
    raise ValidationError(f"run context must be a RunContext or a mapping, got {type(ctx).__name__}")
