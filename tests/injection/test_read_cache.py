"""The injection read cache: the present path ranks its rows in process as time travel
ranks the same rows, and never serves a note (or a lexical index) that is no longer
injectable (archived, revoked, expired by the clock, deleted, moved out of scope), in this
process or after another process's write."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from memory_pipelines import MemoryService
from memory_pipelines.config import InjectConfig
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.injection.cache import read_cache
from memory_pipelines.injection.read_filters import RunScope, scope_cells
from memory_pipelines.notes import RunContext
from memory_pipelines.store import RowTable, eq

A, B = "agent-a", "agent-b"
WORDS = "tea coffee deploy friday invoice budget python lancedb vector meeting report".split()


@pytest.fixture
def relevant_svc(open_service):
    """A service that injects by relevance with no similarity floor (every note is a
    candidate), its agent allowed 8 notes."""
    with open_service(inject_config=InjectConfig(min_similarity=-1.0)) as s:
        s.configure_agent(A, max_notes_to_inject=8, note_injection_strategy="Relevant")
        yield s


def _ids(svc, ctx, text) -> list[str]:
    return [n.id for n in svc.inject(ctx, text).notes]


def _both(svc, ctx, text) -> tuple[list[str], list[str]]:
    cache = read_cache(svc.store.notes)
    cache.enabled = True
    cached = _ids(svc, ctx, text)
    cache.enabled = False
    try:
        direct = _ids(svc, ctx, text)
    finally:
        cache.enabled = True
    return cached, direct


def _populate(svc, clock) -> None:
    for i in range(60):
        w = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(3)]
        svc.add_note(
            f"note {i} about {' '.join(w)}",
            agent_id=[A, A, B, None][i % 4],
            user_id=["u1", "u2", None][i % 3],
            expires_at=clock() + timedelta(days=1) if i % 9 == 0 else None,
            source_conversation_id=f"c{i % 5}",
            source_conversation_detail_id=f"D1:{i}",
        )


def test_cached_path_ranks_as_time_travel_does_and_finds_what_lancedb_finds(relevant_svc, clock):
    """Present (cached rows) and ``as_of`` now rank through one code path: same notes, same
    order. The LanceDB path (cache off) scores BM25 with the whole table's statistics, so
    its order may differ; its top hit for a one-word query is among the cached ones."""
    _populate(relevant_svc, clock)
    relevant_svc.set_note_status(relevant_svc.store.notes.all()[3].id, "Archived")
    clock.advance(seconds=1)
    for ctx in (RunContext(agent_id=A, user_id="u1"), RunContext(agent_id=A)):
        for text in ("tea and coffee", "deploy on friday", "budget report meeting", "zzz"):
            cached, direct = _both(relevant_svc, ctx, text)
            assert cached == [n.id for n in relevant_svc.inject(ctx, text, as_of=clock()).notes]
            assert len(cached) == len(direct)
    assert read_cache(relevant_svc.store.notes).scans >= 2


@pytest.mark.parametrize("stemmer", ["none", "strong"])
def test_stemmer_and_feedback_apply_to_present_and_as_of_alike(relevant_svc, clock, stemmer):
    _populate(relevant_svc, clock)
    clock.advance(seconds=1)
    relevant_svc.inject_config = replace(
        relevant_svc.inject_config, lexical_stemmer=stemmer, prf_weight=0.5, prf_docs=3, prf_terms=4
    )
    ctx = RunContext(agent_id=A, user_id="u1")
    for text in ("tea and coffee", "deploying on fridays", "budgets"):
        present = _ids(relevant_svc, ctx, text)
        assert present == [n.id for n in relevant_svc.inject(ctx, text, as_of=clock()).notes]


def test_a_second_call_reads_no_rows_and_this_processs_write_is_patched_in(relevant_svc, clock):
    # no background compaction: its thread reads recently used scopes again (counted as
    # scans) whenever it runs, which on a busy machine fell between the counts below
    relevant_svc.store.notes.compact_every = 0
    _populate(relevant_svc, clock)
    ctx = RunContext(agent_id=A, user_id="u1")
    cache = read_cache(relevant_svc.store.notes)
    _ids(relevant_svc, ctx, "tea")  # the first text search creates the full-text index (a version)
    _ids(relevant_svc, ctx, "tea")
    scans, patches = cache.scans, cache.patches
    _ids(relevant_svc, ctx, "coffee")
    assert cache.scans == scans  # served from the cache
    relevant_svc.add_note("tea time on friday", agent_id=A, user_id="u1")
    got = relevant_svc.inject(ctx, "tea time on friday").notes
    # both cells of the scope (the user's notes, the shared ones) brought forward, unread
    assert (cache.scans, cache.patches) == (scans, patches + 2)
    assert "tea time on friday" in [n.note for n in got]
    relevant_svc.store.notes.delete(eq("id", got[0].id))  # a delete is not replayed: read again
    assert "tea time on friday" not in [n.note for n in relevant_svc.inject(ctx, "tea time").notes]
    assert cache.scans == scans + 2


def _own_cell(svc, ctx):
    """The cached entry of the user's own notes in the run's scope."""
    scope = RunScope.of(ctx, svc.get_agent(ctx.agent_id))
    return read_cache(svc.store.notes)._entries[scope_cells(scope)[0].sql]


def _scan_again(svc, ctx, text) -> list[str]:
    cache = read_cache(svc.store.notes)
    cache.clear()
    return _ids(svc, ctx, text)


def test_a_patched_entry_ranks_as_a_fresh_scan_does(relevant_svc, clock):
    """Adds, edits, status changes and scope moves of this process bring the entry forward
    segment by segment (merged when crowded); every answer is the one a fresh scan of the
    table gives, in the same order, and the one time travel gives."""
    # no background compaction from the first write: one requested while populating could
    # commit during the counts below, and a version read before its record is a scan
    relevant_svc.store.notes.compact_every = 0
    _populate(relevant_svc, clock)
    relevant_svc.configure_agent(B, max_notes_to_inject=6, note_injection_strategy="Relevant")
    clock.advance(seconds=1)
    cache = read_cache(relevant_svc.store.notes)
    ctxs = [RunContext(agent_id=A, user_id="u1"), RunContext(agent_id=A), RunContext(agent_id=B)]
    texts = ("tea and coffee", "deploy on friday", "budget report meeting")
    for ctx in ctxs:
        _ids(relevant_svc, ctx, texts[0])
    notes = relevant_svc.store.notes.all()
    scans = cache.scans
    for step in range(40):
        n = notes[step % len(notes)]
        kind = step % 5
        if kind == 0:
            relevant_svc.add_note(f"extra {step} about tea deploy budget", agent_id=A, user_id="u1")
        elif kind == 1:
            relevant_svc.update_notes([(n, {"note": f"{n.note} and friday coffee {step}"})])
        elif kind == 2:
            relevant_svc.set_note_status(n.id, "Archived" if step % 2 else "Active")
        elif kind == 3:
            relevant_svc.update_notes([(n, {"user_id": ["u1", "u2", None][step % 3]})])
        else:
            relevant_svc.add_note(f"other agent {step} tea", agent_id=B)
        clock.advance(seconds=1)
        for ctx in ctxs:
            for text in texts:
                patched = _ids(relevant_svc, ctx, text)
                assert patched == [
                    n.id for n in relevant_svc.inject(ctx, text, as_of=clock()).notes
                ]
        if step % 8 == 7:
            assert cache.patches and cache.scans == scans
            for ctx in ctxs:
                for text in texts:
                    patched = _ids(relevant_svc, ctx, text)
                    assert patched == _scan_again(relevant_svc, ctx, text), (step, ctx, text)
            for ctx in ctxs:
                _ids(relevant_svc, ctx, texts[0])
            scans = cache.scans
    for entry in cache._entries.values():
        assert len(entry.segments) <= 17


@pytest.mark.parametrize("status", ["Archived", "Revoked"])
def test_a_note_no_longer_injectable_is_never_served(relevant_svc, clock, status):
    keep = relevant_svc.add_note("user likes green tea", agent_id=A, user_id="u1")
    ctx = RunContext(agent_id=A, user_id="u1")
    assert keep.id in _ids(relevant_svc, ctx, "green tea")
    relevant_svc.set_note_status(keep.id, status)
    assert keep.id not in _ids(relevant_svc, ctx, "green tea")


def test_expiry_by_the_clock_needs_no_write(relevant_svc, clock):
    soon = relevant_svc.add_note(
        "user likes green tea", agent_id=A, user_id="u1", expires_at=clock() + timedelta(hours=1)
    )
    ctx = RunContext(agent_id=A, user_id="u1")
    _ids(relevant_svc, ctx, "tea")  # the first text search creates the full-text index (a version)
    assert soon.id in _ids(relevant_svc, ctx, "green tea")
    scans = read_cache(relevant_svc.store.notes).scans
    clock.advance(hours=2)
    assert soon.id not in _ids(relevant_svc, ctx, "green tea")
    # the same version, filtered by the clock
    assert read_cache(relevant_svc.store.notes).scans == scans


def test_deleted_and_rescoped_notes_leave_the_scope(relevant_svc):
    gone = relevant_svc.add_note("user likes green tea", agent_id=A, user_id="u1")
    moved = relevant_svc.add_note("user drinks green tea daily", agent_id=A, user_id="u1")
    ctx = RunContext(agent_id=A, user_id="u1")
    assert {gone.id, moved.id} <= set(_ids(relevant_svc, ctx, "green tea"))
    relevant_svc.update_notes([(moved, {"user_id": "u2"})])
    relevant_svc.store.notes.delete(eq("id", gone.id))
    got = _ids(relevant_svc, ctx, "green tea")
    assert gone.id not in got and moved.id not in got
    assert moved.id in _ids(relevant_svc, RunContext(agent_id=A, user_id="u2"), "green tea")


def test_served_notes_are_copies(relevant_svc):
    n = relevant_svc.add_note("user likes green tea", agent_id=A, user_id="u1")
    ctx = RunContext(agent_id=A, user_id="u1")
    first = relevant_svc.inject(ctx, "green tea").notes[0]
    first.note = "changed by a caller"
    first.comments.append("x") if first.comments else None
    again = relevant_svc.inject(ctx, "green tea").notes[0]
    assert (again.id, again.note) == (n.id, n.note)


def test_a_scope_larger_than_the_budget_takes_the_lancedb_path(relevant_svc, clock):
    _populate(relevant_svc, clock)
    cache = read_cache(relevant_svc.store.notes)
    ctx = RunContext(agent_id=A, user_id="u1")
    want = _both(relevant_svc, ctx, "tea and coffee")[1]
    cache.clear()
    cache.max_rows = 3
    try:
        assert _ids(relevant_svc, ctx, "tea and coffee") == want
        assert not cache._entries
    finally:
        cache.max_rows = 200_000


def test_another_processs_archive_is_seen_on_the_next_call(relevant_svc, home):
    """A second process archives a note this process has cached; the next inject here
    must not return it (the table version moved)."""
    n = relevant_svc.add_note("user likes green tea", agent_id=A, user_id="u1")
    other = relevant_svc.add_note("user likes oolong tea too", agent_id=A, user_id="u1")
    ctx = RunContext(agent_id=A, user_id="u1")
    assert {n.id, other.id} <= set(_ids(relevant_svc, ctx, "green tea"))
    script = textwrap.dedent(
        f"""
        from memory_pipelines import MemoryService
        from memory_pipelines.embeddings import HashEmbedder
        with MemoryService.open({str(home)!r}, embedder=HashEmbedder(dim=64)) as s:
            s.set_note_status({n.id!r}, "Archived")
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    got = _ids(relevant_svc, ctx, "green tea")
    assert n.id not in got and other.id in got


@pytest.fixture
def text_only(home, clock):
    """No vector candidates (the floor is above any cosine): what comes back is BM25's."""
    with MemoryService.open(
        home,
        embedder=HashEmbedder(dim=64),
        clock=clock,
        inject_config=InjectConfig(min_similarity=1.5),
    ) as s:
        s.configure_agent(A, max_notes_to_inject=8, note_injection_strategy="Relevant")
        yield s


def test_the_lexical_index_follows_every_write(text_only, clock):
    svc = text_only
    ctx = RunContext(agent_id=A, user_id="u1")
    svc.add_note("user likes green tea", agent_id=A, user_id="u1")
    assert _ids(svc, ctx, "zebra crossing") == []
    zebra = svc.add_note("user walks the zebra crossing", agent_id=A, user_id="u1")
    assert _ids(svc, ctx, "zebra crossing") == [zebra.id]
    svc.set_note_status(zebra.id, "Archived")
    assert _ids(svc, ctx, "zebra crossing") == []
    soon = svc.add_note(
        "user feeds the zebra", agent_id=A, user_id="u1", expires_at=clock() + timedelta(hours=1)
    )
    assert _ids(svc, ctx, "zebra") == [soon.id]
    clock.advance(hours=2)
    assert _ids(svc, ctx, "zebra") == []


def test_the_lexical_index_lives_with_its_segment(text_only):
    svc = text_only
    svc.add_note("user likes green tea", agent_id=A, user_id="u1")
    ctx = RunContext(agent_id=A, user_id="u1")
    _ids(svc, ctx, "tea")
    _ids(svc, ctx, "tea")
    entry = _own_cell(svc, ctx)
    (seg,) = entry.segments
    assert seg.lexical() is seg.lexical()  # built once
    assert "tea" in seg.lexical().postings and "green" in seg.lexical("none").postings
    svc.add_note("user drinks mate", agent_id=A, user_id="u1")
    _ids(svc, ctx, "mate")
    fresh = _own_cell(svc, ctx)
    assert fresh is not entry and fresh.segments[0] is seg  # shared: not indexed again
    assert "mate" in fresh.segments[1].lexical().postings


def test_another_processs_write_is_in_the_next_lexical_side(text_only, home):
    svc = text_only
    svc.add_note("user likes green tea", agent_id=A, user_id="u1")
    ctx = RunContext(agent_id=A, user_id="u1")
    assert _ids(svc, ctx, "zebra") == []
    script = textwrap.dedent(
        f"""
        from memory_pipelines import MemoryService
        from memory_pipelines.embeddings import HashEmbedder
        with MemoryService.open({str(home)!r}, embedder=HashEmbedder(dim=64)) as s:
            print(s.add_note("user feeds the zebra", agent_id={A!r}, user_id="u1").id)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, timeout=120, capture_output=True, text=True
    )
    assert _ids(svc, ctx, "zebra") == [out.stdout.strip().splitlines()[-1]]


def test_latest_version_follows_every_commit_without_a_checkout(relevant_svc, home):
    table = relevant_svc.store.notes
    relevant_svc.add_note("user likes green tea", agent_id=A, user_id="u1")
    assert table.latest_version() == table.version
    _other = textwrap.dedent(
        f"""
        from memory_pipelines import MemoryService
        from memory_pipelines.embeddings import HashEmbedder
        with MemoryService.open({str(home)!r}, embedder=HashEmbedder(dim=64)) as s:
            s.add_note("user likes oolong", agent_id={A!r}, user_id="u1")
        """
    )
    before = table.latest_version()
    subprocess.run([sys.executable, "-c", _other], check=True, timeout=120)
    assert table.latest_version() > before
    assert table.latest_version() == table.version
    relevant_svc.compact()
    assert table.latest_version() == table.version


def test_a_cache_hit_checks_nothing_out(relevant_svc, monkeypatch):
    relevant_svc.add_note("user likes green tea", agent_id=A, user_id="u1")
    ctx = RunContext(agent_id=A, user_id="u1")
    # the first text search creates the full-text index (a version)
    _ids(relevant_svc, ctx, "green tea")
    want = _ids(relevant_svc, ctx, "green tea")
    monkeypatch.setattr(RowTable, "version", property(lambda self: pytest.fail("checked out")))
    assert _ids(relevant_svc, ctx, "green tea") == want


def test_the_compactor_reads_recently_used_scopes_again_in_its_thread(relevant_svc, clock):
    """A compaction makes a version no journal replays; the compactor's thread reads the
    scopes injection used recently at the new version, so the next request scans nothing
    and gets what a fresh scan gives."""
    _populate(relevant_svc, clock)
    table = relevant_svc.store.notes
    table.compact_every = 4
    ctx = RunContext(agent_id=A, user_id="u1")
    cache = read_cache(table)
    _ids(relevant_svc, ctx, "tea")
    for i in range(4):
        relevant_svc.add_note(f"fresh tea note {i}", agent_id=A, user_id="u1")
    assert table.wait_for_compaction(60)
    assert _own_cell(relevant_svc, ctx).version == table.latest_version()
    scans = cache.scans
    got = _ids(relevant_svc, ctx, "fresh tea note")
    assert cache.scans == scans
    assert got == _scan_again(relevant_svc, ctx, "fresh tea note")


def test_users_of_an_agent_share_one_entry_of_the_notes_without_a_user(relevant_svc, clock):
    """A user's scope is cached as two cells: the user's own notes and the notes without
    a user, the latter the very entry an agent-wide run uses; no user sees another's."""
    _populate(relevant_svc, clock)
    cache = read_cache(relevant_svc.store.notes)
    cache.clear()
    runs = [RunContext(agent_id=A, user_id=u) for u in ("u1", "u2")] + [RunContext(agent_id=A)]
    for ctx in runs:
        _ids(relevant_svc, ctx, "tea and coffee")
    assert len(cache._entries) == 3  # u1's, u2's, and one shared by both and agent-wide
    for ctx in runs:
        got = relevant_svc.store.notes.get_many(_ids(relevant_svc, ctx, "tea coffee deploy budget"))
        assert {n.user_id for n in got} <= {ctx.user_id, None}
        assert _ids(relevant_svc, ctx, "tea and coffee") == _scan_again(
            relevant_svc, ctx, "tea and coffee"
        )


def test_a_refresh_reads_the_most_recently_used_scopes_within_the_window(relevant_svc):
    """What the compactor's thread reads again: entries used within ``used_within``
    seconds, the most recently used first, at most ``most`` of them."""
    table = relevant_svc.store.notes
    table.compact_every = 0
    cache = read_cache(table)
    gone = relevant_svc.add_note("user likes green tea", agent_id=A, user_id="u0")
    ctxs = [RunContext(agent_id=A, user_id=f"u{u}") for u in range(4)]
    for ctx in ctxs:
        _ids(relevant_svc, ctx, "tea")
    table.delete(eq("id", gone.id))  # a version no journal replays: every entry is behind
    assert cache.refresh(used_within=0, most=2) == 0  # none used since
    assert cache.refresh(most=2) == 2
    latest = table.latest_version()
    assert _own_cell(relevant_svc, ctxs[3]).version == latest  # the most recent two: u3's own notes
    shared = scope_cells(RunScope.of(ctxs[3], relevant_svc.get_agent(A)))[1]
    assert cache._entries[shared.sql].version == latest  # and the shared cell
    assert _own_cell(relevant_svc, ctxs[0]).version < latest


def test_a_tail_compaction_is_brought_forward_without_reading_the_scope(relevant_svc, clock):
    """A compaction rewrites rows without changing one: the journal records its versions
    as writing nothing, so the next injection brings the cached entry past it instead of
    scanning the scope (every client of a busy server did, right after each compaction),
    and gets what a fresh scan gives."""
    table = relevant_svc.store.notes
    table.compact_every = 0
    _populate(relevant_svc, clock)
    ctx = RunContext(agent_id=A, user_id="u1")
    cache = read_cache(table)
    _ids(relevant_svc, ctx, "tea")
    before = table.latest_version()
    report = table.compact_small_fragments()
    assert report["fragments_after"] < report["fragments_before"]
    assert table.latest_version() > before
    assert table.journal.since(before, table.latest_version()) is not None
    scans, patches = cache.scans, cache.patches
    got = _ids(relevant_svc, ctx, "tea coffee")
    assert cache.scans == scans and cache.patches > patches
    assert _own_cell(relevant_svc, ctx).version == table.latest_version()
    assert got == _scan_again(relevant_svc, ctx, "tea coffee")


def test_a_read_during_a_compactions_commit_waits_for_its_record(
    relevant_svc, clock, monkeypatch
):
    """A read that lists the version a background compaction has just committed, before
    the compaction has recorded it in the journal, waits for the record and brings the
    entry forward: it used to read the whole scope again (66 ms at 10,000 notes, a few
    times per thousand single writes) and lose the near-duplicate guard's sketch."""
    import threading

    from memory_pipelines.store import compaction

    table = relevant_svc.store.notes
    table.compact_every = 0
    table.journal.from_empty_max_rows = 0  # a table larger than the journal's rows
    _populate(relevant_svc, clock)
    assert not table.journal.follows_from_empty
    ctx = RunContext(agent_id=A, user_id="u1")
    cache = read_cache(table)
    _ids(relevant_svc, ctx, "tea")
    committed, record = threading.Event(), compaction.journal_unchanged

    def slow_record(t, before):
        committed.set()  # the commit is in; the record is not yet
        threading.Event().wait(0.3)
        return record(t, before)

    monkeypatch.setattr(compaction, "journal_unchanged", slow_record)
    compactor = threading.Thread(target=table.compact_small_fragments)
    compactor.start()
    try:
        assert committed.wait(30)
        assert table.journal.since(_own_cell(relevant_svc, ctx).version, table.latest_version()) is None
        scans, patches = cache.scans, cache.patches
        got = _ids(relevant_svc, ctx, "tea coffee")
    finally:
        compactor.join(30)
    assert cache.scans == scans and cache.patches > patches
    assert _own_cell(relevant_svc, ctx).version == table.latest_version()
    assert got == _scan_again(relevant_svc, ctx, "tea coffee")


def test_a_compaction_never_covers_another_processs_write(relevant_svc, clock, home):
    """Another process's append lands before this process's compaction: the journal
    records nothing from it on, and the next injection reads the scope again and finds
    the other process's note."""
    from memory_pipelines.store.compaction import journal_unchanged

    table = relevant_svc.store.notes
    table.compact_every = 0
    _populate(relevant_svc, clock)
    ctx = RunContext(agent_id=A, user_id="u1")
    _ids(relevant_svc, ctx, "walnut")
    before = table.latest_version()
    script = textwrap.dedent(
        f"""
        from memory_pipelines import MemoryService
        from memory_pipelines.embeddings import HashEmbedder
        with MemoryService.open({str(home)!r}, embedder=HashEmbedder(dim=64)) as s:
            s.store.notes.compact_every = 0
            print(s.add_note("user roasts walnuts", agent_id={A!r}, user_id="u1").id)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, timeout=120, capture_output=True, text=True
    )
    table.compact_small_fragments()
    assert journal_unchanged(table, before) == 0  # stops at the other process's append
    assert table.journal.since(before, table.latest_version()) is None
    scans = read_cache(table).scans
    assert out.stdout.strip().splitlines()[-1] in _ids(relevant_svc, ctx, "walnut")
    assert read_cache(table).scans > scans


def test_delta_segments_merge_like_a_binary_counter():
    """Single writes patched into a view one at a time: each merge takes the newest
    segments back to the oldest holding no more rows than the newer ones together, so a
    row is copied about log2(rows) times (merging every delta every few writes copied
    rows^2 / 32), and the view keeps few segments."""
    from memory_pipelines.injection.cache import MAX_SEGMENTS, ScopeView

    class Seg:  # what the merge plan reads of a segment
        def __init__(self, n):
            self.size = n

    def view(sizes):
        return ScopeView(1, [Seg(n) for n in sizes], [np.ones(n, bool) for n in sizes], eq("a", "b"))

    assert view([100, 8, 4, 2, 1, 1])._tail_start() == 1  # 1+1, +2, +4, +8: every delta
    assert view([100, 64, 8, 2, 1, 1])._tail_start() == 3  # 8 > 2+1+1: it stays
    sizes, copied, most = [0], 0, 0
    for _ in range(20_000):
        sizes.append(1)
        if len(sizes) > MAX_SEGMENTS:
            start = view(sizes)._tail_start()
            assert 1 <= start <= len(sizes) - 2
            copied += sum(sizes[start:])
            sizes = [*sizes[:start], sum(sizes[start:])]
        most = max(most, len(sizes))
    assert sum(sizes) == 20_000 and most <= MAX_SEGMENTS + 1
    assert copied <= 20_000 * 15  # log2(20,000) ~ 14.3; every delta each time: ~12.5M


def test_held_bytes_counts_the_cached_rows_and_vectors_once(relevant_svc, clock):
    relevant_svc.store.notes.compact_every = 0
    _populate(relevant_svc, clock)
    cache = read_cache(relevant_svc.store.notes)
    assert cache.held_bytes() == 0
    _ids(relevant_svc, RunContext(agent_id=A, user_id="u1"), "tea")
    views = list(cache._entries.values())
    rows = sum(seg.size for v in views for seg in v.segments)
    dim = relevant_svc.store.dim
    held = cache.held_bytes()
    assert rows > 0 and held > rows * dim * 4  # the vectors, and the rows beside them
    before = set(cache._entries)
    _ids(relevant_svc, RunContext(agent_id=A, user_id="u2"), "tea")  # shares the agent's cell
    new = [v for k, v in cache._entries.items() if k not in before]
    assert len(new) == 1 and len(cache._entries) == len(before) + 1
    [seg] = new[0].segments
    # what u2 added is its own cell; the agent's cell both read is counted once
    assert cache.held_bytes() - held == seg.rows.nbytes + seg.vectors.nbytes + seg.norms.nbytes
    cache.clear()
    assert cache.held_bytes() == 0
