"""purge_user erases a user's data from every file under the memory home, old LanceDB
versions, index files, SQLite free pages and WAL included, and leaves others intact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from memory_pipelines import MemoryService, RunContext

# Distinctive words: the purged user's (must vanish) and the kept user's (must survive).
GONE = ["zanzibarquokka", "purplemarmoset", "quetzalvortex", "xylophonegecko", "obsidianllama"]
KEPT = ["keptpelican", "keptwalrus"]


def _files_containing(root: Path, words: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes().lower()
        hits = [w for w in words if w.encode() in data]
        if hits:
            found[str(path.relative_to(root))] = hits
    return found


def _seed(svc: MemoryService) -> dict[str, str]:
    svc.configure_agent("agent-1")
    svc.add_company("co-1")
    svc.add_user("u-gone", company_id="co-1")
    svc.add_user("u-kept", company_id="co-1")
    # the purged user: in-flight writes, manual notes, conversation, run, example, inject
    svc.add_agent_run("run-gone", "agent-1", user_id="u-gone", company_id="co-1",
                      summary="run about zanzibarquokka")
    ctx = RunContext(agent_id="agent-1", run_id="run-gone", user_id="u-gone", company_id="co-1")
    res = svc.write(ctx, [
        {"note": "User zanzibarquokka prefers short answers", "type": "Preference"},
        {"note": "User works on the purplemarmoset project", "type": "Context"},
    ])
    assert [r.disposition for r in res] == ["written", "written"]
    svc.add_note("Always cite quetzalvortex sources", user_id="u-gone", agent_id="agent-1",
                 company_id="co-1", type="Constraint")
    svc.add_conversation("conv-gone", "agent-1", user_id="u-gone", company_id="co-1")
    svc.add_message("conv-gone", "m1", "user", "My cat is called xylophonegecko, remember it")
    svc.add_message("conv-gone", "m2", "assistant", "Noted, xylophonegecko it is.")
    svc.add_note("Agent-wide note sourced from obsidianllama chat", agent_id="agent-1",
                 source_conversation_id="conv-gone")
    svc.add_example("agent-1", "How do I reach obsidianllama?", "Via the purplemarmoset portal.",
                    user_id="u-gone", success_score=90)
    svc.inject(ctx, "tell me about zanzibarquokka")
    # the kept user
    svc.add_agent_run("run-kept", "agent-1", user_id="u-kept", company_id="co-1")
    kctx = RunContext(agent_id="agent-1", run_id="run-kept", user_id="u-kept", company_id="co-1")
    kept = svc.write(kctx, [{"note": "User likes keptpelican charts", "type": "Preference"}])
    assert kept[0].disposition == "written"
    svc.add_conversation("conv-kept", "agent-1", user_id="u-kept", company_id="co-1")
    svc.add_message("conv-kept", "k1", "user", "I always want keptwalrus summaries")
    svc.add_example("agent-1", "keptwalrus question", "keptpelican answer", user_id="u-kept")
    svc.inject(kctx, "keptpelican please")
    # full-text index, several versions, a forced maintenance cycle
    svc.store.notes.text_search("zanzibarquokka keptpelican", k=5)
    svc.manager.run_cycle(force_maintenance=True)
    return {"kept_note": kept[0].note_id}


def test_purge_user_leaves_no_byte_behind(home, open_service):
    with open_service() as svc:
        ids = _seed(svc)
        before = _files_containing(home, GONE)
        # the scan can fail: the purged words are on disk (LanceDB data and SQLite) first
        assert any(p.startswith("lance") for p in before), before
        assert any("sqlite3" in p for p in before), before
        counts = svc.purge_user("u-gone")
        assert counts["notes"] >= 4 and counts["examples"] == 1
        assert counts["conversations"] == 1 and counts["messages"] == 2
        assert counts["agent_runs"] == 1 and counts["users"] == 1
        assert counts["run_steps"] >= 1 and counts["write_ledger"] >= 2
        assert counts["embedding_cache"] >= 1

        leftovers = _files_containing(home, GONE)
        assert leftovers == {}, leftovers
        # the other user's data is intact and still searchable
        kept_files = _files_containing(home, KEPT)
        assert any(p.startswith("lance/notes") for p in kept_files), kept_files
        assert "memory.sqlite3" in kept_files, kept_files
        assert svc.get_note(ids["kept_note"]) is not None
        assert svc.notes(user_id="u-gone").empty
        assert len(svc.examples(user_id="u-kept")) == 1
        assert svc.sources.messages_of("conv-kept")[0]["text"].startswith("I always")
        assert svc.sources.get_conversation("conv-gone") is None
        hits = svc.store.notes.text_search("keptpelican", k=5)
        assert [h.item.id for h in hits] == [ids["kept_note"]]
        assert svc.store.notes.text_search("zanzibarquokka", k=5) == []
        kctx = RunContext(agent_id="agent-1", run_id="run-kept-2", user_id="u-kept", company_id="co-1")
        assert "keptpelican" in svc.inject(kctx, "keptpelican").message
        # idempotent, and the home still works for writes afterwards
        again = svc.purge_user("u-gone")
        assert again["notes"] == 0 and again["users"] == 0
        res = svc.write(kctx, [{"note": "User also likes tables", "type": "Preference"}])
        assert res[0].disposition == "written"


def test_purge_user_cli(home, monkeypatch, open_service):
    with open_service() as svc:
        svc.configure_agent("agent-1")
        svc.add_user("u-cli")
        svc.add_note("cli purged zanzibarquokka fact", user_id="u-cli", agent_id="agent-1")
    env = {"MEMORY_EMBEDDING_MODEL": "hash", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    import os

    out = subprocess.run(
        [sys.executable, "-m", "memory_pipelines.apps.cli", "purge-user", "u-cli", "--home", str(home)],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert '"notes": 1' in out.stdout
    assert _files_containing(home, ["zanzibarquokka"]) == {}


def test_purge_rewrites_a_fragment_compaction_would_keep(home, open_service):
    """One row deleted out of a large single-fragment batch (below the compaction
    threshold) is still physically erased."""
    from memory_pipelines.notes import Note

    with open_service() as svc:
        svc.configure_agent("agent-1")
        batch = [Note(note=f"kept keptpelican fact number {i}", agent_id="agent-1", user_id="u-kept")
                 for i in range(300)]
        batch.append(Note(note="lone zanzibarquokka secret", agent_id="agent-1", user_id="u-gone"))
        svc.save_notes(batch)
        svc.store.notes.text_search("zanzibarquokka", k=3)
        assert _files_containing(home / "lance", ["zanzibarquokka"])
        counts = svc.purge_user("u-gone")
        assert counts["notes"] == 1
        assert _files_containing(home, ["zanzibarquokka"]) == {}
        assert len(svc.notes(user_id="u-kept")) == 300
        assert len(svc.store.notes.text_search("keptpelican", k=500)) == 300


def test_purge_goes_by_ownership_and_provenance_not_by_text(home, open_service):
    """Another user's audit row with the same words survives; the purged user's
    agent-wide notes (no user id, written in their runs) are erased."""
    with open_service() as svc:
        svc.configure_agent("agent-1")
        same = "User likes tangerinefalcon charts"
        bctx = RunContext(agent_id="agent-1", run_id="run-b", user_id="u-b", company_id="co-1")
        svc.add_agent_run("run-b", "agent-1", user_id="u-b", company_id="co-1")
        [b] = svc.write(bctx, [{"note": same, "type": "Preference"}])
        svc.add_agent_run("run-a", "agent-1", user_id="u-a", company_id="co-1")
        actx = RunContext(agent_id="agent-1", run_id="run-a", user_id="u-a", company_id="co-1")
        # run-a2 is known only from its audit rows (no agent_runs row)
        a2ctx = actx.model_copy(update={"run_id": "run-a2"})
        results = svc.write(actx, [
            {"note": same, "type": "Preference"},
            {"note": "Team deploys on obsidianheron days", "type": "Context", "scopeHint": "agent"},
        ]) + svc.write(a2ctx, [
            {"note": "Team reviews on saffronlynx days", "type": "Context", "scopeHint": "agent"},
        ])
        assert [r.disposition for r in results] == ["written"] * 3
        assert [r.final_scope["user_id"] for r in results] == ["u-a", None, None]
        b_steps = svc.sources.steps("run-b")

        svc.purge_user("u-a")

        assert svc.sources.steps("run-b") == b_steps  # same text, another user's row: kept
        assert svc.get_note(b.note_id) is not None
        for r in results:
            assert svc.get_note(r.note_id) is None
        assert svc.sources.steps("run-a") == [] and svc.sources.steps("run-a2") == []
        assert svc.sources.ledger_rows("run-a") == [] and svc.sources.ledger_rows("run-a2") == []
        assert _files_containing(home, ["obsidianheron", "saffronlynx"]) == {}
        assert svc.sources.get_agent_run("run-b") is not None


def test_purge_revokes_the_users_api_keys_and_forgets_whom_they_bound(home, open_service):
    """A key bound to the purged user stops authenticating and no longer names the user;
    its row stays revoked, so the home's API stays locked; other keys keep working."""
    import pytest

    from memory_pipelines.errors import AuthenticationError
    from memory_pipelines.keys import Authenticator

    with open_service() as svc:
        svc.add_company("co-1")
        svc.add_user("u-zanzibarquokka", company_id="co-1")
        gone = svc.create_api_key(company_id="co-1", user_id="u-zanzibarquokka")
        kept = svc.create_api_key(company_id="co-1")
        counts = svc.purge_user("u-zanzibarquokka")
        assert counts["api_keys"] == 1
        auth = Authenticator(svc.sources)
        with pytest.raises(AuthenticationError):
            auth.authenticate(f"Bearer {gone}")
        assert auth.authenticate(f"Bearer {kept}")["company_id"] == "co-1"
        rows = svc.list_api_keys()
        assert len(rows) == 2 and all(r["user_id"] != "u-zanzibarquokka" for r in rows)
        assert sum(r["revoked_at"] is not None for r in rows) == 1
    assert _files_containing(home, ["zanzibarquokka"]) == {}
