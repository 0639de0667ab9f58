"""The guarded write over a day of single writes: does it stay flat, and what does it cost
beside a raw ``add_note``?

``memory-pipelines bench guarded [--writes 10000] [--raw-every 5] [--embedder hash|minilm]
[--repeats 1]``

What an agent does all day, through the public API: ``--writes`` single ``svc.write``
calls into one fresh home, each a new run of one agent for one user, each one new fact
(its text embedded beforehand, so the embedding cache answers and the model is out of the
picture). After every ``--raw-every``-th write, one raw ``svc.add_note`` of a similar text
for another user of the agent, into the same table, is timed as the baseline of the same
moment. Reported:

* the guarded write's p50/p95 over the first and the last thousand writes and the ratio
  of their medians (flat: at most 1.3);
* the raw ``add_note`` p50 over the same stretches and over the whole run, and the
  guarded/raw ratio of the medians (at most 2);
* the process's resident size (RSS) after the first thousand writes and at the end (a
  writer's size flat after its first thousand writes), and its anonymous part (what the
  process allocated; the rest is pages of mapped files, mostly the libraries' code, which
  grows once as new code paths first run, such as the id index's build at 1,000 notes);
* what the home's bounded caches hold at both moments (Lance's metadata and index pages,
  and the injection read cache's rows and vectors), so the growth they account for can
  be told from the rest;
* the file system's own cost at the same moments: beside each raw ``add_note``, three
  small files (the sizes of an append's data file, transaction and manifest) are created
  in a folder beside the home and deleted once five seconds old, as the cleanup of old
  versions does, and the creation is timed. On some file systems this cost steps up once
  the first deleted files pile up (ext4 without a journal skips recently freed inodes when
  it allocates one), which makes the first thousand writes look cheaper than the day that
  follows; this figure shows that step apart from the service's work;
* how the writes were disposed of (written, deduped ...) and the machine's load average.

With ``--repeats R`` the whole run is made R times over a fresh home each: every figure
is the median of the runs' own figures. The homes are made in the temporary directory
(``TMPDIR``): with ``TMPDIR=/dev/shm`` (a file system in memory) the figures leave out
what the disk's file system costs, each append creating three files and the cleanup of
old versions deleting them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tabulate import tabulate

from memory_pipelines.bench.embed import make_sentences
from memory_pipelines.bench.memory import anon_rss_mb, rss_mb

AGENT = "agent-g"
USER = "u-writer"
RAW_USER = "u-raw"
DIM = 384
STRETCH = 1_000


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


#: the sizes taken after the first stretch and at the end (each reported as ``<name>_first``
#: and ``<name>_end``)
SIZES = ("rss", "anon", "lance", "read")


def _sizes_mb(svc) -> dict[str, float]:
    """MB: the process's resident size (``rss``) and its anonymous part (``anon``), what
    the home's Lance caches hold (``lance``, all three) and the note table's read cache
    (``read``)."""
    from memory_pipelines.injection.cache import read_cache

    return {
        "rss": rss_mb(),
        "anon": anon_rss_mb(),
        "lance": sum(svc.store.cache_bytes().values()) / 2**20,
        "read": read_cache(svc.store.notes).held_bytes() / 2**20,
    }


class FileProbe:
    """Times the creation of three small files, as an append makes (data file,
    transaction, manifest), in ``folder``; files older than :attr:`KEEP_S` are deleted at
    the next probe, as the cleanup of old versions deletes an append's files."""

    SIZES = (6_000, 300, 2_000)
    KEEP_S = 5.0

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir()
        self._made: list[tuple[float, Path]] = []
        self._count = 0

    def probe(self) -> float:
        """Milliseconds for the three creations (the deletions are not timed)."""
        now = time.monotonic()
        while self._made and now - self._made[0][0] > self.KEEP_S:
            self._made.pop(0)[1].unlink(missing_ok=True)
        paths = []
        t0 = time.perf_counter()
        for size in self.SIZES:
            path = self.folder / f"{self._count}-{size}"
            self._count += 1
            with open(path, "wb") as f:
                f.write(b"\0" * size)
            paths.append(path)
        ms = (time.perf_counter() - t0) * 1000
        self._made.extend((now, path) for path in paths)
        return ms


def run_once(writes: int, raw_every: int, embedder_name: str, say=print) -> dict:
    """One run over a fresh home: the figures of the module notes."""
    from memory_pipelines.embeddings import HashEmbedder, MiniLMEmbedder
    from memory_pipelines.notes import NoteType, RunContext
    from memory_pipelines.service import MemoryService

    embedder = MiniLMEmbedder() if embedder_name == "minilm" else HashEmbedder(DIM)
    stretch = min(STRETCH, max(1, writes // 2))
    texts = [f"Fact {i}: {t}" for i, t in enumerate(make_sentences(writes, seed=11))]
    n_raw = writes // raw_every if raw_every > 0 else 0
    raws = [f"Raw {i}: {t}" for i, t in enumerate(make_sentences(max(n_raw, 1), seed=12))]
    guarded: list[float] = []
    raw: list[tuple[int, float]] = []  # (writes done before it, ms)
    files: list[tuple[int, float]] = []  # (writes done before it, ms): the file system's own
    dispositions: Counter[str] = Counter()
    sizes_first = dict.fromkeys(SIZES, float("nan"))
    with tempfile.TemporaryDirectory(prefix="guarded-bench-") as tmp:
        svc = MemoryService.open(Path(tmp) / "home", embedder=embedder)
        file_probe = FileProbe(Path(tmp) / "file-probe")
        try:
            svc.configure_agent(AGENT)
            for start in range(0, len(texts), 512):  # the model out of the loop
                svc.embed(texts[start : start + 512])
            for start in range(0, len(raws), 512):
                svc.embed(raws[start : start + 512])
            for i, text in enumerate(texts):
                ctx = RunContext(agent_id=AGENT, run_id=f"guarded-{i}", user_id=USER)
                t0 = time.perf_counter()
                [result] = svc.write(ctx, [{"note": text, "type": "Context"}])
                guarded.append((time.perf_counter() - t0) * 1000)
                dispositions[result.disposition] += 1
                if raw_every > 0 and (i + 1) % raw_every == 0 and len(raw) < n_raw:
                    t0 = time.perf_counter()
                    svc.add_note(
                        raws[len(raw)], type=NoteType.CONTEXT, agent_id=AGENT, user_id=RAW_USER
                    )
                    raw.append((i + 1, (time.perf_counter() - t0) * 1000))
                    files.append((i + 1, file_probe.probe()))
                if i + 1 == stretch:
                    sizes_first = _sizes_mb(svc)
                if (i + 1) % 1000 == 0:
                    say(
                        f"  {i + 1} writes: last 1000 p50 {statistics.median(guarded[-1000:]):.1f}"
                        f" ms, RSS {rss_mb():.0f} MB (anonymous {anon_rss_mb():.0f}),"
                        f" load {_load()}"
                    )
            sizes_end = _sizes_mb(svc)
        finally:
            svc.close()
    first, last = guarded[:stretch], guarded[-stretch:]
    raw_first = [ms for done, ms in raw if done <= stretch]
    raw_last = [ms for done, ms in raw if done > writes - stretch]
    raw_all = [ms for _, ms in raw]
    files_first = [ms for done, ms in files if done <= stretch]
    files_last = [ms for done, ms in files if done > writes - stretch]
    return {
        "stretch": stretch,
        "first": (_pct(first, 50), _pct(first, 95)),
        "last": (_pct(last, 50), _pct(last, 95)),
        "flat": _pct(last, 50) / _pct(first, 50),
        "guarded_p50": _pct(guarded, 50),
        "raw_first": _pct(raw_first, 50),
        "raw_last": _pct(raw_last, 50),
        "raw_p50": _pct(raw_all, 50),
        "vs_raw": _pct(guarded, 50) / _pct(raw_all, 50),
        "vs_raw_last": _pct(last, 50) / _pct(raw_last, 50),
        "files_first": _pct(files_first, 50),
        "files_last": _pct(files_last, 50),
        **{f"{name}_first": mb for name, mb in sizes_first.items()},
        **{f"{name}_end": mb for name, mb in sizes_end.items()},
        "dispositions": dict(dispositions),
        "embedder": embedder.model_id,
    }


def combine(runs: Sequence[dict]) -> dict:
    """The median of each figure over the runs (ratios: the median of each run's own)."""
    out = dict(runs[-1])
    for key in (
        "flat", "guarded_p50", "raw_first", "raw_last", "raw_p50", "vs_raw", "vs_raw_last",
        "files_first", "files_last",
        *(f"{name}_{when}" for name in SIZES for when in ("first", "end")),
    ):  # fmt: skip
        out[key] = statistics.median(r[key] for r in runs)
    for key in ("first", "last"):
        out[key] = tuple(statistics.median(r[key][i] for r in runs) for i in (0, 1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench guarded", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--writes", type=int, default=10_000, help="single svc.write calls")
    parser.add_argument(
        "--raw-every", type=int, default=5, help="one raw add_note after every N writes (0: none)"
    )
    parser.add_argument("--embedder", choices=("hash", "minilm"), default="hash")
    parser.add_argument("--repeats", type=int, default=1, help="runs over a fresh home (medians)")
    args = parser.parse_args(argv)
    if args.writes < 2:
        parser.error("--writes must be at least 2")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    load_before = _load()
    runs = []
    for repeat in range(args.repeats):
        print(f"guarded: run {repeat + 1}/{args.repeats}", file=sys.stderr)
        runs.append(
            run_once(
                args.writes,
                args.raw_every,
                args.embedder,
                say=lambda msg: print(msg, file=sys.stderr),
            )
        )
    r = combine(runs)
    s = r["stretch"]
    print(
        f"guarded: {args.writes:,} single svc.write calls (a new run each, one user, texts "
        f"embedded beforehand), embedder {r['embedder']}, {args.repeats} run(s); "
        f"load average {load_before} before, {_load()} after"
    )
    print(
        tabulate(
            [
                [
                    f"first {s:,}",
                    f"{r['first'][0]:.1f} / {r['first'][1]:.1f}",
                    f"{r['raw_first']:.1f}",
                    f"{r['files_first']:.2f}",
                    f"{r['rss_first']:.0f} / {r['anon_first']:.0f}",
                ],
                [
                    f"last {s:,}",
                    f"{r['last'][0]:.1f} / {r['last'][1]:.1f}",
                    f"{r['raw_last']:.1f}",
                    f"{r['files_last']:.2f}",
                    f"{r['rss_end']:.0f} / {r['anon_end']:.0f}",
                ],
            ],
            headers=[
                "writes",
                "guarded p50 / p95 ms",
                "raw add_note p50 ms",
                "3 file creations p50 ms",
                "RSS / anonymous MB after",
            ],
        )
    )
    print(
        f"last/first p50: {r['flat']:.2f}x (target <= 1.3); guarded/raw p50: "
        f"{r['guarded_p50']:.1f} / {r['raw_p50']:.1f} ms = {r['vs_raw']:.2f}x over the run, "
        f"{r['vs_raw_last']:.2f}x over the last {s:,} (target <= 2); RSS "
        f"{r['rss_end'] - r['rss_first']:+.0f} MB (anonymous "
        f"{r['anon_end'] - r['anon_first']:+.0f} MB) after the first {s:,} writes"
    )
    print(
        f"bounded caches: Lance {r['lance_first']:.0f} -> {r['lance_end']:.0f} MB, "
        f"read cache {r['read_first']:.0f} -> {r['read_end']:.0f} MB "
        f"({r['lance_end'] + r['read_end'] - r['lance_first'] - r['read_first']:+.0f} MB "
        "over the same writes)"
    )
    print(
        f"the file system alone: 3 file creations p50 {r['files_first']:.2f} -> "
        f"{r['files_last']:.2f} ms ({r['files_last'] / r['files_first']:.2f}x), beside each "
        "raw add_note in a folder next to the home"
    )
    if len(runs) > 1:
        print(
            "per run: "
            + "; ".join(
                f"{run['flat']:.2f}x (first {s:,} at {run['first'][0]:.1f} ms, file creations "
                f"{run['files_first']:.2f} -> {run['files_last']:.2f} ms)"
                for run in runs
            )
        )
    print("dispositions (last run): " + ", ".join(f"{k} {v}" for k, v in r["dispositions"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
