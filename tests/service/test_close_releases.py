"""``close()`` releases what ``open()`` took: once a closed service is unreferenced, it,
its store and its tables are garbage (no module-level cache or background thread keeps
them), and no thread of its is left running."""

from __future__ import annotations

import gc
import threading
import weakref

from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.service import MemoryService


def _compact_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("compact-")]


def _used_home(path, clock) -> MemoryService:
    svc = MemoryService.open(path, embedder=HashEmbedder(dim=32), clock=clock)
    svc.configure_agent("a")
    for table in (svc.store.notes, svc.store.examples):
        table.compact_every = 2  # the background compactor runs during the fill
    for i in range(12):
        svc.add_note(f"note {i} about tea", agent_id="a", user_id="u")
    svc.add_example("a", "question", "answer")
    svc.add_example("a", "question 2", "answer 2")
    svc.store.notes.wait_for_compaction()
    svc.inject({"agent_id": "a", "user_id": "u", "run_id": "r1"}, "tea")  # fills the read cache
    return svc


def test_a_closed_service_is_garbage_once_unreferenced(tmp_path, clock):
    svc = _used_home(tmp_path / "home", clock)
    assert "read" in svc.store.notes.caches and _compact_threads()
    refs = [weakref.ref(o) for o in (svc, svc.store, svc.store.notes, svc.store.examples, svc.sources)]
    svc.close()
    assert _compact_threads() == []
    del svc
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def test_close_ends_the_compactor_and_a_later_write_starts_it_again(tmp_path, clock):
    svc = _used_home(tmp_path / "home", clock)
    svc.store.close()
    assert _compact_threads() == [] and svc.store.notes.caches == {}
    for i in range(4):  # the table still works after close, and compacts again
        svc.add_note(f"late note {i}", agent_id="a")
    assert svc.store.notes.wait_for_compaction()
    assert len(svc.notes()) == 16
    svc.close()
    assert _compact_threads() == []


def test_homes_opened_one_after_another_do_not_accumulate(tmp_path, clock):
    refs = []
    for n in range(3):
        svc = _used_home(tmp_path / f"home{n}", clock)
        svc.close()
        refs.append(weakref.ref(svc))
        del svc
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
