"""``bench bulk``: the bulk path and the embedder alone on the same texts, in one run."""

from __future__ import annotations

from memory_pipelines.apps import cli
from memory_pipelines.bench import bulk


def test_measure_reports_both_paths_and_their_ratio():
    out = bulk.measure(n=30, runs=2, single=5, use_hash=True)
    assert out["n"] == 30 and out["single_n"] == 5
    assert out["embed_per_s"] > 0 and out["bulk_per_s"] > 0 and out["single_per_s"] > 0
    assert out["ratio"] > 0


def test_bench_bulk_is_a_listed_benchmark(capsys):
    assert "bulk" in cli.BENCHMARKS
    assert cli.main(["bench", "bulk", "--n", "12", "--runs", "1", "--single", "0", "--hash"]) == 0
    out = capsys.readouterr().out
    assert "svc.add_notes" in out and "load average" in out and "target >= 0.90" in out
