"""``bench memory``: RSS over open / fill / inject / close cycles, and what outlives them."""

from __future__ import annotations

from memory_pipelines.apps import cli
from memory_pipelines.bench import memory


def test_measure_cycles_leave_no_service_or_thread_behind():
    out = memory.measure(cycles=3, notes=5)
    assert out["cycles"] == 3 and out["rss_first_mb"] > 0 and out["rss_last_mb"] > 0
    assert out["services_alive"] == 0
    assert out["threads_left"] == []


def test_bench_memory_is_a_listed_benchmark(capsys):
    assert "memory" in cli.BENCHMARKS
    assert cli.main(["bench", "memory", "--cycles", "2", "--notes", "3"]) == 0
    out = capsys.readouterr().out
    assert "RSS after the last cycle" in out and "closed services still reachable: 0" in out
    assert "load average" in out
