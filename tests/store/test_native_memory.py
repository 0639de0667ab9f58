"""A long-lived writer's native memory: every commit is a new table version, and LanceDB and
pylance cache each version's manifest and file metadata in their sessions (1 GiB of
metadata and 6 GiB of index pages each, left to themselves), so a writer grew by ~130 KB a
write. The store gives both libraries sessions bounded by its
:class:`~memory_pipelines.config.TableTuning`; these tests hold the bound over real
LanceDB single writes, and (slow) the resident size of a writer over thousands of them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from memory_pipelines.config import TableTuning
from memory_pipelines.errors import ConfigError
from memory_pipelines.notes import Note
from memory_pipelines.store import EXAMPLES_TABLE, NOTES_TABLE, NoteStore

DIM = 8
MIB = 2**20
ROOT = Path(__file__).resolve().parents[2]


def _single_writes(store: NoteStore, n: int) -> None:
    """``n`` single appends, each checked against the stored ids first and read back, as
    the write path does, and counted through LanceDB, as its searches read: every one a
    new version that both sessions see (appends go through pylance's, LanceDB's sees
    the version at its next read)."""
    t = store.notes
    for i in range(n):
        v = np.zeros(DIM, dtype=np.float32)
        v[i % DIM] = 1.0
        t.put([Note(id=f"n{i}", note=f"note {i}", agent_id="a", user_id="u")], v[None, :])
        assert t.existing_ids([f"n{i}"]) == {f"n{i}"}
        assert t.lance.count_rows() == i + 1


def test_the_default_bounds_are_far_below_the_libraries_own():
    tuning = TableTuning()
    assert tuning.metadata_cache_bytes == 8 * MIB and tuning.index_cache_bytes == 128 * MIB
    with pytest.raises(ConfigError):
        TableTuning(metadata_cache_bytes=-1)
    with pytest.raises(ConfigError):
        TableTuning(index_cache_bytes=-1)


def test_the_home_caches_stay_within_their_bounds_over_single_writes(tmp_path):
    """The same 60 single writes into a store with 256 KiB bounds and into one with the
    defaults: the defaults' caches pass 1 MiB (so the bound below can fail), the bounded
    ones stay under it."""
    writes = 60
    bound = TableTuning(metadata_cache_bytes=MIB // 4, index_cache_bytes=MIB // 4)
    small = NoteStore(str(tmp_path / "small"), DIM, compact_every=0, tuning=bound)
    usual = NoteStore(str(tmp_path / "usual"), DIM, compact_every=0)
    try:
        _single_writes(small, writes)
        _single_writes(usual, writes)
        small_bytes, usual_bytes = small.cache_bytes(), usual.cache_bytes()
    finally:
        small.close()
        usual.close()
    assert set(small_bytes) == {"lancedb", NOTES_TABLE, EXAMPLES_TABLE}
    # both caches took every version's metadata under the defaults ...
    assert usual_bytes["lancedb"] > MIB and usual_bytes[NOTES_TABLE] > MIB, usual_bytes
    # ... and keep within metadata + index bound (Lance's own estimate, a little slack)
    for name in ("lancedb", NOTES_TABLE):
        assert small_bytes[name] <= MIB // 2 * 1.1, small_bytes


def test_close_drops_the_dataset_session_and_a_later_read_opens_a_fresh_one(tmp_path):
    store = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0)
    _single_writes(store, 5)
    assert store.notes.dataset_cache_bytes() > 0
    store.close()
    assert store.notes.dataset_cache_bytes() == 0
    assert store.notes.existing_ids(["n1", "zz"]) == {"n1"}  # reads still work after close
    assert store.notes.dataset_cache_bytes() > 0
    store.close()


WRITER = textwrap.dedent(
    """
    import sys, tempfile
    from pathlib import Path
    from memory_pipelines.bench.memory import rss_mb
    from memory_pipelines.embeddings import HashEmbedder
    from memory_pipelines.notes import RunContext
    from memory_pipelines.service import MemoryService

    writes, first = int(sys.argv[1]), int(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        svc = MemoryService.open(Path(tmp) / "home", embedder=HashEmbedder(384))
        svc.configure_agent("a")
        for i in range(writes):
            ctx = RunContext(agent_id="a", run_id=f"r-{i}", user_id="u")
            svc.write(ctx, [{"note": f"Fact {i}: the user likes colour {i} best", "type": "Context"}])
            if i + 1 == first:
                at_first = rss_mb()
        print(at_first, rss_mb(), svc.store.cache_bytes()["lancedb"])
        svc.close()
    """
)


@pytest.mark.slow
def test_a_long_lived_writer_stops_growing_once_its_caches_are_full():
    """3,000 guarded single writes in a fresh process. Before the bounds its resident
    size grew ~130 KB a write: +198 MB from the 1,500th write to the 3,000th; with them
    the metadata caches are full by then and it grew +40 to +62 MB (the index caches still
    filling, and allocator noise). The margin sits between the two."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", WRITER, "3000", "1500"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800, check=True,
    )  # fmt: skip
    at_first, at_end, lancedb_bytes = (float(x) for x in out.stdout.split()[-3:])
    assert lancedb_bytes <= (32 + 128) * MIB * 1.1
    assert at_end - at_first < 120, (at_first, at_end)


def test_closing_a_store_trims_the_c_heap_where_the_process_runs_on_glibc(tmp_path, monkeypatch):
    import platform

    from memory_pipelines.store import native_memory

    on_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert native_memory.trim_native_heap() is on_glibc
    calls = []
    monkeypatch.setattr(
        "memory_pipelines.store.trim_native_heap", lambda: calls.append(1) or on_glibc
    )
    store = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0)
    _single_writes(store, 2)
    store.close()
    assert calls == [1]


HEAP_PROBE = textwrap.dedent(
    """
    import ctypes, sys
    from memory_pipelines.store import NoteStore

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    store = NoteStore(sys.argv[1], 8, compact_every=0)
    libc.free(libc.malloc(8 * 2**20))  # glibc's own threshold would rise to 8 MiB here
    mapped = libc.mallinfo2().hblkhd
    block = libc.malloc(2 * 2**20)
    print(libc.mallinfo2().hblkhd - mapped)
    libc.free(block)
    store.close()
    """
)


def _mapped_by_a_2_mib_block(tmp_path, **env) -> int:
    """Bytes glibc mapped for a 2 MiB allocation made after an 8 MiB one was freed, in a
    fresh process that opened a store (its environment plus ``env``)."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    run_env.update(env, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", HEAP_PROBE, str(tmp_path / f"lance-{len(env)}")],
        capture_output=True, text=True, env=run_env, cwd=ROOT, timeout=300, check=True,
    )  # fmt: skip
    return int(out.stdout.split()[-1])


def _glibc_version() -> tuple[int, ...]:
    if sys.platform != "linux":
        return ()
    try:
        name, _, version = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")
    except (ValueError, OSError):
        return ()
    return tuple(int(x) for x in version.split(".")[:2]) if name == "glibc" else ()


@pytest.mark.skipif(_glibc_version() < (2, 33), reason="glibc >= 2.33 only (mallinfo2)")
def test_opening_a_store_holds_the_mmap_threshold_unless_the_host_chose_one(tmp_path):
    """After a large block is freed, glibc would serve a smaller large one from a heap
    arena, where a long-lived writer's arenas fragment: with the store open, a 2 MiB block
    still gets its own mapping (given back whole when freed). A threshold set by the host
    through the environment stands: there the same block comes from the arena."""
    assert _mapped_by_a_2_mib_block(tmp_path) >= 2 * MIB
    assert _mapped_by_a_2_mib_block(tmp_path, MALLOC_MMAP_THRESHOLD_="4194304") == 0


def test_hold_mmap_threshold_leaves_glibc_alone_when_asked_or_when_the_host_chose(monkeypatch):
    import platform

    from memory_pipelines.store import native_memory

    on_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert native_memory.hold_mmap_threshold(TableTuning().mmap_threshold_bytes) is on_glibc
    assert native_memory.hold_mmap_threshold(0) is False
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert native_memory.hold_mmap_threshold(2**20) is False
    with pytest.raises(ConfigError):
        TableTuning(mmap_threshold_bytes=-1)


def test_a_store_opens_with_its_tunings_threshold(tmp_path, monkeypatch):
    held = []
    monkeypatch.setattr("memory_pipelines.store.hold_mmap_threshold", held.append)
    NoteStore(str(tmp_path / "a"), DIM, compact_every=0).close()
    NoteStore(
        str(tmp_path / "b"), DIM, compact_every=0, tuning=TableTuning(mmap_threshold_bytes=0)
    ).close()
    assert held == [2**20, 0]
