"""Progress bars on stderr: forced on, forced off, and auto (off when stderr is not a TTY),
through the helper and through ``memory-pipelines bench locomo`` on a tiny file."""

import json

import pytest
from test_injection import locomo_sample

from memory_pipelines.apps.progress import progress, progress_enabled
from memory_pipelines.bench import locomo


def _args(path) -> list[str]:
    return ["--data", str(path), "--k", "1", "5", "--embedder", "hash"]


@pytest.fixture
def tiny_locomo(tmp_path):
    path = tmp_path / "tiny_locomo.json"
    path.write_text(
        json.dumps(
            [locomo_sample("conv-x", "Pixel", "Zion"), locomo_sample("conv-y", "Mochi", "Yosemite")]
        )
    )
    return path


def test_helper_forced_on_off_and_auto(capsys):
    assert list(progress(range(3), desc="counting", enabled=True)) == [0, 1, 2]
    err = capsys.readouterr().err
    assert "counting" in err and "100%" in err and "3/3" in err
    assert list(progress(iter(range(3)), desc="quiet", enabled=False)) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    assert progress_enabled(None) is False  # capsys' stderr is not a terminal
    assert list(progress(range(2), desc="auto")) == [0, 1]
    assert capsys.readouterr().err == ""


def test_locomo_bench_bars_when_forced(tiny_locomo, capsys):
    assert locomo.main([*_args(tiny_locomo), "--progress"]) == 0
    captured = capsys.readouterr()
    assert "locomo: load notes" in captured.err and "100%" in captured.err
    assert "locomo: conv-x questions" in captured.err
    assert "locomo:" not in captured.out and "inject (hybrid)" in captured.out


@pytest.mark.parametrize("flag", [["--no-progress"], []])
def test_locomo_bench_without_bars(tiny_locomo, capsys, flag):
    assert locomo.main([*_args(tiny_locomo), *flag]) == 0
    captured = capsys.readouterr()
    assert "locomo: load notes" not in captured.err and "100%" not in captured.err
    assert "loaded conv-x" in captured.err  # the plain progress lines remain
    assert "inject (hybrid)" in captured.out
