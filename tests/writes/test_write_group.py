"""Group commit (``svc.write_group``): the calls of many callers give what ``svc.write``
one after another gives (results or errors, notes, audit steps, ledger rows and events, in
order); a bad call fails alone; calls that do not see each other share one note commit
and one ledger claim; two processes writing groups to one home lose nothing."""

from __future__ import annotations

import json

from reliability_helpers import run_scripts_at_once
from sqlalchemy import select

from memory_pipelines import MemoryService
from memory_pipelines.clock import FakeClock
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.sources import note_events, run_steps, write_ledger
from memory_pipelines.store import RowTable

AGENT = "agent-1"
GATED = "agent-quiet"


def _ctx(run: str, user: str | None = "u1", agent: str = AGENT) -> dict:
    return {"agent_id": agent, "run_id": run, "user_id": user, "company_id": "c1"}


#: every way calls of one group can meet: a near-duplicate of an earlier call's new note
#: (another run), a run continued by a later call (idempotency, supersede, the cap), two
#: reinforcements of one stored note, a gated agent, an unknown agent, an invalid context,
#: writes that are not a list, malformed requests, and calls that meet nothing
CALLS = [
    (_ctx("run-a"), [{"note": "User likes tea."}, {"note": "User works from Lisbon."}]),
    (_ctx("run-b"), [{"note": "User likes tea!"}, {"note": "User likes tea."}]),
    (_ctx("run-c", "u2"), [{"note": "User likes kiwis."}, {"note": "User sails on Sundays."}]),
    (_ctx("run-x", agent="nobody"), [{"note": "User likes plums."}]),
    (
        _ctx("run-a"),
        [
            {"note": "User likes tea."},
            {"note": "User works from Lisbon!"},
            {"note": "User rows on Saturdays.", "type": "Context"},
            {"note": "User reads on Fridays.", "type": "Context"},
            {"note": "User knits on Tuesdays.", "type": "Context"},
            {"note": "User hikes on Wednesdays.", "type": "Context"},
        ],
    ),
    ({"agent_id": AGENT, "user_id": "u1"}, [{"note": "User has no run."}]),
    (_ctx("run-d", "u3"), "User likes plums."),
    (_ctx("run-q", agent=GATED), [{"note": "User likes quiet."}]),
    (_ctx("run-e", "u3"), ["junk", {"note": ""}, {"note": "User likes pears.", "type": "Bad"}]),
    (_ctx("run-f"), [{"note": "User likes kiwis."}]),
    (_ctx("run-g"), [{"note": "User likes kiwis."}, {"note": "Ship on Mondays.", "scopeHint": "agent"}]),
    (_ctx("run-h", "u4"), []),
    (_ctx("run-i", "u5"), [{"note": "User flies kites."}]),
]


def _home(path):
    svc = MemoryService.open(path, embedder=HashEmbedder(dim=64), clock=FakeClock())
    svc.configure_agent(AGENT)
    svc.configure_agent(GATED, allow_memory_write=False)
    svc.add_note("User likes kiwis.", agent_id=AGENT, user_id="u1", company_id="c1", id="kiwis")
    return svc


def _outcome(out):
    if isinstance(out, Exception):
        return (type(out).__name__, str(out))
    return [(r.disposition, r.reason, r.note_id, r.final_scope, r.request) for r in out]


def _state(svc, outs):
    notes = svc.notes().drop(columns=["embedding_model_id"], errors="ignore")
    notes = notes.sort_values("id").reset_index(drop=True).astype(str).to_dict("records")
    with svc.sources.begin() as c:
        steps = [dict(r) for r in c.execute(select(run_steps).order_by(run_steps.c.id)).mappings()]
        ledger = sorted(
            (r["agent_id"], r["run_id"], r["key"], r["note_id"], r["disposition"])
            for r in c.execute(select(write_ledger)).mappings()
        )
        events = [
            {k: v for k, v in r.items() if k != "id"}
            for r in c.execute(select(note_events).order_by(note_events.c.id)).mappings()
        ]
    for s in steps:
        s.pop("id")
        s["output_json"] = {k: v for k, v in (s["output_json"] or {}).items() if k != "durationMs"}
    return [_outcome(o) for o in outs], notes, steps, ledger, events


def _sequential(svc, calls):
    outs = []
    for ctx, writes in calls:
        try:
            outs.append(svc.write(ctx, writes))
        except Exception as e:
            outs.append(e)
    return outs


def test_group_equals_the_calls_one_after_another(tmp_path):
    with _home(tmp_path / "seq") as svc:
        seq = _state(svc, _sequential(svc, CALLS))
    with _home(tmp_path / "group") as svc:
        group = _state(svc, svc.write_group(CALLS))
    assert group[0] == seq[0]  # results and errors, call by call
    assert group[1] == seq[1]  # the notes, field by field
    assert group[2] == seq[2]  # the audit steps, in order
    assert group[3] == seq[3]  # the ledger
    assert group[4] == seq[4]  # the lifecycle events, in order
    kinds = {d for out in seq[0] if isinstance(out, list) for d, *_ in out}
    assert {"written", "deduped", "superseded-own", "skipped-duplicate", "skipped-cap"} <= kinds
    assert {"rejected-type", "skipped-disabled"} <= kinds
    errors = [out[0] for out in seq[0] if isinstance(out, tuple)]
    assert errors == ["UnknownAgentError", "ValidationError", "ValidationError"]


def test_a_bad_call_fails_alone(tmp_path):
    with _home(tmp_path / "h") as svc:
        calls = [
            (_ctx("run-1", "u1"), [{"note": "User likes figs."}]),
            (_ctx("run-2", agent="nobody"), [{"note": "User likes dates."}]),
            (_ctx("run-3", "u3"), [{"note": "x" * 100_000}]),
            (_ctx("run-4", "u4"), [{"note": "User likes limes."}]),
        ]
        outs = svc.write_group(calls)
        assert [o[0].disposition for o in (outs[0], outs[3])] == ["written", "written"]
        assert type(outs[1]).__name__ == "UnknownAgentError"
        assert outs[2][0].disposition == "rejected-type"
        assert sorted(svc.notes()["note"]) == sorted(
            ["User likes figs.", "User likes limes.", "User likes kiwis."]
        )


def test_calls_that_do_not_meet_share_one_commit_and_one_claim(tmp_path, monkeypatch):
    with _home(tmp_path / "h") as svc:
        commits = []
        for name in ("upsert", "add", "put", "delete"):
            real = getattr(RowTable, name)
            monkeypatch.setattr(
                RowTable,
                name,
                lambda self, *a, _r=real, _n=name, **k: (commits.append(_n), _r(self, *a, **k))[1],
            )
        real_claim = svc.sources.ledger_claim
        claims = []
        monkeypatch.setattr(
            svc.sources, "ledger_claim", lambda rows: (claims.append(len(rows)), real_claim(rows))[1]
        )
        calls = [
            (_ctx(f"run-{k}", f"user-{k}"), [{"note": f"User {k} likes {fruit}."} for fruit in
                                             ("figs", "dates", "limes")])
            for k in range(6)
        ]
        outs = svc.write_group(calls)
        assert all(r.disposition == "written" for out in outs for r in out)
        assert len(commits) == 1  # one note commit for the 18 new notes of 6 calls
        assert claims == [36]  # 18 written + 18 cap slots, one transaction
        assert len(svc.sources.steps(None, "Memory Write")) == 18


WRITER = """
import hashlib, json, sys
from memory_pipelines import MemoryService
home, proc, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = []
with MemoryService.from_env(home) as svc:
    for i in range(rounds):
        calls = []
        for c in range(4):
            ctx = {"agent_id": "agent-1", "run_id": f"p{proc}-r{i}-c{c}", "user_id": f"u{c % 3}"}
            texts = [hashlib.sha256(f"{proc}/{i}/{c}/{k}".encode()).hexdigest() for k in range(2)]
            calls.append((ctx, [{"note": "Remember " + " ".join(t[j:j + 6] for j in range(0, 36, 6)),
                                 "type": "Context"} for t in texts]))
        for res in svc.write_group(calls):
            out += [[r.disposition, r.note_id] for r in res]
print(json.dumps(out))
"""


def test_two_processes_writing_groups_to_one_home_lose_and_duplicate_nothing(
    tmp_path, open_service
):
    home = tmp_path / "home"
    with open_service(home, clock=None) as svc:
        svc.configure_agent(AGENT)
    rounds = 6
    runs = run_scripts_at_once(WRITER, [[str(home), str(p), str(rounds)] for p in range(2)], 600)
    outs = [row for out in runs for row in json.loads(out.strip().splitlines()[-1])]
    assert [d for d, _ in outs] == ["written"] * (2 * rounds * 4 * 2)
    told = [note_id for _, note_id in outs]
    with open_service(home, clock=None) as svc:
        stored = svc.notes()
        assert sorted(stored["id"]) == sorted(set(told)) == sorted(told)  # each exactly once
