"""The cosine similarity injection ranks by: a scope's cached vectors against the query,
rounded as LanceDB's own search reports it, so the cached path and LanceDB's rank alike."""

from __future__ import annotations

import numpy as np

from memory_pipelines.blas import single_blas_thread


def cosine_similarities(vectors: np.ndarray, norms: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``vectors`` (with their ``norms``) to ``query``,
    rounded as LanceDB reports it (``1 - float32 cosine distance``)."""
    q = np.asarray(query, dtype=np.float32)
    qn = np.float32(np.linalg.norm(q))
    with single_blas_thread():  # one thread: OpenBLAS's spinning workers took a core
        dots = vectors @ q
    denom = norms * qn
    cos = np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)
    distance = (np.float32(1.0) - cos).astype(np.float32)
    return 1.0 - distance.astype(np.float64)
