"""The batched write path gives what the per-write path gives: same dispositions, reasons,
notes and audit rows, in order, with each write seeing the earlier ones of its batch; it
commits the batch's notes once and claims its ledger rows once; a lost claim falls back."""

from __future__ import annotations

import pytest

from memory_pipelines import MemoryService, RunContext
from memory_pipelines.clock import FakeClock
from memory_pipelines.config import INDEXED_NOTE_COLUMNS, TableTuning, WriteConfig
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.store import RowTable
from memory_pipelines.text import normalize
from memory_pipelines.writes import execute_writes, ledger_key

AGENT = "agent-1"

#: every guard: idempotency, cap, dedupe against a stored note and against one written
#: earlier in the batch (at another scope), supersede of the batch's own note and of one
#: from an earlier call, malformed and clamped requests, the agent scope
BATCHES = [
    [{"note": "User likes figs.", "type": "Preference"}],
    [
        {"note": "User likes tea.", "type": "Preference"},
        {"note": "User works from Lisbon.", "type": "Context"},
        {"note": "User likes tea.", "type": "Preference"},
        {"note": "user likes   TEA.", "type": "Preference"},
        {"note": "User likes tea!", "type": "Preference"},
        {"note": "Ship on Mondays.", "type": "Context", "scopeHint": "agent"},
        {"note": "Ship on Mondays.", "type": "Context"},
        {"note": "User likes kiwis.", "type": "Preference"},
        "junk",
        {"note": "", "type": "Preference"},
        {"note": "User likes figs!", "type": "Preference"},
        {"note": "User reads on Fridays.", "type": "Constraint"},
        {"note": "User reads on Fridays.", "type": "Context"},
        {"note": "User sails on Sundays.", "type": "Context"},
        {"note": "User rows on Saturdays.", "type": "Context"},
        {"note": "User likes kiwis.", "type": "Preference", "scopeHint": "agent"},
    ],
]


def _home(path, cap=5):
    clock = FakeClock()
    svc = MemoryService.open(
        path,
        embedder=HashEmbedder(dim=64),
        clock=clock,
        write_config=WriteConfig(max_writes_per_run=cap),
    )
    svc.configure_agent(AGENT)
    svc.add_note("User likes kiwis.", agent_id=AGENT, user_id="u1", company_id="c1", id="kiwis")
    svc.add_note(
        "Ship on Mondays.", agent_id=AGENT, company_id="c1", status="Archived", id="mondays"
    )
    return svc


def _run(svc, batched: bool):
    ctx = RunContext(agent_id=AGENT, run_id="run-1", user_id="u1", company_id="c1")
    return [execute_writes(svc.context, ctx, b, batched=batched) for b in BATCHES]


def _state(svc, results):
    notes = svc.notes().drop(columns=["embedding_model_id"], errors="ignore")
    notes = notes.sort_values("id").reset_index(drop=True)
    steps = [{k: v for k, v in s.items() if k != "id"} for s in svc.sources.steps("run-1")]
    for s in steps:
        s["output_json"] = {k: v for k, v in s["output_json"].items() if k != "durationMs"}
    ledger = sorted(
        (r["key"], r["note_id"], r["disposition"]) for r in svc.sources.ledger_rows("run-1")
    )
    outs = [
        [(r.disposition, r.reason, r.note_id, r.final_scope, r.request) for r in rs]
        for rs in results
    ]
    return outs, notes.astype(str).to_dict("records"), steps, ledger


@pytest.mark.parametrize("cap", [5, 2])
def test_batched_equals_per_write(tmp_path, cap):
    with _home(tmp_path / "each", cap) as svc:
        each = _state(svc, _run(svc, batched=False))
    with _home(tmp_path / "batch", cap) as svc:
        batch = _state(svc, _run(svc, batched=True))
    assert batch[0] == each[0]  # dispositions, reasons, ids, scopes, echoes
    assert batch[1] == each[1]  # the notes, field by field
    assert batch[2] == each[2]  # the audit steps
    assert batch[3] == each[3]  # the ledger
    kinds = {d for rs in batch[0] for d, *_ in rs}
    assert {"written", "deduped", "superseded-own", "skipped-duplicate", "rejected-type"} <= kinds
    if cap == 2:
        assert "skipped-cap" in kinds


def test_one_note_commit_and_one_ledger_claim_per_batch(tmp_path, monkeypatch):
    with _home(tmp_path / "h") as svc:
        calls = []
        for name in ("upsert", "add", "put", "delete"):
            real = getattr(RowTable, name)
            monkeypatch.setattr(
                RowTable,
                name,
                lambda self, *a, _r=real, _n=name, **k: (calls.append(_n), _r(self, *a, **k))[1],
            )
        real_claim = svc.sources.ledger_claim
        claims = []
        monkeypatch.setattr(
            svc.sources,
            "ledger_claim",
            lambda rows: (claims.append(len(rows)), real_claim(rows))[1],
        )
        ctx = RunContext(agent_id=AGENT, run_id="run-9", user_id="u1", company_id="c1")
        results = svc.write(
            ctx,
            [
                {"note": "User likes plums."},
                {"note": "User likes pears."},
                {"note": "User likes plums!"},
                {"note": "User likes limes."},
            ],
        )
        assert [r.disposition for r in results] == [
            "written",
            "written",
            "superseded-own",
            "written",
        ]
        assert len(calls) == 1  # the new notes, the supersede folded in
        assert claims == [7]  # 3 written + 3 cap slots + 1 superseded-own
        assert svc.get_note(results[0].note_id).note == "User likes plums!"
        assert len(svc.sources.steps("run-9", "Memory Write")) == 4


def test_a_key_claimed_by_another_writer_falls_back_and_leaves_no_stray_note(tmp_path, monkeypatch):
    with _home(tmp_path / "h") as svc:
        real_claim = svc.sources.ledger_claim
        scope = f"{AGENT}|u1|c1"

        def racing_claim(rows):  # another writer of the run commits the second write first
            monkeypatch.setattr(svc.sources, "ledger_claim", real_claim)
            assert real_claim(
                [
                    {
                        "run_id": "run-1",
                        "key": ledger_key(scope, normalize("User likes pears.")),
                        "note_id": "their-note",
                        "scope_key": scope,
                        "disposition": "written",
                    },
                    {
                        "run_id": "run-1",
                        "key": "#slot:1",
                        "note_id": "their-note",
                        "scope_key": scope,
                        "disposition": "cap-slot",
                    },
                ]
            )
            return real_claim(rows)

        monkeypatch.setattr(svc.sources, "ledger_claim", racing_claim)
        ctx = RunContext(agent_id=AGENT, run_id="run-1", user_id="u1", company_id="c1")
        results = svc.write(ctx, [{"note": "User likes plums."}, {"note": "User likes pears."}])
        assert [r.disposition for r in results] == ["written", "skipped-duplicate"]
        assert results[1].note_id == "their-note"
        ids = set(svc.notes()["id"])
        assert results[0].note_id in ids
        # the pears note this batch saved before losing the claim is gone
        pears = [n for n in svc.notes()["note"] if n == "User likes pears."]
        assert pears == []


def _spy_saves(monkeypatch) -> list[str]:
    """Record how notes reach the table: an append or a merge_insert."""
    calls: list[str] = []
    for name in ("_append", "_merge"):
        real = getattr(RowTable, name)
        monkeypatch.setattr(
            RowTable,
            name,
            lambda self, data, _r=real, _n=name: (calls.append(_n), _r(self, data))[1],
        )
    return calls


def test_a_second_writer_appending_the_same_new_ids_leaves_one_row_each(
    tmp_path, monkeypatch, open_service
):
    """Two writers of one run save the same writes at once: both append the same new ids
    (no merge_insert), the ledger claim decides, and the loser leaves one row per id. (The
    run was used before, so both ask the table which ids it holds.)"""
    batch = [{"note": "User likes plums."}, {"note": "User likes pears."}]
    ctx = RunContext(agent_id=AGENT, run_id="run-2", user_id="u1", company_id="c1")
    with _home(tmp_path / "h") as svc, open_service(tmp_path / "h", clock=FakeClock()) as other:
        assert svc.write(ctx, []) == [] and svc.sources.claim_run(AGENT, "run-2", "c1", "u1")
        calls = _spy_saves(monkeypatch)
        table = svc.store.notes
        real_existing = table.existing_ids
        theirs = []

        def racing_existing(ids):  # both see the ids as new, then the other commits first
            monkeypatch.setattr(table, "existing_ids", real_existing)
            stored = real_existing(ids)
            theirs.extend(other.write(ctx, batch))
            return stored

        monkeypatch.setattr(table, "existing_ids", racing_existing)
        ours = svc.write(ctx, batch)
        assert [r.disposition for r in theirs] == ["written", "written"]
        assert [r.disposition for r in ours] == ["skipped-duplicate"] * 2
        assert [r.note_id for r in ours] == [r.note_id for r in theirs]
        assert calls[:2] == ["_append", "_append"]  # both writers appended
        notes = svc.notes()
        assert notes["id"].is_unique
        assert sorted(notes[notes["source_run_id"] == "run-2"]["id"]) == sorted(
            r.note_id for r in theirs
        )


def test_a_new_runs_notes_are_appended_without_the_id_lookup_and_a_retry_after_a_crash_merges(
    tmp_path, monkeypatch
):
    """The first write of a run nothing has used appends its notes without asking the
    table which ids it holds (none can be stored). Its retry, after a crash between the
    append and the ledger claim, asks, and merges: one row per id."""
    batch = [{"note": "User likes plums."}, {"note": "User likes pears."}]
    ctx = RunContext(agent_id=AGENT, run_id="run-new", user_id="u1", company_id="c1")
    with _home(tmp_path / "h") as svc:
        calls = _spy_saves(monkeypatch)
        asked: list[list[str]] = []
        real_existing = svc.store.notes.existing_ids
        monkeypatch.setattr(
            svc.store.notes, "existing_ids", lambda ids: (asked.append(list(ids)), real_existing(ids))[1]
        )
        real_claim = type(svc.sources).ledger_claim

        def crash(self, rows):
            raise OSError("the process died here")

        monkeypatch.setattr(type(svc.sources), "ledger_claim", crash)
        with pytest.raises(OSError):
            svc.write(ctx, batch)
        assert calls == ["_append"] and asked == []  # appended, no lookup
        monkeypatch.setattr(type(svc.sources), "ledger_claim", real_claim)
        retried = svc.write(ctx, batch)
        assert [r.disposition for r in retried] == ["written", "written"]
        assert calls == ["_append", "_merge"] and len(asked) == 1  # the retry asked
        notes = svc.notes()
        assert sorted(notes[notes["source_run_id"] == "run-new"]["id"]) == sorted(
            r.note_id for r in retried
        )


def test_only_a_run_id_nothing_used_counts_as_new(tmp_path):
    with _home(tmp_path / "h") as svc:
        db = svc.sources
        assert db.claim_new_run(AGENT, "r1", "c1", "u1")[1] is True
        assert db.claim_new_run(AGENT, "r1", "c1", "u1")[1] is False  # claimed before
        assert db.claim_new_run("agent-2", "r1", "c1", "u1")[1] is True  # another agent's run
        ledger = {"agent_id": AGENT, "run_id": "r2", "key": "k", "note_id": "n", "scope_key": "s"}
        assert db.ledger_claim([{**ledger, "disposition": "written"}])
        owner, new = db.claim_new_run(AGENT, "r2", "c1", "u1")  # rows of an older home
        assert (owner["user_id"], new) == ("u1", False)


def test_the_near_duplicate_guard_sees_a_note_another_process_just_wrote(tmp_path, open_service):
    with _home(tmp_path / "h") as svc, open_service(tmp_path / "h", clock=FakeClock()) as other:
        ctx = RunContext(agent_id=AGENT, run_id="run-3", user_id="u1", company_id="c1")
        svc.write(ctx, [{"note": "User likes plums."}])  # fills this writer's state
        theirs = other.add_note("User likes quinces.", agent_id=AGENT, user_id="u1")
        ctx = RunContext(agent_id=AGENT, run_id="run-4", user_id="u1", company_id="c1")
        [r] = svc.write(ctx, [{"note": "User likes quinces."}])
        assert (r.disposition, r.note_id) == ("deduped", theirs.id)


def test_the_candidate_fetch_over_indexed_columns_sees_the_other_process_at_once(
    tmp_path, open_service
):
    """With the scalar indexes the background compaction makes, the scope's candidates are
    still exact: a note another process appended after the index is found, and one it
    archived after the index is not."""
    with _home(tmp_path / "h") as svc, open_service(tmp_path / "h", clock=FakeClock()) as other:
        svc.store.notes.tuning = other.store.notes.tuning = TableTuning(id_index_min_rows=1)
        svc.add_note("User likes pears.", agent_id=AGENT, user_id="u1", id="pears")
        svc.store.notes.compact_small_fragments()
        indexed = {c for i in svc.store.notes.lance.list_indices() for c in i.columns}
        assert set(INDEXED_NOTE_COLUMNS) <= indexed
        theirs = other.add_note("User likes quinces.", agent_id=AGENT, user_id="u1")
        other.update_note("pears", status="Archived")
        ctx = RunContext(agent_id=AGENT, run_id="run-5", user_id="u1", company_id="c1")
        quinces, pears = svc.write(
            ctx, [{"note": "User likes quinces."}, {"note": "User likes pears."}]
        )
        assert (quinces.disposition, quinces.note_id) == ("deduped", theirs.id)
        assert pears.disposition == "written" and pears.note_id != "pears"


def test_a_batch_that_never_uses_its_prefetched_scope_dedupes_at_another(tmp_path, monkeypatch):
    """The run's own scope is fetched beside the embedding call; a batch whose requests all
    land elsewhere leaves that fetch unused and still dedupes with the stored vector."""
    with _home(tmp_path / "h") as svc:
        shared = svc.add_note("Ship on Fridays.", agent_id=AGENT, company_id="c1")
        svc.store.notes.journal.clear()  # scopes are read from the table, not from own writes
        fetched = []
        for name in ("scan_arrow", "scan_with_row_ids"):  # the read cache's scope reads
            scan = getattr(svc.store.notes, name)
            monkeypatch.setattr(
                svc.store.notes,
                name,
                lambda where, *a, _scan=scan, **kw: (
                    fetched.append(where.sql) or _scan(where, *a, **kw)
                ),
            )
        ctx = RunContext(agent_id=AGENT, run_id="run-6", user_id="u1", company_id="c1")
        [r] = svc.write(ctx, [{"note": "Ship on Fridays.", "scopeHint": "agent"}])
        assert (r.disposition, r.note_id) == ("deduped", shared.id)
        assert len(fetched) == 2  # the run's user scope (prefetched) and the agent scope


def test_add_note_appends_a_new_note_and_merges_a_caller_named_id(tmp_path, monkeypatch):
    with _home(tmp_path / "h") as svc:
        calls = _spy_saves(monkeypatch)
        svc.add_note("User likes dates.", agent_id=AGENT)
        svc.add_note("User likes limes.", agent_id=AGENT, id="limes")
        svc.add_note("User likes limes a lot.", agent_id=AGENT, id="limes")
        assert calls == ["_append", "_merge", "_merge"]
        assert svc.get_note("limes").note == "User likes limes a lot."
        assert (svc.notes()["id"] == "limes").sum() == 1


def test_add_note_with_a_generated_id_does_not_read_the_table(tmp_path, monkeypatch):
    """A fresh uuid cannot be stored yet: the add is one append, no id lookup."""
    with _home(tmp_path / "h") as svc:
        calls = _spy_saves(monkeypatch)
        lookups: list[list[str]] = []
        real = RowTable.existing_ids
        monkeypatch.setattr(
            RowTable, "existing_ids", lambda self, ids: (lookups.append(list(ids)), real(self, ids))[1]
        )
        first = svc.add_note("User likes dates.", agent_id=AGENT)
        second = svc.add_note("User likes figs.", agent_id=AGENT)
        assert calls == ["_append", "_append"] and lookups == []
        svc.add_note("User likes limes.", agent_id=AGENT, id="limes")
        assert calls[-1] == "_merge"  # a caller's id: merge_insert, whose conflict decides
        assert {first.id, second.id, "limes"} <= set(svc.notes()["id"])
