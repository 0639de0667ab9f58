"""``bench guarded``: single guarded writes, first vs last stretch, beside a raw add_note."""

from __future__ import annotations

from memory_pipelines.apps import cli
from memory_pipelines.bench import guarded


def test_a_run_measures_both_stretches_and_the_raw_baseline():
    out = guarded.run_once(writes=12, raw_every=3, embedder_name="hash", say=lambda _: None)
    assert out["stretch"] == 6
    assert out["dispositions"] == {"written": 12}  # each write a new fact in a new run
    assert out["first"][0] > 0 and out["last"][0] > 0 and out["raw_p50"] > 0
    assert out["flat"] == out["last"][0] / out["first"][0]
    assert out["vs_raw"] == out["guarded_p50"] / out["raw_p50"]
    assert out["rss_first"] > 0 and out["rss_end"] > 0


def test_bench_guarded_is_a_listed_benchmark(capsys):
    assert "guarded" in cli.BENCHMARKS
    assert cli.main(["bench", "guarded", "--writes", "8", "--raw-every", "2"]) == 0
    out = capsys.readouterr().out
    assert "last/first p50" in out and "guarded/raw p50" in out and "load average" in out
    assert "written 8" in out
