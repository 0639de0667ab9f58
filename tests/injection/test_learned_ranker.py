"""The learned ranker: its features, its weights file and its place in ``inject``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memory_pipelines.config import InjectConfig
from memory_pipelines.embeddings.minilm import MINILM_MODEL_ID
from memory_pipelines.errors import ConfigError, MemoryPipelineError
from memory_pipelines.injection import learned
from memory_pipelines.injection.fusion import Candidate
from memory_pipelines.injection.learned import FEATURES, LearnedRanker, features, ranker_for
from memory_pipelines.notes import RunContext

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class _Item:
    id: str
    created_at: datetime


def _cand(
    i: str,
    text: str,
    *,
    score=1.0,
    base=1.0,
    cos=None,
    bm=None,
    vr=None,
    tr=None,
    boost=0.0,
    days=0,
) -> Candidate:
    return Candidate(
        item=_Item(i, NOW - timedelta(days=days)),
        text=text,
        cosine=cos,
        bm25=bm,
        score=score,
        base=base,
        boost=boost,
        vector_rank=vr,
        text_rank=tr,
    )


def _column(x: np.ndarray, name: str) -> np.ndarray:
    return x[:, FEATURES.index(name)]


def _ranker(model_id: str = "test", mmr_lambda: float = 1.0, **weights: float) -> LearnedRanker:
    w = np.zeros(len(FEATURES))
    for name, value in weights.items():
        w[FEATURES.index(name)] = value
    return LearnedRanker(
        w, 0.0, np.zeros(len(FEATURES)), np.ones(len(FEATURES)), model_id, mmr_lambda
    )


def test_features_read_the_fusion_signals_and_the_text():
    cands = [
        _cand(
            "a",
            "Ann adopted a cat named Pixel.",
            score=2.0,
            base=1.0,
            cos=0.6,
            bm=4.0,
            vr=0,
            tr=0,
            boost=0.5,
            days=3,
        ),
        _cand("b", "Did Ann adopt a dog?", score=1.0, base=1.0, cos=0.2, vr=1, days=1),
        _cand("c", "Lovely weather today.", score=0.5, base=0.5, bm=2.0, tr=1, days=2),
    ]
    x = features("What cat did Ann adopt?", cands)
    assert x.shape == (3, len(FEATURES))
    assert _column(x, "fused").tolist() == [1.0, 0.5, 0.25]
    assert _column(x, "cosine").tolist() == [0.6, 0.2, 0.0]
    assert _column(x, "cosine_gap").tolist() == pytest.approx([0.0, -0.4, -0.6])
    assert _column(x, "bm25").tolist() == [1.0, 0.0, 0.5]
    assert _column(x, "vector_place").tolist() == [1.0, 0.5, 0.0]
    assert _column(x, "text_place").tolist() == [1.0, 0.0, 0.5]
    assert _column(x, "both_lists").tolist() == [1.0, 0.0, 0.0]
    # the context share: what the fused score holds beyond base * (1 + cue)
    assert _column(x, "context").tolist() == pytest.approx([0.5, 0.0, 0.0])
    assert _column(x, "coverage")[0] > _column(x, "coverage")[2] == 0.0
    assert _column(x, "question").tolist() == [0.0, 1.0, 0.0]
    assert _column(x, "age_place").tolist() == [1.0, 0.0, 0.5]  # newest 0, oldest 1
    assert features("anything", []).shape == (0, len(FEATURES))


def test_a_missing_or_degenerate_signal_reads_as_zero():
    cands = [
        _cand("a", "cat", cos=float("nan"), bm=float("inf"), tr=0),
        _cand("b", "dog", cos=0.5, bm=1.0, vr=0),
    ]
    x = features("cat", cands)
    assert np.isfinite(x).all()
    assert [c.item.id for c in _ranker(coverage=1.0).rank("cat", cands)] == ["a", "b"]


def test_rank_reorders_by_probability_and_leaves_the_input_alone():
    cands = [
        _cand("old", "the cat sat", score=1.0, days=5),
        _cand("new", "the cat sat again", score=0.9, days=1),
    ]
    ranked = _ranker(age_place=-5.0).rank("cat", cands)
    assert [c.item.id for c in ranked] == ["new", "old"]
    assert all(0.0 < c.score < 1.0 for c in ranked)
    assert [c.score for c in cands] == [1.0, 0.9]  # copies, not the caller's candidates
    assert ranked[0].text == "the cat sat again" and ranked[0].vector_rank is None


def test_the_weights_file_round_trips_and_bad_ones_are_refused():
    r = _ranker(model_id="m", mmr_lambda=0.7, coverage=1.5)
    back = LearnedRanker.from_json(r.to_json())
    assert back.model_id == "m" and back.mmr_lambda == 0.7
    assert back.weights.tolist() == r.weights.tolist()
    good = json.loads(r.to_json())
    bad = [
        {**good, "features": good["features"][:-1]},
        {**good, "weights": good["weights"][:-1]},
        {**good, "scale": [0.0] * len(FEATURES)},
        {**good, "mmr_lambda": 2},
        {k: v for k, v in good.items() if k != "bias"},
    ]
    for data in bad:
        with pytest.raises(ConfigError, match="learned ranker"):
            LearnedRanker.from_json(json.dumps(data))
    with pytest.raises(MemoryPipelineError):
        LearnedRanker.from_json("not json")


def test_the_shipped_ranker_is_for_minilm_and_can_be_turned_off():
    shipped = learned.shipped()
    assert shipped.model_id == MINILM_MODEL_ID
    assert 0.0 <= shipped.mmr_lambda <= 1.0
    assert set(shipped.meta["fitted_on"]) >= {"conv-26", "conv-30"}
    assert ranker_for(True, MINILM_MODEL_ID) is shipped
    assert ranker_for(False, MINILM_MODEL_ID) is None
    assert ranker_for(True, "hash-64") is None and ranker_for(True, None) is None


def _two_matches(svc) -> RunContext:
    svc.configure_agent("agent", note_injection_strategy="Relevant", max_notes_to_inject=1)
    ctx = RunContext(agent_id="agent", user_id="u1")
    old = svc.clock() - timedelta(days=30)
    svc.add_note(
        "the user keeps bees in the garden, bees", agent_id="agent", user_id="u1", created_at=old
    )
    svc.add_note("the user keeps bees", agent_id="agent", user_id="u1")
    return ctx


def _first(svc, ctx, query: str) -> str:
    return svc.inject(ctx, query).notes[0].note


@pytest.mark.parametrize("cached", [True, False])
def test_inject_applies_the_ranker_for_its_embedder_only(open_service, monkeypatch, cached):
    svc = open_service()
    if not cached:
        monkeypatch.setattr(
            "memory_pipelines.injection.retrieval.cached_scope", lambda table, scope: None
        )
    ctx = _two_matches(svc)
    fused = _first(svc, ctx, "bees in the garden")
    assert fused.endswith("garden, bees")
    # a ranker that prefers the newest note, fitted (say) for this embedder
    newest = _ranker(model_id=svc.embedder.model_id, age_place=-10.0)
    monkeypatch.setattr(learned, "_SHIPPED", [newest])
    assert _first(svc, ctx, "bees in the garden") == "the user keeps bees"
    svc.inject_config = InjectConfig(learned_ranker=False)
    assert _first(svc, ctx, "bees in the garden") == fused
    # fitted for another embedder: the fused order stays
    svc.inject_config = InjectConfig()
    monkeypatch.setattr(learned, "_SHIPPED", [_ranker(model_id="other", age_place=-10.0)])
    assert _first(svc, ctx, "bees in the garden") == fused


def test_inject_records_the_fused_candidates_before_the_ranker(svc, monkeypatch):
    ctx = _two_matches(svc)
    monkeypatch.setattr(learned, "_SHIPPED", [_ranker(model_id=svc.embedder.model_id)])
    with learned.recorded_pools() as pools:
        svc.inject(ctx, "bees in the garden")
    assert len(pools) == 1
    query, cands = pools[0]
    assert query == "bees in the garden"
    assert [c.text for c in cands][0].endswith("garden, bees")
    assert all(c.score >= 1.0 or c.score < 1.0 for c in cands)  # fused scores, any scale
    assert cands[0].base > 0 and cands[0].text_rank is not None
    svc.inject(ctx, "bees")
    assert len(pools) == 1  # nothing recorded outside the block
