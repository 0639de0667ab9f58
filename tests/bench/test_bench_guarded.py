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
    assert 0 < out["anon_first"] < out["rss_first"] and 0 < out["anon_end"] < out["rss_end"]
    # the caches: Lance's metadata of the versions written, the user's scope read for
    # the near-duplicate guard (12 rows of 384-d vectors: more than 12 x 1.5 KB)
    assert out["lance_end"] > 0 and out["read_end"] > 12 * 384 * 4 / 2**20
    # the file system's own cost, probed beside each raw add_note
    assert out["files_first"] > 0 and out["files_last"] > 0


def test_the_file_probe_creates_three_files_and_deletes_them_when_old(tmp_path, monkeypatch):
    probe = guarded.FileProbe(tmp_path / "probe")
    assert probe.probe() > 0
    made = sorted(p.stat().st_size for p in (tmp_path / "probe").iterdir())
    assert made == sorted(guarded.FileProbe.SIZES)
    monkeypatch.setattr(guarded.FileProbe, "KEEP_S", 0.0)
    probe.probe()  # the first three are now old: deleted before the next three are made
    assert len(list((tmp_path / "probe").iterdir())) == 3


def test_bench_guarded_is_a_listed_benchmark(capsys):
    assert "guarded" in cli.BENCHMARKS
    assert cli.main(["bench", "guarded", "--writes", "8", "--raw-every", "2"]) == 0
    out = capsys.readouterr().out
    assert "last/first p50" in out and "guarded/raw p50" in out and "load average" in out
    assert "written 8" in out
    assert "bounded caches: Lance" in out and "anonymous" in out
    assert "the file system alone: 3 file creations" in out


def test_repeats_report_medians_and_each_run(capsys):
    assert cli.main(["bench", "guarded", "--writes", "6", "--raw-every", "2", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 run(s)" in out
    per_run = next(line for line in out.splitlines() if line.startswith("per run: "))
    assert per_run.count("file creations") == 2 and per_run.count("x (first 3 at") == 2
