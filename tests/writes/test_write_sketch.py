"""The near-duplicate guard's sketch rules rows out before the full comparison, and never
a row that reaches the threshold: with it, the guard finds the same rows with the same
similarities as comparing every row in full."""

from __future__ import annotations

import numpy as np
import pytest

from memory_pipelines import RunContext
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.injection.cache import read_cache
from memory_pipelines.scope.placement import clamp_scope
from memory_pipelines.writes.candidates import CandidatePart, Candidates, fetch_candidates
from memory_pipelines.writes.sketch import (
    SKETCH_AFTER_USES,
    SKETCH_MIN_ROWS,
    Sketch,
    SketchQuery,
    segment_sketch,
)

DIM = 384


def _stored(rng: np.random.Generator, n: int, query: np.ndarray) -> np.ndarray:
    """Random rows (not unit length) with near and exact copies of ``query`` among them,
    rows at the threshold's edge, and a zero row."""
    rows = rng.standard_normal((n, DIM)).astype(np.float32) * rng.uniform(0.5, 3.0, (n, 1))
    for k, noise in enumerate((0.0, 0.05, 0.2, 0.3, 0.4, 0.45, 0.5, 0.8)):
        rows[10 + k] = (query + noise * rng.standard_normal(DIM) / np.sqrt(DIM)) * (k + 1)
    rows[7] = 0.0
    return rows


def _part(rows: np.ndarray, sketch: bool, alive: np.ndarray | None = None) -> CandidatePart:
    ids = [f"n{k}" for k in range(len(rows))]
    norms = np.linalg.norm(rows, axis=1).astype(np.float32)
    return CandidatePart(
        ids,
        {i: k for k, i in enumerate(ids)},
        rows,
        norms,
        np.ones(len(rows), dtype=bool) if alive is None else alive,
        ids,
        Sketch.of(rows, norms) if sketch else None,
    )


def _found(parts: list[CandidatePart], query: np.ndarray, threshold: float):
    return [(at, row.id, sim) for sim, at, row in Candidates(parts).above(query, threshold)]


@pytest.mark.parametrize("threshold", [0.99, 0.92, 0.8, 0.5, 0.0, -1.0])
def test_the_sketch_finds_what_the_full_comparison_finds(threshold):
    rng = np.random.default_rng(5)
    query = rng.standard_normal(DIM).astype(np.float32)
    query /= np.linalg.norm(query)
    rows = _stored(rng, 3000, query)
    alive = rng.random(len(rows)) > 0.1
    alive[10:13] = [True, False, True]  # a dead exact copy is not reported
    full = _found([_part(rows, False, alive)], query, threshold)
    sketched = [_part(rows, True, alive)]
    assert sketched[0].sketch is not None
    found = _found(sketched, query, threshold)
    assert [(at, i) for at, i, _ in found] == [(at, i) for at, i, _ in full]
    assert np.allclose([s for *_, s in found], [s for *_, s in full], atol=1e-6)
    if threshold >= 0.8:
        assert found and "n11" not in {i for _, i, _ in found}


def test_the_sketch_rules_out_nearly_every_unrelated_row():
    rng = np.random.default_rng(6)
    query = rng.standard_normal(DIM).astype(np.float32)
    query /= np.linalg.norm(query)
    rows = _stored(rng, 3000, query)
    part = _part(rows, True)
    possible = part.sketch.possible(SketchQuery.of(query), 0.92)
    # the copies within the threshold pass, and all but a handful of the rest are ruled out
    sims = (rows @ query) / np.maximum(part.norms, 1e-12)
    assert possible[sims >= 0.92].all()
    assert possible.sum() < 20


def test_small_or_short_segments_are_compared_in_full():
    rng = np.random.default_rng(7)
    few = rng.standard_normal((SKETCH_MIN_ROWS - 1, DIM)).astype(np.float32)
    short = rng.standard_normal((SKETCH_MIN_ROWS, 64)).astype(np.float32)
    assert Sketch.of(few, np.linalg.norm(few, axis=1)) is None
    assert Sketch.of(short, np.linalg.norm(short, axis=1)) is None
    assert SketchQuery.of(np.zeros(DIM, dtype=np.float32)) is None


def test_a_segment_gets_its_sketch_once_compared_with_often_enough():
    rng = np.random.default_rng(8)
    rows = rng.standard_normal((SKETCH_MIN_ROWS, DIM)).astype(np.float32)
    norms = np.linalg.norm(rows, axis=1)
    memo: dict = {}
    for _ in range(SKETCH_AFTER_USES - 1):
        assert segment_sketch(memo, rows, norms) is None
    built = segment_sketch(memo, rows, norms)
    assert built is not None and segment_sketch(memo, rows, norms) is built
    small: dict = {}
    for _ in range(SKETCH_AFTER_USES + 1):
        assert segment_sketch(small, rows[:-1], norms[:-1]) is None


def test_a_guarded_write_over_a_large_cached_scope_uses_the_sketch(open_service):
    """End to end: the guard compares writes with a cached scope of more than
    SKETCH_MIN_ROWS notes, through the sketch once it was compared with often enough,
    and dedupes an exact repeat; the read cache counts the sketch as held."""
    svc = open_service(embedder=HashEmbedder(dim=DIM))
    svc.configure_agent("a1")
    texts = [f"User fact number {k} about item {k * 7919 % 1009}." for k in range(2100)]
    svc.add_notes([{"note": t, "agent_id": "a1", "user_id": "u1"} for t in texts])
    ctx = RunContext(agent_id="a1", run_id="r1", user_id="u1")
    held_before = read_cache(svc.store.notes).held_bytes()
    for k in range(SKETCH_AFTER_USES):
        run = RunContext(agent_id="a1", run_id=f"r1-{k}", user_id="u1")
        [first] = svc.write(run, [{"note": f"User likes green tea no. {k}.", "type": "Context"}])
        assert first.disposition == "written"
    cands = fetch_candidates(svc.context, ctx, clamp_scope(ctx, None))
    big = [p for p in cands.parts if len(p.ids) >= SKETCH_MIN_ROWS]
    assert big and all(p.sketch is not None for p in big)
    assert read_cache(svc.store.notes).held_bytes() >= held_before + big[0].sketch.nbytes
    [repeat] = svc.write(
        RunContext(agent_id="a1", run_id="r2", user_id="u1"),
        [{"note": texts[500], "type": "Context"}],
    )
    assert repeat.disposition == "deduped"
    assert svc.get_note(repeat.note_id).note == texts[500]
