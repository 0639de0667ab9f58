"""Test doubles shared by several test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import numpy as np
from sqlalchemy import insert

from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.judge import ConsolidationDecision, ContradictionDecision
from memory_pipelines.service import MemoryService
from memory_pipelines.sources import injection_events


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


#: the dimension of the hand-made vectors below
DIM = 64


def direction(seed: int) -> np.ndarray:
    """A random unit vector of ``DIM`` dimensions (reproducible from ``seed``)."""
    v = np.random.default_rng(seed).normal(size=DIM)
    return v / np.linalg.norm(v)


def near(base: np.ndarray, seed: int, spread: float = 0.3) -> np.ndarray:
    """A paraphrase-like neighbour: cosine ~ 1/sqrt(1 + spread^2) to ``base``."""
    u = direction(10_000 + seed)
    u = u - (u @ base) * base
    v = base + spread * u / np.linalg.norm(u)
    return v / np.linalg.norm(v)


class RecordingJudge:
    """Merges every cluster it is shown; in a pair the newer note wins."""

    name = "recording"

    def __init__(self, contradiction: bool = True):
        self.clusters: list[tuple[list[str], bool]] = []
        self.pairs: list[tuple[str, str]] = []
        self.contradiction = contradiction

    def synthesize_cluster(self, notes, *, anchored):
        self.clusters.append(([n.id for n in notes], anchored))
        return ConsolidationDecision(
            should_consolidate=True,
            content="Merged: " + "; ".join(n.note for n in notes),
            type="Context",
            reason="same topic",
        )

    def detect_contradiction(self, a, b):
        self.pairs.append((a.id, b.id))
        if not self.contradiction:
            return ContradictionDecision(is_contradiction=False, reason="complementary")
        newer, older = (a, b) if (a.created_at, a.id) >= (b.created_at, b.id) else (b, a)
        return ContradictionDecision(
            is_contradiction=True,
            contradiction_type="temporal_supersession",
            keep_note_id=newer.id,
            revoke_note_id=older.id,
            reason="the newer note wins",
            entity_triples=(("user", "drink", "tea"), ("user", "drink", "coffee")),
        )


def add_events(svc: MemoryService, items: list[tuple[str, str]], when) -> None:
    """Record injection events of ``(item_kind, item_id)`` at ``when`` (what inject does)."""
    with svc.sources.begin() as c:
        for kind, item_id in items:
            c.execute(
                insert(injection_events).values(
                    run_id="r",
                    agent_id="helper",
                    item_kind=kind,
                    item_id=item_id,
                    rank=1,
                    injected_at=when,
                )
            )


#: the scope of the agent-written provisional note the Dagster tests seed
ALICE_NOTE = dict(
    status="Provisional", author_type="Agent", agent_id="helper", user_id="alice", company_id="acme"
)


def seed_acme(svc: MemoryService, *, reply: bool = True) -> None:
    """Company ``acme``, its user ``alice``, the agent ``helper`` and conversation ``c1``
    holding a user message rated 9 (and the assistant's reply unless ``reply=False``)."""
    svc.add_company("acme")
    svc.add_user("alice", "acme")
    svc.configure_agent("helper")
    svc.add_conversation("c1", "helper", "alice", "acme")
    svc.add_message("c1", "m1", "user", "I prefer green tea over coffee.", rating=9)
    if reply:
        svc.add_message("c1", "m2", "assistant", "Noted: green tea it is.")
