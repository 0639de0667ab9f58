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
