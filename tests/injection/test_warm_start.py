"""A warm start: ``warm_up(scopes=N)`` reads the N scopes injected most recently (by the
injection events, whichever process served them) into the read cache of a home just
opened, so their first inject reads nothing and injects what it did before the restart."""

from __future__ import annotations

import pytest

from memory_pipelines.errors import ConfigError
from memory_pipelines.injection.cache import read_cache
from memory_pipelines.injection.read_filters import scope_cells
from memory_pipelines.injection.warm import ENV, recent_contexts, scopes_from_env
from memory_pipelines.notes import RunContext
from memory_pipelines.scope import RunScope

A = "agent-a"
USERS = ("u1", "u2", "u3")


def _fill(svc) -> None:
    svc.configure_agent(A, max_notes_to_inject=3, note_injection_strategy="Relevant")
    svc.add_notes(
        [
            {"note": f"{u} likes {w} tea", "agent_id": A, "user_id": u}
            for u in USERS
            for w in ("green", "black", "mint")
        ]
        + [{"note": "everyone gets the weekly report", "agent_id": A}]
    )


def _cells(svc, user: str) -> list:
    return scope_cells(RunScope.of(RunContext(agent_id=A, user_id=user), svc.get_agent(A)))


def test_the_scopes_injected_last_are_read_at_start_and_their_first_inject_reads_nothing(
    open_service, home
):
    svc = open_service()
    _fill(svc)
    before = {
        u: [n.id for n in svc.inject(RunContext(agent_id=A, user_id=u), "tea").notes]
        for u in ("u1", "u2")
    }
    svc.close()
    svc = open_service(home)
    assert [c.user_id for c in recent_contexts(svc.context, 5)] == ["u2", "u1"]
    cache = read_cache(svc.store.notes)
    assert svc.warm_scopes(1) == 1
    assert cache.scans == 2 and all(cache.holds(s) for s in _cells(svc, "u2"))
    assert not cache.holds(_cells(svc, "u1")[0])  # only the most recent scope
    stemmer = svc.context.inject_config.lexical_stemmer
    for cell in _cells(svc, "u2"):  # the lexical indexes a first ranking builds, built
        assert all(stemmer in seg._lexical for seg in cache._entries[cell.sql].segments)
    got = [n.id for n in svc.inject(RunContext(agent_id=A, user_id="u2"), "tea").notes]
    assert got == before["u2"] and cache.scans == 2  # nothing read
    svc.inject(RunContext(agent_id=A, user_id="u1"), "tea")
    assert cache.scans == 3  # its own notes only: the agent's shared ones were warmed


def test_no_scope_is_read_by_default_and_a_background_warm_up_stops_at_close(
    open_service, home, monkeypatch
):
    svc = open_service()
    _fill(svc)
    for u in USERS:
        svc.inject(RunContext(agent_id=A, user_id=u), "tea")
    svc.close()
    monkeypatch.delenv(ENV, raising=False)
    svc = open_service(home)
    svc.warm_up()
    assert read_cache(svc.store.notes).scans == 0
    monkeypatch.setenv(ENV, "3")
    thread = svc.warm_up(background=True)
    thread.join(60)
    assert not thread.is_alive() and read_cache(svc.store.notes).scans == 4  # 3 users + shared
    svc.close()
    svc = open_service(home)
    thread = svc.warm_up(background=True)
    svc.close()  # stops between two scopes; nothing raises
    thread.join(60)
    assert not thread.is_alive()


@pytest.mark.parametrize(("raw", "want"), [("", 0), (" 4 ", 4), ("0", 0)])
def test_the_environment_sets_the_default_count(monkeypatch, raw, want):
    monkeypatch.setenv(ENV, raw)
    assert scopes_from_env() == want


@pytest.mark.parametrize("raw", ["many", "-1", "2.5"])
def test_a_bad_count_is_a_config_error_when_the_warm_up_starts(open_service, monkeypatch, raw):
    monkeypatch.setenv(ENV, raw)
    with pytest.raises(ConfigError, match=ENV):
        scopes_from_env()
    with pytest.raises(ConfigError, match=ENV):
        open_service().warm_up(background=True)
