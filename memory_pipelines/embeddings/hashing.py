"""A deterministic feature-hashing embedder: cheap and NOT semantic (tests, benchmarks)."""

from __future__ import annotations

import hashlib
import re

import numpy as np

from memory_pipelines.embeddings.protocol import l2_normalize

_WORD = re.compile(r"\w+", re.UNICODE)


class HashEmbedder:
    """Deterministic, cheap feature-hashing embedder. NOT semantic: tests and benchmarks only.

    Lowercase word tokens (and, by default, character trigrams of each word at half
    weight) are hashed with blake2b (stable across processes, unlike ``hash()``) into
    ``dim`` signed buckets; rows are L2-normalised. Texts with no word characters map to
    one fixed feature so every row still has unit norm. Only shared words/spellings raise
    cosine; paraphrases with different words look unrelated.
    """

    def __init__(self, dim: int = 64, char_trigrams: bool = True) -> None:
        """Configure the width and whether character trigrams are added."""
        if dim < 1:
            raise ValueError("dim must be >= 1")
        self.dim = int(dim)
        self.char_trigrams = char_trigrams
        self.model_id = f"hash-{dim}" if char_trigrams else f"hash-{dim}-words"

    def _features(self, text: str) -> list[tuple[str, float]]:
        words = _WORD.findall(text.lower())
        feats = [("w:" + w, 1.0) for w in words]
        if self.char_trigrams:
            for w in words:
                padded = f"#{w}#"
                feats += [("c:" + padded[i : i + 3], 0.5) for i in range(len(padded) - 2)]
        return feats or [("<empty>", 1.0)]

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``; return float32 (n, dim) with unit-norm rows."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feat, weight in self._features(text):
                h = int.from_bytes(hashlib.blake2b(feat.encode(), digest_size=8).digest(), "big")
                out[row, (h >> 1) % self.dim] += weight if h & 1 else -weight
        return l2_normalize(out)
