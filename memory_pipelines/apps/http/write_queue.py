"""Group commit for HTTP writes: one writer thread per app, and per-run locks without it."""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from memory_pipelines.errors import (
    MemoryPipelineError,
)
from memory_pipelines.injection.cache import read_cache
from memory_pipelines.injection.read_filters import scope_cells
from memory_pipelines.notes import RunContext
from memory_pipelines.scope import RunScope
from memory_pipelines.service import MemoryService
from memory_pipelines.store.compaction import background_priority
from memory_pipelines.writes import WriteResult
from memory_pipelines.writes.validate import ValidRequest, request_fields, validate_request

logger = logging.getLogger(__name__)


class _Lock:
    """A lock that can be held in a weak-value map (``threading.Lock`` cannot)."""

    __slots__ = ("lock", "__weakref__")

    def __init__(self) -> None:
        self.lock = threading.Lock()


class RunLocks:
    """One lock per run id, forgotten once no request holds it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: weakref.WeakValueDictionary[str, _Lock] = weakref.WeakValueDictionary()

    def get(self, run_id: str) -> _Lock:
        """The lock of ``run_id`` (keep a reference while holding it)."""
        with self._guard:
            lock = self._locks.get(run_id)
            if lock is None:
                lock = _Lock()
                self._locks[run_id] = lock
            return lock


@dataclass
class _Pending:
    """One enqueued write request and the future its handler waits on."""

    ctx: RunContext
    writes: Sequence[Any]
    future: Future


#: The most requests one round of the writer takes from the queue (one group commit).
MAX_ROUND = 64


class WriteQueue:
    """One writer for a service's in-flight writes (group commit).

    :meth:`submit` enqueues a request and blocks until the writer thread has run it; the
    writer drains whatever has arrived (up to ``max_round`` requests) and runs that round
    in arrival order, handing each caller its own results or exception. With ``group``
    (the default; ``MEMORY_WRITE_QUEUE=each`` turns it off) a round is one
    ``svc.write_group``: the requests run as if one after another, with one embedding call,
    one note commit, one ledger claim and one audit transaction for all of them
    (:mod:`memory_pipelines.writes.group`). Without it each request is its own
    ``svc.write`` (the texts of a round embedded together first). With ``warm`` (the
    default) the writer reads the scopes a round wrote that the injection read cache holds
    again before it answers: the round's clients inject next, all at once, and would otherwise each
    scan their scope at the new table version. The thread is started by
    the first submit and exits after ``idle_seconds`` without work (started again when
    needed); :meth:`close` runs what is queued and stops it. ``stats`` counts requests and
    rounds (drains): requests per round is how much arrived together.
    """

    def __init__(
        self,
        svc: MemoryService,
        *,
        idle_seconds: float = 5.0,
        group: bool | None = None,
        max_round: int = MAX_ROUND,
        warm: bool = True,
    ) -> None:
        self._svc = svc
        self._idle = idle_seconds
        self._group = write_queue_mode() != "each" if group is None else group
        self._max_round = max(1, max_round)
        self._warm = warm
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.stats = {"requests": 0, "rounds": 0, "largest_round": 0}

    def submit(self, ctx: RunContext, writes: Sequence[Any]) -> list[WriteResult]:
        """Run ``svc.write(ctx, writes)`` on the writer thread; its results (or error)."""
        item = _Pending(ctx, writes, Future())
        with self._guard:
            if self._closed:
                raise MemoryPipelineError("the write queue is closed (the server is stopping)")
            self._queue.put(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="memory-writer", daemon=True)
                self._thread.start()
        return item.future.result()

    def _run(self) -> None:
        background_priority()  # request threads (injection) first when both want a core
        while True:
            try:
                first = self._queue.get(timeout=self._idle)
            except queue.Empty:
                with self._guard:  # submit enqueues under this lock: nothing can slip in
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            batch = [first]
            while first is not None and len(batch) < self._max_round:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
                if batch[-1] is None:
                    break
            stop = None in batch  # close() enqueues None after the last request
            self._write([item for item in batch if item is not None])
            if stop:
                with self._guard:
                    self._thread = None
                return

    def _write(self, batch: list[_Pending]) -> None:
        """Run one round: the requests that arrived together."""
        batch = [item for item in batch if item.future.set_running_or_notify_cancel()]
        if not batch:
            return
        self.stats["rounds"] += 1
        self.stats["requests"] += len(batch)
        self.stats["largest_round"] = max(self.stats["largest_round"], len(batch))
        if self._group:
            self._write_group(batch)
            return
        if len(batch) > 1:
            self._embed_round(batch)
        for item in batch:
            try:
                item.future.set_result(self._svc.write(item.ctx, item.writes))
            except BaseException as e:  # handed to the request's own handler
                item.future.set_exception(e)

    def _write_group(self, batch: list[_Pending]) -> None:
        """The round as one group commit; each request gets its own results or error."""
        try:
            outs = self._svc.write_group([(item.ctx, item.writes) for item in batch])
        except BaseException as e:  # the group as a whole failed: every request sees it
            for item in batch:
                item.future.set_exception(e)
            return
        if self._warm:
            self._warm_scopes([i for i, out in zip(batch, outs, strict=True) if isinstance(out, list)])
        for item, out in zip(batch, outs, strict=True):
            if isinstance(out, BaseException):
                item.future.set_exception(out)
            else:
                item.future.set_result(out)

    def _warm_scopes(self, batch: list[_Pending]) -> None:
        """Read the scopes just written that the injection read cache holds (injection
        cached them: they fit) again at the new table version, once each, before the
        writers are answered: their clients inject next, all at once, and would otherwise
        each scan their scope again (the commit made a new version)."""
        seen: set[str] = set()
        for item in batch:
            try:
                ctx = RunContext.model_validate(item.ctx)  # a RunContext or a mapping
                scope = RunScope.of(ctx, self._svc.get_agent(ctx.agent_id))
                cache = read_cache(self._svc.store.notes)
                for where in scope_cells(scope):
                    if where.sql not in seen and cache.holds(where):
                        seen.add(where.sql)
                        cache.rows(where)
            except Exception as e:  # only a cache warm-up: injection reads on its own
                logger.debug("warming the read cache failed: %s", e)

    def _embed_round(self, batch: list[_Pending]) -> None:
        """One embedding call for the round's note texts (the embedding cache, keyed by
        content, then answers each write's own call: same vectors, fewer model calls)."""
        texts: list[str] = []
        for item in batch:
            for request in item.writes if isinstance(item.writes, list) else ():
                valid = validate_request(request, request_fields(request), self._svc.write_config)
                if isinstance(valid, ValidRequest):
                    texts.append(valid.text)
        if len(texts) > 1:
            try:
                self._svc.embed(list(dict.fromkeys(texts)))
            except Exception as e:  # each write embeds (and fails open) on its own
                logger.warning("batched embedding of a write round failed: %s", e)

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new requests, run the queued ones and stop the writer thread."""
        with self._guard:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout)


def write_queue_mode() -> str:
    """``MEMORY_WRITE_QUEUE`` (read when a server starts): ``on``/``group`` (the default)
    runs each drained round as one group commit; ``each`` keeps the writer thread but runs
    the round's requests one by one; ``off``/``0``/``false``/``no`` disables the writer
    (per-run locks in the request threads, whose concurrent ``svc.write`` calls still
    share rounds: :mod:`memory_pipelines.writes.combine`). The last two are ``bench
    load``'s baselines."""
    value = os.environ.get("MEMORY_WRITE_QUEUE", "on").strip().lower()
    if value in ("off", "0", "false", "no"):
        return "off"
    return "each" if value == "each" else "group"


def write_queue_enabled() -> bool:
    """Whether servers route writes through a :class:`WriteQueue` (not ``off``)."""
    return write_queue_mode() != "off"
