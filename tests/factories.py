"""Test doubles shared by several test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import numpy as np

from memory_pipelines.embeddings import HashEmbedder


class CountingEmbedder:
    """A hashing embedder that records every batch of texts it is asked to embed."""

    def __init__(self, dim: int = 16, model_id: str = "counting") -> None:
        self.dim = dim
        self.model_id = model_id
        self.inner = HashEmbedder(dim)
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return self.inner.embed(texts)

    @property
    def seen(self) -> list[str]:
        """Every text embedded, in order."""
        return [t for call in self.calls for t in call]
