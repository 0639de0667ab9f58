"""``bench ranker``: fitting the learned ranker and its nested protocol."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_injection import locomo_sample

from memory_pipelines.bench import locomo, ranker_cv
from memory_pipelines.bench import ranker as bench_ranker
from memory_pipelines.errors import MemoryPipelineError
from memory_pipelines.injection import learned
from memory_pipelines.injection.learned import FEATURES


def _pool(sample: str, n_pos: int, seed: int) -> list[ranker_cv.Pool]:
    """Questions whose evidence has the larger 'coverage' while the fused score points
    elsewhere: a ranker can learn it, the fused order cannot."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(n_pos):
        n = 8
        x = rng.normal(size=(n, len(FEATURES))) * 0.1
        y = np.zeros(n)
        y[q % n] = 1.0
        x[:, FEATURES.index("coverage")] += y
        fused = np.linspace(1.0, 0.1, n)
        out.append(
            ranker_cv.Pool(
                sample,
                4,
                x,
                y,
                frozenset({f"{sample}:{q}"}),
                [frozenset({f"{sample}:{q}"}) if y[i] else frozenset({f"o{i}"}) for i in range(n)],
                [f"text {q} {i} {'w' * i}" for i in range(n)],
                [float(i) for i in range(n)],
                [f"{sample}-{q}-{i}" for i in range(n)],
                fused,
            )
        )
    return out


def test_fit_ranker_learns_a_separating_feature_and_refuses_one_class():
    pools = _pool("a", 16, 1) + _pool("b", 16, 2)
    r = ranker_cv.fit_ranker(pools, 0.01, "m")
    assert r.weights[FEATURES.index("coverage")] > 0
    assert ranker_cv.recall(pools, 1, 1.0, r) == (1.0, 1.0)
    assert ranker_cv.recall(pools, 1, 1.0, None)[0] < 0.5
    only_negative = [ranker_cv.Pool(**{**p.__dict__, "y": p.y * 0}) for p in pools]
    with pytest.raises(MemoryPipelineError, match="both evidence and other"):
        ranker_cv.fit_ranker(only_negative, 0.01, "m")


def test_nested_ranker_chooses_on_inner_folds_only(monkeypatch):
    views = {"locomo": _pool("a", 8, 1) + _pool("b", 8, 2) + _pool("c", 8, 3)}
    seen: list[list[str]] = []
    choose = ranker_cv.choose

    def spy(split, samples, model_id, k):
        seen.append(list(samples))
        return choose(split, samples, model_id, k)

    monkeypatch.setattr(ranker_cv, "choose", spy)
    folds = ranker_cv.nested_ranker(views, "m", (1,))
    assert [f.held_out for f in folds] == ["a", "b", "c"]
    assert seen == [["b", "c"], ["a", "c"], ["a", "b"]]
    assert all(f.learned["locomo"][1][0] == 1.0 for f in folds)
    assert "mean (protocol estimate)" in ranker_cv.ranker_table(folds, (1,))
    with pytest.raises(MemoryPipelineError, match="at least 3 conversations"):
        ranker_cv.nested_ranker({"locomo": _pool("a", 4, 1) + _pool("b", 4, 2)}, "m")


@pytest.fixture
def data(tmp_path):
    """A LoCoMo-format file of three tiny conversations (the fewest the protocol takes)."""
    path = tmp_path / "tiny_locomo.json"
    samples = [
        locomo_sample("conv-x", "Pixel", "Zion"),
        locomo_sample("conv-y", "Mochi", "Yosemite"),
        locomo_sample("conv-z", "Biscuit", "Arches"),
    ]
    path.write_text(json.dumps(samples))
    return path


def test_bench_ranker_runs_end_to_end_and_writes_a_loadable_ranker(tmp_path, capsys, data):
    out_path = tmp_path / "ranker.json"
    args = ["--data", str(data), "--embedder", "hash", "--k", "1", "5", "--fit", str(out_path)]
    assert bench_ranker.main(args) == 0
    out = capsys.readouterr().out
    assert "nested leave-one-conversation-out" in out
    for sample in ("conv-x", "conv-y", "conv-z"):
        assert sample in out
    assert "mean (protocol estimate)" in out and "learned any@1" in out
    fitted = learned.load(out_path)
    assert fitted.model_id == "hash-64"
    assert fitted.meta["fitted_on"] == ["conv-x", "conv-y", "conv-z"]


def test_locomo_cv_reports_the_ranker_refitted_per_outer_fold(capsys, minilm, data):
    assert locomo.main(["--data", str(data), "--k", "1", "5", "--cv"]) == 0
    out = capsys.readouterr().out
    assert "for it every fold is read" in out
    ranker_part = out.split("learned ranker, nested leave-one-conversation-out on both views")[1]
    for view in ("locomo", "chat"):
        assert "| mean (protocol estimate) |" in ranker_part and f"| {view} " in ranker_part
    for sample in ("conv-x", "conv-y", "conv-z"):
        assert sample in ranker_part


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--k", "0"], "--k takes positive numbers"),
        (["--fit", "/no/such/folder/ranker.json"], "--fit: no folder"),
    ],
)
def test_bench_ranker_refuses_bad_arguments_before_any_work(tmp_path, capsys, extra, message):
    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps([locomo_sample("conv-x", "Pixel", "Zion")]))
    with pytest.raises(SystemExit) as e:
        bench_ranker.main(["--data", str(data), "--embedder", "hash", *extra])
    assert e.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_ranker.main(["--data", str(tmp_path / "missing.json"), "--embedder", "hash"])
    assert "--data: no file" in capsys.readouterr().err
