"""Picking an embedder by name or environment: MiniLM (cached), hashing or litellm."""

from __future__ import annotations

import os
from pathlib import Path

from memory_pipelines.embeddings.cache import CachedEmbedder
from memory_pipelines.embeddings.fetch import (
    MINILM_MODEL_ID,
    MODEL_FILES,
    SETUP_HINT,
    _has_model_files,
    ensure_model,
)
from memory_pipelines.embeddings.hashing import HashEmbedder
from memory_pipelines.embeddings.litellm import LiteLLMEmbedder
from memory_pipelines.embeddings.minilm import MiniLMEmbedder
from memory_pipelines.embeddings.protocol import Embedder
from memory_pipelines.errors import EmbeddingModelMissingError


def default_embedder(cache_path: Path | str | None = None) -> CachedEmbedder:
    """Return the default embedder: cached offline MiniLM."""
    return CachedEmbedder(MiniLMEmbedder(), cache_path)


def embedder_from_env(cache_path: Path | str | None = None) -> Embedder:
    """Pick the embedder named by ``$MEMORY_EMBEDDING_MODEL``.

    Unset, ``default`` or ``all-MiniLM-L6-v2``: :func:`default_embedder`. ``hash``: a
    :class:`HashEmbedder` (not semantic). Anything else is a litellm model string wrapped
    in a :class:`CachedEmbedder`; ``$MEMORY_EMBEDDING_DIM`` then gives its width (else it
    is probed with one call when first needed).
    """
    dim = os.environ.get("MEMORY_EMBEDDING_DIM", "").strip()
    return embedder_from_name(
        os.environ.get("MEMORY_EMBEDDING_MODEL", ""), cache_path, int(dim) if dim else None
    )


def embedder_from_name(
    name: str, cache_path: Path | str | None = None, dim: int | None = None
) -> Embedder:
    """Pick an embedder by name, as :func:`embedder_from_env` does for the variable.

    ``default`` or ``all-MiniLM-L6-v2``: :func:`default_embedder`. ``hash`` (or
    ``hash:DIM`` for another width than 64): a
    :class:`HashEmbedder` (not semantic). Anything else is a litellm embedding model
    wrapped in a :class:`CachedEmbedder` (``dim`` optional; probed when first needed).
    Used where configuration names the model explicitly (the Dagster resource).
    """
    key = name.strip().lower()
    if key in ("", "default", MINILM_MODEL_ID.lower()):
        return default_embedder(cache_path)
    if key == "hash":
        return HashEmbedder()
    if key.startswith("hash:") and key[5:].isdigit() and int(key[5:]) > 0:
        return HashEmbedder(int(key[5:]))  # "hash:384": a hashing embedder of that width
    return CachedEmbedder(LiteLLMEmbedder(name.strip(), dim=dim), cache_path)


def ensure_embedder_model(embedder: Embedder) -> None:
    """Make sure the model files an offline MiniLM embedder (bare or cached) will load are on
    disk: the default folder's are fetched once, loudly, when missing (see
    :func:`~memory_pipelines.embeddings.fetch.ensure_model`); a folder given to the
    embedder must hold them. Raises :class:`EmbeddingModelMissingError` otherwise; other
    embedders need nothing."""
    inner = getattr(embedder, "inner", embedder)
    if not isinstance(inner, MiniLMEmbedder) or inner.loaded:
        return
    if inner.configured_path is None:
        ensure_model()
    elif not _has_model_files(inner.configured_path):
        raise EmbeddingModelMissingError(
            f"MiniLM model files {list(MODEL_FILES)} not found in {inner.configured_path}; "
            f"{SETUP_HINT} with --dest {inner.configured_path}"
        )


def embedder_problem(embedder: Embedder) -> str | None:
    """Why ``embedder`` cannot embed right now (its MiniLM files are gone and it has not
    loaded them yet), or None: what a health check reports."""
    inner = getattr(embedder, "inner", embedder)
    if isinstance(inner, MiniLMEmbedder) and not inner.loaded and not _has_model_files(inner.path):
        return f"the embedding model's files {list(MODEL_FILES)} are missing in {inner.path}"
    return None
