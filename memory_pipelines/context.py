"""MemoryContext: what every behaviour module receives instead of the service facade.

A small frozen value: the note store, the SQL sources, the notebook (stamp, embed, save),
the judge, the service clock and the settings. Writes, injection, explain, purge and the
Memory Manager phases take one of these as their first argument, so nothing below
``service.py`` imports it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from memory_pipelines.config import InjectConfig, MaintenanceConfig, ManagerConfig, WriteConfig
from memory_pipelines.embeddings import Embedder
from memory_pipelines.judge import Judge
from memory_pipelines.notebook import Notebook
from memory_pipelines.sources import Sources
from memory_pipelines.store import NoteStore


@dataclass(frozen=True)
class MemoryContext:
    """The store, sources, notebook, judge, clock and settings of one memory home."""

    store: NoteStore
    sources: Sources
    notebook: Notebook
    judge: Judge
    clock: Callable[[], datetime]
    write_config: WriteConfig = field(default_factory=WriteConfig)
    inject_config: InjectConfig = field(default_factory=InjectConfig)
    maintenance_config: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    manager_config: ManagerConfig = field(default_factory=ManagerConfig)
    home: Path | None = None

    @property
    def embedder(self) -> Embedder:
        return self.notebook.embedder

    def now(self) -> datetime:
        """The service clock (aware UTC)."""
        return self.clock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts through the notebook's cached embedder (``EmbeddingError`` on failure)."""
        return self.notebook.embed(texts)
