"""The near-duplicate guard's candidates come from the read cache's view of the scope and
are carried from write to write (no rebuild per table version), yet they stay exact: a
note another service (another process) or the bulk path stored is compared with, and a
note of another tenant never is."""

from __future__ import annotations

from memory_pipelines import RunContext
from memory_pipelines.injection.cache import read_cache
from memory_pipelines.scope import placement
from memory_pipelines.scope.placement import clamp_scope, near_dup_filter
from memory_pipelines.writes.candidates import fetch_candidates

AGENT = "agent-1"


def _ctx(run: str, user: str = "u1", company: str | None = "c1") -> RunContext:
    return RunContext(agent_id=AGENT, run_id=run, user_id=user, company_id=company)


def _write(svc, run: str, text: str, **ctx):
    [result] = svc.write(_ctx(run, **ctx), [{"note": text, "type": "Preference"}])
    return result


def _candidate_ids(svc, ctx: RunContext) -> set[str]:
    cands = fetch_candidates(svc.context, ctx, clamp_scope(ctx, None))
    assert cands is not None
    return {part.ids[k] for part in cands.parts for k in range(len(part.ids)) if part.alive[k]}


def _warm(svc, runs: int = 3) -> None:
    """A few writes of user u1 at company c1: the scope's view is cached and brought
    forward from these commits."""
    svc.configure_agent(AGENT)
    for i in range(runs):
        assert _write(svc, f"warm-{i}", f"User collects stamp series {i}.").disposition == "written"
    where = near_dup_filter(clamp_scope(_ctx("x"), None), _ctx("x"))
    assert read_cache(svc.store.notes).holds(where)


def test_the_candidates_are_carried_forward_not_rebuilt(open_service):
    svc = open_service()
    _warm(svc)
    before = fetch_candidates(svc.context, _ctx("probe"), clamp_scope(_ctx("probe"), None))
    assert _write(svc, "next", "User likes kiwis.").disposition == "written"
    after = fetch_candidates(svc.context, _ctx("probe"), clamp_scope(_ctx("probe"), None))
    assert before is not None and after is not None and after is not before
    # the rows read before are shared, the new note joined as a part of its own
    assert any(p.vectors is before.parts[0].vectors for p in after.parts)
    assert len(after.parts) == len(before.parts) + 1
    assert after.parts[-1].ids == [_write(svc, "next", "User likes kiwis.").note_id]


def test_a_note_another_service_stored_is_compared_with(open_service):
    svc, other = open_service(), open_service()
    _warm(svc)
    theirs = other.add_note("User likes quinces.", agent_id=AGENT, user_id="u1", company_id="c1")
    result = _write(svc, "after-other", "User likes quinces.")
    assert (result.disposition, result.note_id) == ("deduped", theirs.id)
    # another service's guarded write too, then archived there: no longer a candidate
    mine = _write(other, "other-run", "User plays the oboe.")
    assert mine.disposition == "written"
    assert mine.note_id in _candidate_ids(svc, _ctx("probe"))
    other.update_note(mine.note_id, status="Archived")
    assert mine.note_id not in _candidate_ids(svc, _ctx("probe"))
    again = _write(svc, "after-archive", "User plays the oboe.")
    assert again.disposition == "written" and again.note_id != mine.note_id


def test_a_note_the_bulk_path_stored_is_compared_with(open_service):
    svc, other = open_service(), open_service()
    _warm(svc)
    [mine] = svc.add_notes(
        [{"note": "User likes dates.", "agent_id": AGENT, "user_id": "u1", "company_id": "c1"}]
    )
    [theirs] = other.add_notes(
        [{"note": "User likes limes.", "agent_id": AGENT, "user_id": "u1", "company_id": "c1"}]
    )
    dates = _write(svc, "bulk-1", "User likes dates.")
    limes = _write(svc, "bulk-2", "User likes limes.")
    assert (dates.disposition, dates.note_id) == ("deduped", mine.id)
    assert (limes.disposition, limes.note_id) == ("deduped", theirs.id)


def test_another_tenants_notes_are_never_candidates(open_service):
    svc, other = open_service(), open_service()
    _warm(svc)
    text = "User likes figs."
    foreign = [
        svc.add_note(text, agent_id=AGENT, user_id="u2", company_id="c1"),
        other.add_note(text, agent_id=AGENT, user_id="u1", company_id="c2"),
        _write(svc, "t-u2", text, user="u2").note_id,
        _write(other, "t-c2", text, company="c2").note_id,
        svc.add_notes([{"note": text, "agent_id": AGENT, "user_id": "u3", "company_id": "c1"}])[0],
        other.add_note(text, agent_id="agent-2", user_id="u1", company_id="c1"),
    ]
    foreign_ids = {f if isinstance(f, str) else f.id for f in foreign}
    assert not foreign_ids & _candidate_ids(svc, _ctx("probe"))
    result = _write(svc, "t-u1", text)
    assert result.disposition == "written" and result.note_id not in foreign_ids


def test_only_a_write_without_a_user_asks_whether_the_agent_serves_companies(
    open_service, monkeypatch
):
    svc = open_service()
    svc.configure_agent(AGENT)
    asked: list[str] = []
    real = placement.serves_companies
    monkeypatch.setattr(
        placement, "serves_companies", lambda mem, agent: asked.append(agent) or real(mem, agent)
    )
    mine = _write(svc, "run-a", "User likes tea.", company=None)
    assert mine.disposition == "written" and asked == []
    svc.add_note("Ship on Mondays.", agent_id=AGENT, company_id="c1")
    [wide] = svc.write(
        _ctx("run-b", company=None), [{"note": "Use metric units.", "scopeHint": "agent"}]
    )
    assert asked == [AGENT]  # the agent serves companies: its companyless agent-wide write
    assert wide.disposition == "written" and wide.final_scope["user_id"] == "u1"  # is clamped
