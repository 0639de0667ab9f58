"""``bench locomo --cv`` with a grid: each fold's choice, and each grid field alone."""

from __future__ import annotations

import json
from dataclasses import replace

from test_injection import locomo_sample

from memory_pipelines.bench import locomo
from memory_pipelines.config import InjectConfig


def test_axes_keep_the_settings_that_vary_one_field():
    base = InjectConfig()
    grid = locomo._grid(["session_weight=0,0.5", "text_weight=0.6,0.7"], base)
    assert [name for name, _ in grid] == [
        "session_weight=0 text_weight=0.7",
        "session_weight=0.5 text_weight=0.6",
        "session_weight=0.5 text_weight=0.7",
    ]
    assert locomo._axes(grid, base) == {
        "text_weight": ["session_weight=0 text_weight=0.7"],
        "session_weight": ["session_weight=0.5 text_weight=0.6"],
    }
    assert dict(grid)["session_weight=0.5 text_weight=0.6"] == replace(base, session_weight=0.5)


def test_cv_grid_prints_folds_and_each_field_alone(tmp_path, capsys):
    path = tmp_path / "tiny_locomo.json"
    path.write_text(
        json.dumps(
            [locomo_sample("conv-x", "Pixel", "Zion"), locomo_sample("conv-y", "Mochi", "Yosemite")]
        )
    )
    args = ["--data", str(path), "--k", "1", "5", "--embedder", "hash", "--cv"]
    args += ["--cv-grid", "session_weight=0,0.5", "--cv-grid", "entity_weight=0,0.5"]
    assert locomo.main(args) == 0
    out = capsys.readouterr().out
    assert "3 setting(s) to choose from" not in out and "4 setting(s) to choose from" in out
    assert "validate conv-x" in out and "validate conv-y" in out
    assert "each field alone" in out and "defaults only" in out
    assert "session_weight " in out.split("each field alone")[1]
    assert "entity_weight " in out.split("each field alone")[1]


def _result(per_conv: dict[str, dict[str, list[bool]]]) -> locomo.LocomoResult:
    """A result whose methods hit (True) or miss each conversation's questions at k=5."""
    methods = []
    for name, convs in per_conv.items():
        m = locomo.MethodResult(name)
        for sid, hits in convs.items():
            for ok in hits:
                m.add(4, ["D1:1"] if ok else ["D9:9"], ["D1:1"], (5,), sid)
        methods.append(m)
    return locomo.LocomoResult((5,), methods, {4: 1}, [], 0, 0, 0.0)


def test_nested_choice_never_sees_the_held_out_conversation():
    # "tuned" wins only on conv-c; on the others the defaults win.
    res = _result(
        {
            "inject (hybrid)": {"conv-a": [True, True], "conv-b": [True, False], "conv-c": [False]},
            "inject [tuned]": {"conv-a": [True, False], "conv-b": [False, False], "conv-c": [True]},
        }
    )
    nested = locomo.nested_cross_validate(res, ["inject (hybrid)", "inject [tuned]"])
    by = {f.held_out: f for f in nested}
    assert by["conv-c"].chosen == "inject (hybrid)"  # chosen on a and b, not on c
    assert by["conv-c"].outer_any[5] == 0.0
    # held out a: on b and c, tuned scores (0 + 1) / 2 against (0.5 + 0) / 2
    assert by["conv-a"].chosen == "inject [tuned]"
    assert by["conv-a"].outer_any[5] == 0.5 and by["conv-a"].inner_choice_recall == 0.5
    # the inner folds score the choice procedure one level down
    assert 0.0 <= by["conv-a"].inner_estimate <= 1.0
    assert not any(f.read_while_writing for f in nested)


def test_nested_folds_flag_conversations_read_while_writing():
    res = _result({"inject (hybrid)": {"conv-26": [True], "conv-x": [False]}})
    nested = locomo.nested_cross_validate(res, ["inject (hybrid)"], read={"conv-26"})
    assert {f.held_out: f.read_while_writing for f in nested} == {"conv-26": True, "conv-x": False}
    assert "conv-26 (read)" in locomo.nested_table(nested, (5,))


def test_cv_states_the_nested_protocol(tmp_path, capsys):
    path = tmp_path / "tiny_locomo.json"
    path.write_text(
        json.dumps(
            [locomo_sample("conv-26", "Pixel", "Zion"), locomo_sample("conv-y", "Mochi", "Yosemite")]
        )
    )
    args = ["--data", str(path), "--k", "5", "--embedder", "hash", "--cv"]
    assert locomo.main(args + ["--cv-grid", "session_cap=0,1"]) == 0
    out = capsys.readouterr().out
    assert "nested leave-one-conversation-out" in out
    assert "conv-26 (read)" in out and "not a held-out figure" in out
    assert "nested outer mean recall_any@5" in out


def test_nested_cv_with_one_conversation_says_so(tmp_path, capsys):
    import pytest

    from memory_pipelines.errors import ValidationError

    res = _result({"inject (hybrid)": {"conv-a": [True]}})
    with pytest.raises(ValidationError, match="at least 2 conversations"):
        locomo.nested_cross_validate(res, ["inject (hybrid)"])
    path = tmp_path / "one.json"
    path.write_text(json.dumps([locomo_sample("conv-x", "Pixel", "Zion")]))
    assert locomo.main(["--data", str(path), "--k", "5", "--embedder", "hash", "--cv"]) == 0
    assert "needs at least 2 conversations, got 1" in capsys.readouterr().out
