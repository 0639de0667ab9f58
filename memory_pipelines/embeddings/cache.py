"""A content-hash cache around any embedder: unchanged text is never embedded twice.

Keys are ``sha256(model_id + "\\x00" + text)``, in an in-memory LRU and optionally in a
SQLite file several processes may share.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from memory_pipelines.embeddings.protocol import Embedder
from memory_pipelines.errors import EmbeddingError
from memory_pipelines.retries import SQLITE_LOCKED

#: keys per DELETE statement (SQLite's bound-parameter limit is 999)
_FORGET_CHUNK = 400


def retry_locked(step: Callable[[], object], seconds: float = 30.0) -> None:
    """Run ``step``, again while SQLite answers "database is locked" (up to ``seconds``):
    switching a new file to WAL can be refused at once, without the busy timeout, while
    another connection (of this or another process) is switching the same file."""
    SQLITE_LOCKED.with_seconds(seconds).call(step)


class CachedEmbedder:
    """Content-hash cache around another embedder: unchanged text is never embedded twice.

    Key ``sha256(model_id + "\\x00" + text)``. An in-memory LRU of ``max_memory_items``
    vectors, plus (when ``path`` is given) a SQLite file in WAL mode that several processes
    may share (``INSERT OR IGNORE``; first writer wins, all writers hold equal vectors).
    ``embed`` dedupes its input, looks every text up, and embeds only the misses in one
    call to the inner embedder. ``hits``/``misses`` count distinct texts per call.
    """

    def __init__(
        self, inner: Embedder, path: Path | str | None = None, max_memory_items: int = 100_000
    ) -> None:
        """Wrap ``inner``; the SQLite file (if any) is opened on first use."""
        self.inner = inner
        self.path = Path(path) if path is not None else None
        self.max_memory_items = int(max_memory_items)
        self.hits = 0
        self.misses = 0
        self._mem: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._conn_pid = 0

    @property
    def model_id(self) -> str:
        """The inner embedder's model id."""
        return self.inner.model_id

    @property
    def dim(self) -> int:
        """The inner embedder's vector width."""
        return self.inner.dim

    def key(self, text: str) -> str:
        """Return the cache key of ``text`` for the inner model."""
        raw = f"{self.model_id}\x00{text}".encode("utf-8", "surrogatepass")
        return hashlib.sha256(raw).hexdigest()

    def _db(self) -> sqlite3.Connection:
        if self._conn is None or self._conn_pid != os.getpid():  # reopen after fork
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=60, check_same_thread=False)
            retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL"))
            conn.execute("PRAGMA synchronous=NORMAL")

            def create() -> None:
                with conn:
                    conn.execute(
                        "CREATE TABLE IF NOT EXISTS embeddings"
                        " (key TEXT PRIMARY KEY, vec BLOB NOT NULL)"
                    )

            retry_locked(create)
            self._conn, self._conn_pid = conn, os.getpid()
        return self._conn

    def _remember(self, key: str, vec: np.ndarray) -> None:
        self._mem[key] = vec
        self._mem.move_to_end(key)
        while len(self._mem) > self.max_memory_items:
            self._mem.popitem(last=False)

    def _lookup(self, keys: list[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for k in keys:
                vec = self._mem.get(k)
                if vec is not None:
                    self._mem.move_to_end(k)
                    found[k] = vec
            rest = [k for k in keys if k not in found]
            if self.path is None or not rest:
                return found
            db, width = self._db(), self.dim * 4
            for start in range(0, len(rest), 500):
                chunk = rest[start : start + 500]
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT key, vec FROM embeddings WHERE key IN ({marks})"
                for k, blob in db.execute(sql, chunk):
                    if len(blob) == width:  # ignore rows of another width
                        found[k] = np.frombuffer(blob, dtype=np.float32).copy()
                        self._remember(k, found[k])
        return found

    def _store(self, pairs: list[tuple[str, np.ndarray]]) -> None:
        with self._lock:
            for k, vec in pairs:
                self._remember(k, vec)
            if self.path is not None and pairs:
                db = self._db()
                with db:
                    db.executemany(
                        "INSERT OR IGNORE INTO embeddings (key, vec) VALUES (?, ?)",
                        [(k, v.astype(np.float32).tobytes()) for k, v in pairs],
                    )

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` via the cache; only distinct, unseen texts reach the inner model."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        keys = {t: self.key(t) for t in unique}
        found = self._lookup(list(keys.values()))
        todo = [t for t in unique if keys[t] not in found]
        if todo:
            vecs = np.asarray(self.inner.embed(todo), dtype=np.float32)
            if vecs.shape != (len(todo), self.dim):
                raise EmbeddingError(f"inner embedder returned {vecs.shape} for {len(todo)} texts")
            pairs = [(keys[t], vecs[i].copy()) for i, t in enumerate(todo)]
            self._store(pairs)
            found.update(pairs)
        with self._lock:
            self.hits += len(unique) - len(todo)
            self.misses += len(todo)
        return np.stack([found[keys[t]] for t in texts]).astype(np.float32, copy=False)

    def close(self) -> None:
        """Close the SQLite connection (the cache reopens it if used again)."""
        with self._lock:
            if self._conn is not None and self._conn_pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __enter__(self) -> CachedEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def forget(self, texts: Sequence[str]) -> int:
        """Delete the cache entries (memory and SQLite file) of these texts and vacuum the
        file, so an erased text cannot be read back from the cache; returns rows removed."""
        if not texts:
            return 0
        keys = list(dict.fromkeys(self.key(t) for t in texts))
        removed = 0
        with self._lock:
            for k in keys:
                self._mem.pop(k, None)
            if self.path is not None and self.path.exists():
                db = self._db()
                with db:
                    for start in range(0, len(keys), _FORGET_CHUNK):
                        chunk = keys[start : start + _FORGET_CHUNK]
                        marks = ",".join("?" * len(chunk))
                        removed += db.execute(
                            f"DELETE FROM embeddings WHERE key IN ({marks})", chunk
                        ).rowcount
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                db.execute("VACUUM")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return removed
