"""MemoryService: the agent-facing facade over the note store, the SQL sources, the
embedder and the judge.

Every time-dependent rule reads ``self.clock``; every vector comes from ``self.embedder``
(a content-hash cache around the configured model, so unchanged text is never embedded
twice); every LanceDB access goes through ``self.store``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memory_pipelines import admin
from memory_pipelines.clock import AwareClock
from memory_pipelines.config import InjectConfig, MaintenanceConfig, ManagerConfig, WriteConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.embeddings import (
    CachedEmbedder,
    Embedder,
    embedder_from_env,
    ensure_embedder_model,
)
from memory_pipelines.errors import (
    ConfigError,
    HomeError,
    ValidationError,
)
from memory_pipelines.explain import Explanation, explain
from memory_pipelines.history.as_of import check_as_of, inject_as_of
from memory_pipelines.home import (
    check_sqlite_file,
    display_url,
    note_references,
    prepare_home,
    sqlite_file,
)
from memory_pipelines.injection import Injection, inject
from memory_pipelines.injection.warm import scopes_from_env, warm_scopes
from memory_pipelines.judge import Judge, make_judge
from memory_pipelines.limits import (
    check_fields,
    check_text,
    retrieval_text,
)
from memory_pipelines.memory_manager import MemoryManager
from memory_pipelines.note_events import NoteEvent
from memory_pipelines.notebook import Notebook
from memory_pipelines.notes import (
    Example,
    Note,
    RunContext,
)
from memory_pipelines.phases import compaction
from memory_pipelines.phases.lease import cleanup_allowed
from memory_pipelines.service.api_keys import ApiKeys
from memory_pipelines.service.directory import Directory
from memory_pipelines.service.notes_admin import NotesAdmin
from memory_pipelines.service.parts import part
from memory_pipelines.sources import Sources
from memory_pipelines.storage import lance_storage_options
from memory_pipelines.store import NoteStore, and_, eq, in_
from memory_pipelines.writes import (
    WriteResult,
    execute_writes,
    format_write_feedback,
    write_instructions,
)
from memory_pipelines.writes.combine import GroupWriter
from memory_pipelines.writes.group import GroupCall, execute_group
from memory_pipelines.writes.ownership import check_run
from memory_pipelines.writes.remember import remember as remember_messages

log = logging.getLogger(__name__)


def default_home() -> Path:
    return Path(os.environ.get("MEMORY_HOME") or ".memory")


class MemoryService:
    """Durable agent memory: in-flight writes, injection and the Memory Manager.

    Its operators' calls live in three parts, each also reachable by name on the service
    (``svc.configure_agent`` is ``svc.directory.configure_agent``): :attr:`directory`,
    :attr:`notes_admin` and :attr:`api_keys`.
    """

    directory = part(Directory)
    notes_admin = part(NotesAdmin)
    api_keys = part(ApiKeys)

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
        self._clock = clock if isinstance(clock, AwareClock) else AwareClock(clock)
        self.notebook = Notebook(store, embedder, self._clock, sources.add_note_events)
        self._judge: Judge | None = None
        self.write_config = write_config or WriteConfig()
        self.inject_config = inject_config or InjectConfig()
        self.maintenance_config = maintenance_config or MaintenanceConfig()
        self.manager_config = ManagerConfig()
        self.registry = admin.Registry(sources)
        self._warm_stop = threading.Event()  # set by close(): warm_up reads no more scopes
        # the background compaction drops old versions only while no Memory Manager run
        # holds the home: such a run may still commit what those versions hold
        for table in (store.notes, store.examples):
            table.cleanup_guard = lambda: cleanup_allowed(self.context)
        self._writer = GroupWriter(
            lambda run, writes: execute_writes(self.context, run, writes),
            lambda calls: execute_group(self.context, list(calls)),
        )

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
        The default embedder's model files are fetched once, loudly, when missing
        (``MEMORY_MODEL_FETCH=never`` refuses); an embedder whose model is missing raises
        :class:`~memory_pipelines.errors.EmbeddingModelMissingError` here.
        """
        home_path = Path(home) if home is not None else default_home()
        prepare_home(home_path)
        clock = AwareClock(clock)
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
        # a missing offline model is an error here, not a failed embedding on every write
        ensure_embedder_model(embedder)
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

    def warm_up(self, *, background: bool = False) -> threading.Thread | None:
        """Pay now what the first injection of a process would: load the embedding model
        (MiniLM: ~0.7 s of CPU) and run it once, open the note and example tables' datasets
        (importing ``lance``) with a scan that matches no row, and open a SQL connection.
        What is left to the first injection of a scope is reading that scope into the read
        cache: with ``MEMORY_WARM_START_SCOPES=N`` (a bad value is a ``ConfigError`` here)
        it then reads the ``N`` scopes injected most recently (:meth:`warm_scopes`).
        ``background=True`` does it in a daemon thread and returns that thread: a
        server answers its first requests meanwhile (a request that needs the model waits
        for the load; :meth:`close` stops the scope reads). A failure is left to the first
        call that needs the part to raise."""
        most = scopes_from_env()

        def load() -> None:
            inner = getattr(self.embedder, "inner", self.embedder)
            loader = getattr(inner, "load", None)
            try:
                if callable(loader):
                    loader()
                # the model's first run allocates its buffers; the inner embedder, so the
                # home's embedding cache gets no row
                inner.embed(["warm up"])
            except Exception as e:  # noqa: BLE001 - the first embedding raises it properly
                log.warning("embedding model warm-up failed: %s", e)
                return
            try:
                for table in (self.store.notes, self.store.examples):
                    table.scan_arrow(eq("id", ""), with_vectors=False)  # no row has that id
                self.sources.list_agents()
            except Exception as e:  # noqa: BLE001 - the first read raises it properly
                log.warning("memory tables warm-up failed: %s", e)
                return
            if most > 0:
                try:
                    self.warm_scopes(most)
                except Exception as e:  # noqa: BLE001 - a request reads its scope itself
                    if not self._warm_stop.is_set():
                        log.warning("warm start of recent scopes failed: %s", e)

        if not background:
            load()
            return None
        thread = threading.Thread(target=load, name="memory-warm-up", daemon=True)
        thread.start()
        return thread

    def warm_scopes(self, scopes: int) -> int:
        """Read the ``scopes`` scopes injected most recently (by the injection events of
        any process that served this home) into the injection read cache now, so their
        next inject reads nothing from the table; returns how many were read. What
        :meth:`warm_up` runs with ``MEMORY_WARM_START_SCOPES``; :meth:`close` stops it
        between two scopes (see :mod:`memory_pipelines.injection.warm`)."""
        return warm_scopes(self.context, max(0, int(scopes)), self._warm_stop)

    def close(self) -> None:
        """Flush buffered injection events, then release what :meth:`open` took: the SQL
        connections, the embedding cache's file handle, the tables' background compaction
        threads and cached datasets, so a closed service holds no memory once unreferenced."""
        self._warm_stop.set()  # a background warm start reads no further scope
        try:
            self.sources.flush_injection_events()
        finally:
            try:
                self.sources.close()
            finally:
                try:
                    self.store.close()
                finally:
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
        return self._clock()

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.now

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts (cached by content hash; batched). Any failure of the embedder is
        an ``EmbeddingError``, so callers can fail open or fall back on one error type."""
        return self.notebook.embed(texts)

    @property
    def judge(self) -> Judge:
        """The LLM judge: offline deterministic by default, litellm for a model string."""
        if self._judge is None:
            self._judge = make_judge(self.llm, embedder=self.embedder)
        return self._judge

    @judge.setter
    def judge(self, judge: Judge) -> None:
        """Use ``judge`` (an object with the ``Judge`` methods) from now on."""
        self._judge = judge

    @property
    def context(self) -> MemoryContext:
        """What the behaviour modules receive: store, sources, notebook, judge, clock and
        the current settings (built on each access, so changed settings take effect)."""
        return MemoryContext(
            store=self.store,
            sources=self.sources,
            notebook=self.notebook,
            judge=self.judge,
            clock=self._clock,
            write_config=self.write_config,
            inject_config=self.inject_config,
            maintenance_config=self.maintenance_config,
            manager_config=self.manager_config,
            home=self.home,
        )

    @property
    def manager(self) -> MemoryManager:
        """The Memory Manager phases over this service."""
        return MemoryManager(self.context)

    # -- notes and examples -------------------------------------------------------------------

    def save_notes(
        self, notes: Sequence[Note], vectors: np.ndarray | None = None, *, events: Sequence[NoteEvent] = ()
    ) -> list[Note]:
        """Upsert notes (embedding their text unless vectors are given); stamps timestamps
        and records ``events``, the lifecycle events of these changes."""
        return self.notebook.save_notes(notes, vectors, events=events)

    def save_examples(self, examples: Sequence[Example], vectors: np.ndarray | None = None) -> list[Example]:
        """Upsert examples (their input text is what gets embedded)."""
        return self.notebook.save_examples(examples, vectors)

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

    def compact(self, run_id: str | None = None) -> dict[str, Any]:
        """Compact the note and example tables and refresh their indexes (what the
        compaction asset runs).

        Merges the small fragments single writes leave, folds new rows into the full-text
        and scalar indexes (creating the missing ones), drops versions older than
        ``maintenance_config.cleanup_older_than`` and records one audit step under
        ``run_id``. Returns the versions before/after and versions kept (``notes...``,
        ``examples...``), fragments before/after, rows and seconds per table.
        """
        report = compaction.run(self.context, run_id)
        return {**report, **report.extra}

    # -- agent-facing calls --------------------------------------------------------------------

    def write(self, ctx: RunContext | Mapping[str, Any], writes: Sequence[Any]) -> list[WriteResult]:
        """Run in-flight memory writes through the guard pipeline."""
        run = _context(ctx)
        if self.write_config.group_commit:  # concurrent callers share a round
            results = self._writer.write(run, writes)
        else:
            results = execute_writes(self.context, run, writes)
        self.registry.register(run.user_id, run.company_id)
        return results

    def write_group(
        self, calls: Sequence[tuple[RunContext | Mapping[str, Any], Sequence[Any]]]
    ) -> list[list[WriteResult] | Exception]:
        """Several callers' ``(ctx, writes)``, as if :meth:`write` ran them one after another,
        committed together (group commit, :mod:`memory_pipelines.writes.group`): for each
        call its results, or the exception :meth:`write` would have raised for it."""
        out: dict[int, list[WriteResult] | Exception] = {}
        runs: dict[int, GroupCall] = {}
        for i, (ctx, writes) in enumerate(calls):
            try:
                runs[i] = (_context(ctx), writes)
            except ValidationError as e:
                out[i] = e
        out.update(zip(runs, execute_group(self.context, list(runs.values())), strict=True))
        for ctx, _ in (runs[i] for i in runs if not isinstance(out[i], Exception)):
            self.registry.register(ctx.user_id, ctx.company_id)
        return [out[i] for i in range(len(calls))]

    def format_write_feedback(self, results: Sequence[WriteResult]) -> str:
        """The next-turn message reporting each write's disposition."""
        return format_write_feedback(results)

    def remember(self, ctx: RunContext | Mapping[str, Any], messages: Sequence[Any]) -> list[Note]:
        """Learn from a conversation now: record ``messages`` (OpenAI chat format:
        ``{"role": "user"|"assistant"|"system", "content": ...}``) as turns of the context's
        conversation (``ctx.conversation_id``, else one per run), let the agent's judge
        extract durable notes from the new ones and save them through the guarded in-flight
        path (:meth:`write`: ``Provisional``, the run's cap, the near-duplicate and
        instruction guards). Returns the notes that hold what was learnt; the same messages
        remembered again in the same run add nothing (see
        :mod:`memory_pipelines.writes.remember`)."""
        return remember_messages(self.context, _context(ctx), messages, self.write)

    def write_instructions(self, agent_id: str) -> str:
        """The "Durable Memory" prompt block; empty for agents that may not write."""
        return write_instructions(self.get_agent(agent_id), self.write_config)

    def inject(
        self,
        ctx: RunContext | Mapping[str, Any],
        current_input: str | None = None,
        *,
        as_of: datetime | None = None,
        record: bool = True,
    ) -> Injection:
        """The notes and examples to prepend to a run, rendered as one system message.

        Retrieval reads only the last ``Limits.max_retrieval_chars`` characters of
        ``current_input`` (4,000 by default). With an aware ``as_of``: the injection the
        service would have answered then, with no side effect (see
        :mod:`memory_pipelines.history.as_of`; a naive one is a ``ValidationError``).
        ``record=False``: no attribution (injection events, the 'Memory Injection' step),
        for a caller that sends only part of the injection and records that part itself
        (:func:`memory_pipelines.injection.attribution.record_attribution`)."""
        check_text("current_input", current_input)
        run = _context(ctx)
        if as_of is not None:
            return inject_as_of(self.context, run, retrieval_text(current_input), check_as_of(as_of))
        check_run(self.context, run)  # another tenant's run id: RunConflictError
        injection = inject(self.context, run, retrieval_text(current_input), record=record)
        self.registry.register(run.user_id, run.company_id)
        return injection

    def explain(
        self,
        ctx: RunContext | Mapping[str, Any],
        topic: str,
        current_input: str | None = None,
        *,
        limit: int = 10,
        all_agents: bool = False,
        all_scopes: bool = False,
        as_of: datetime | None = None,
    ) -> Explanation:
        """Why the agent does (or does not) remember ``topic``: status, scope, rank,
        provenance and retirement of each note about it that the context may see
        (read-only); ``all_scopes`` is the operator view of every note of the agent;
        an aware ``as_of`` explains the answer the service would have given then."""
        check_fields({"topic": topic, "current_input": current_input})
        return explain(
            self.context,
            _context(ctx),
            retrieval_text(topic),
            retrieval_text(current_input),
            limit=limit,
            all_agents=all_agents,
            all_scopes=all_scopes,
            as_of=as_of,
        )



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
