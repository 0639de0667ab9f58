"""Hosted or local embedding models through ``litellm.embedding`` (OpenAI, Ollama, ...)."""

from __future__ import annotations

from typing import Any

import numpy as np

from memory_pipelines.embeddings.protocol import l2_normalize
from memory_pipelines.errors import EmbeddingError
from memory_pipelines.litellm_loader import import_litellm


class LiteLLMEmbedder:
    """Hosted or local embedding models through ``litellm.embedding``.

    ``model`` is a litellm model string such as ``openai/text-embedding-3-small`` or
    ``ollama/nomic-embed-text``; extra keyword arguments (``api_base``, ``api_key``,
    ``dimensions``, ``num_retries`` ...) pass through. ``dim`` is discovered from the first
    response when not given (or from a ``dimensions`` keyword), then fixed; a response of
    another width is an error. Reading ``dim`` before any call sends one probe text (note
    that on Python 3.11 ``isinstance(x, Embedder)`` reads it); pass ``dim`` to avoid that.
    """

    def __init__(
        self,
        model: str,
        dim: int | None = None,
        batch_size: int = 128,
        timeout: float = 30,
        **litellm_kwargs: Any,
    ) -> None:
        """Store the settings; litellm is imported on the first call."""
        self.model = model
        self.model_id = model
        self._dim = dim if dim is not None else litellm_kwargs.get("dimensions")
        self.batch_size = int(batch_size)
        self.timeout = timeout
        self.litellm_kwargs = litellm_kwargs

    @property
    def dim(self) -> int:
        """Vector width; when unknown, one short probe text is embedded to learn it."""
        if self._dim is None:
            self.embed(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` in batches of ``batch_size``; errors become ``EmbeddingError``."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            litellm = import_litellm()
        except ImportError as e:  # pragma: no cover - litellm is a dependency
            raise EmbeddingError("litellm is not installed") from e
        parts = []
        for start in range(0, len(texts), self.batch_size):
            # Most APIs reject empty strings: send a single space instead.
            batch = [t if t.strip() else " " for t in texts[start : start + self.batch_size]]
            try:
                resp = litellm.embedding(
                    model=self.model, input=batch, timeout=self.timeout, **self.litellm_kwargs
                )
                parts.append(self._parse(resp, len(batch)))
            except EmbeddingError:
                raise
            except Exception as e:
                raise EmbeddingError(f"embedding with {self.model} failed: {e}") from e
        return np.concatenate(parts)

    def _parse(self, resp: Any, n: int) -> np.ndarray:
        data = resp["data"] if isinstance(resp, dict) else resp.data
        rows = []
        for pos, item in enumerate(data):
            get = item.get if isinstance(item, dict) else lambda k, d=None, i=item: getattr(i, k, d)
            index = get("index")
            rows.append((pos if index is None else int(index), get("embedding")))
        rows.sort(key=lambda r: r[0])
        try:
            vecs = np.asarray([r[1] for r in rows], dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise EmbeddingError(f"{self.model} returned malformed embeddings") from e
        if vecs.ndim != 2 or vecs.shape[0] != n or vecs.shape[1] == 0:
            raise EmbeddingError(f"{self.model} returned shape {vecs.shape} for {n} texts")
        if self._dim is None:
            self._dim = int(vecs.shape[1])
        elif vecs.shape[1] != self._dim:
            raise EmbeddingError(f"{self.model} returned dim {vecs.shape[1]}, expected {self._dim}")
        return l2_normalize(vecs)
