"""The embedder protocol: ``model_id``, ``dim`` and ``embed(texts)`` with unit-norm rows.

Every embedder returns ``float32`` arrays of shape ``(n, dim)`` with L2-normalised rows, so
a dot product is a cosine similarity; :func:`l2_normalize` is the one normalisation they
share.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into L2-normalised float32 vectors of a fixed width."""

    model_id: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return a float32 array of shape ``(len(texts), dim)`` with unit-norm rows."""
        ...


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Return ``x`` (2-D) as float32 with each row scaled to unit L2 norm (zero rows stay 0)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
