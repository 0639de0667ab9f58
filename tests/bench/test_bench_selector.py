"""The learned extraction selector: logistic regression fitted and tuned inside nested
leave-one-conversation-out folds, never on the held-out conversation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from memory_pipelines.bench import extraction, selector
from memory_pipelines.embeddings import HashEmbedder


def _turns(sid: str, seed: int, n: int = 40, flip: bool = False) -> selector.Turns:
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.4
    x = rng.normal(0, 1, (n, 5))
    x[:, 0] += np.where(y, 2.0, -2.0)  # one informative feature
    covers = np.zeros((n, n), dtype=bool)
    covers[np.arange(n), np.arange(n)] = y  # each positive turn is one observation's evidence
    covers = covers[:, y]
    return selector.Turns(sid, x, ~y if flip else y, covers, int(y.sum()))


def test_fit_separates_an_informative_feature():
    t = _turns("a", 1, n=200)
    w = selector.fit(t.x, t.y, c=1.0)
    acc = ((selector.predict(w, t.x) >= 0.5) == t.y).mean()
    assert acc > 0.95 and abs(w[0]) > max(abs(w[1:5]))


def test_nested_selector_recall_and_precision_on_held_out_conversations():
    folds = selector.nested_selector([_turns(s, i) for i, s in enumerate("abcd")], 0.6)
    assert [f.held_out for f in folds] == list("abcd")
    for f in folds:
        recall, precision = f.validation
        assert recall > 0.8 and precision > 0.8
        assert f.c in selector.C_GRID and f.threshold in selector.THRESHOLDS
    assert "outer recall" in selector.selector_table(folds)


def test_the_held_out_labels_never_reach_the_choice():
    base = [_turns(s, i) for i, s in enumerate("abcd")]
    poisoned = base[:3] + [_turns("d", 3, flip=True)]
    a = {f.held_out: (f.c, f.threshold, f.inner) for f in selector.nested_selector(base, 0.6)}
    b = {f.held_out: (f.c, f.threshold, f.inner) for f in selector.nested_selector(poisoned, 0.6)}
    assert a["d"] == b["d"]  # d's own labels changed nothing in d's fold
    assert a["a"] != b["a"]  # but they are training data for the others


def test_empty_conversation_features():
    assert selector.features([], HashEmbedder(16)).shape == (0, 17)


def test_bench_extraction_selector_flag_runs_end_to_end(tmp_path, capsys):
    from test_bench_extraction import SAMPLE

    data = tmp_path / "synth.json"
    data.write_text(json.dumps([{**SAMPLE, "sample_id": f"s{i}"} for i in range(3)]))
    args = ["--data", str(data), "--embedder", "hash", "--selector"]
    assert extraction.main(args) == 0
    out = capsys.readouterr().out
    assert "learned selector" in out and "selector outer: mean recall" in out


def _three(tmp_path):
    from test_bench_extraction import SAMPLE

    data = tmp_path / "synth.json"
    data.write_text(json.dumps([{**SAMPLE, "sample_id": f"s{i}"} for i in range(3)]))
    return data


def test_fit_selector_writes_weights_the_judge_loads(tmp_path, capsys):
    from memory_pipelines.judge import OfflineJudge
    from memory_pipelines.judge import selector as judge_selector

    out = tmp_path / "weights.json"
    args = ["--data", str(_three(tmp_path)), "--embedder", "hash", "--fit-selector", str(out)]
    assert extraction.main(args) == 0
    assert "turn selector for hash-64" in capsys.readouterr().out
    loaded = judge_selector.load(out)
    assert loaded.model_id == "hash-64" and loaded.dim == 64
    assert loaded.meta["fitted_on"] == ["s0", "s1", "s2"]
    assert loaded.threshold in selector.THRESHOLDS
    judge = OfflineJudge(HashEmbedder(64), selector=loaded)
    assert judge.selector is loaded and loaded.applies_to(HashEmbedder(64))


def test_out_of_fold_selectors_never_train_on_their_conversation():
    emb = HashEmbedder(4)  # 4 + 1 features, as _turns makes
    per = selector.out_of_fold([_turns(s, i) for i, s in enumerate("abcd")], emb, 0.6)
    assert set(per) == set("abcd")
    for sid, s in per.items():
        assert sid not in s.meta["fitted_on"] and len(s.meta["fitted_on"]) == 3
        assert s.model_id == emb.model_id and s.weights.shape == (emb.dim + 2,)


def test_turn_selector_with_another_embedder_is_the_rules(tmp_path, capsys):
    assert extraction.main(["--data", str(_three(tmp_path)), "--embedder", "hash"]) == 0
    assert "rules: no selector for hash-64" in capsys.readouterr().out


@pytest.mark.slow  # loads MiniLM in the command and runs 6 Memory Manager cycles
@pytest.mark.parametrize("mode", ["folds", "shipped"])
def test_bench_extraction_with_the_turn_selector_and_minilm(tmp_path, capsys, mode):
    assert extraction.main(["--data", str(_three(tmp_path)), "--turn-selector", mode]) == 0
    out = capsys.readouterr().out
    if mode == "folds":
        assert "turn selector fitted and tuned without the held-out conversation" in out
        assert all(f"s{i} 0." in out for i in range(3))  # one threshold per conversation
    else:
        assert "the shipped turn selector" in out
    assert "| all " in out
