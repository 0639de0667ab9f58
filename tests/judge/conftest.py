"""Fixtures of the judge tests."""

from __future__ import annotations

import pytest

from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.judge import OfflineJudge


@pytest.fixture
def judge() -> OfflineJudge:
    """The offline judge over the cheap hashing embedder."""
    return OfflineJudge(HashEmbedder(dim=64))
