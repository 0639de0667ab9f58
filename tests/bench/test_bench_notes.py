"""``memory-pipelines bench notes`` runs end to end at a tiny size."""

from __future__ import annotations

from memory_pipelines.apps import cli


def test_bench_notes_prints_every_case(capsys):
    assert cli.main(["bench", "notes", "--size", "400", "--limit", "20", "--repeats", "2", "--dim", "16"]) == 0
    out = capsys.readouterr().out
    for case in ("no filter", "agent filter", "user filter", "q search", "page 5 via cursor"):
        assert case in out
    assert "p95 ms" in out
