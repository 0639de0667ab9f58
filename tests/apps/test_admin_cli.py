"""``memory-pipelines notes ...`` and ``memory-pipelines agents ...`` (CONTRACT §2.9)."""

from __future__ import annotations

import json

import pytest

from memory_pipelines.apps import cli
from memory_pipelines.clock import FakeClock
from memory_pipelines.service import MemoryService


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


pytestmark = pytest.mark.usefixtures("hashing_commands")  # the commands open ``home``


def _seed(home, n=0):
    clock = FakeClock()
    with MemoryService.from_env(home, clock=clock) as svc:
        svc.configure_agent("a1")
        ids = {}
        for name, fields in (
            ("tea", {"agent_id": "a1", "user_id": "u1", "company_id": "acme"}),
            ("coffee", {"agent_id": "a2", "user_id": "u2", "company_id": "globex"}),
        ):
            ids[name] = svc.add_note(f"The user likes {name} 100%.", **fields).id
            clock.advance(seconds=1)
        for i in range(n):
            ids[f"n{i}"] = svc.add_note(f"filler {i}", agent_id="a1").id
            clock.advance(seconds=1)
    return ids


def test_notes_list_filters_search_and_json(capsys, home):
    ids = _seed(home)
    code, out, _ = run(capsys, "notes", "list", "--home", home)
    assert code == 0 and "The user likes tea 100%." in out and "coffee" in out
    code, out, _ = run(capsys, "notes", "list", "--home", home, "--agent", "a2", "--json")
    body = json.loads(out)
    assert [n["id"] for n in body["notes"]] == [ids["coffee"]] and body["next_cursor"] is None
    for option, value, expected in (
        ("--user", "u1", "tea"), ("--company", "globex", "coffee"), ("--q", "TEA 100%", "tea")
    ):
        code, out, _ = run(capsys, "notes", "list", "--home", home, option, value, "--json")
        assert [n["id"] for n in json.loads(out)["notes"]] == [ids[expected]], option
    code, out, _ = run(capsys, "notes", "list", "--home", home, "--q", "1_0%")
    assert code == 0 and out.strip() == "no notes"
    code, out, _ = run(capsys, "notes", "list", "--home", home, "--status", "Archived", "--json")
    assert json.loads(out)["notes"] == []


def test_notes_paging_between_writes_has_no_gaps_or_repeats(capsys, home):
    ids = _seed(home, n=7)
    seen, cursor, writes = [], None, 0
    while True:
        extra = ["--cursor", cursor] if cursor else []
        code, out, _ = run(capsys, "notes", "list", "--home", home, "--limit", "3", "--json", *extra)
        page = json.loads(out)
        seen += [n["id"] for n in page["notes"]]
        with MemoryService.from_env(home) as svc:  # another writer, between pages (real clock)
            svc.add_note(f"written between pages {writes}", agent_id="a1")
            writes += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) and set(ids.values()) <= set(seen)


def test_notes_get_update_archive_erase(capsys, home):
    ids = _seed(home)
    tea = ids["tea"]
    code, out, _ = run(capsys, "notes", "get", tea, "--home", home, "--json")
    assert code == 0 and json.loads(out)["note"] == "The user likes tea 100%."
    code, out, _ = run(
        capsys, "notes", "update", tea, "--home", home, "--note", "The user likes green tea.",
        "--type", "Context", "--tier", "Protected", "--json",
    )
    body = json.loads(out)
    assert (body["note"], body["type"], body["protection_tier"]) == (
        "The user likes green tea.", "Context", "Protected"
    )
    code, out, _ = run(capsys, "notes", "update", tea, "--home", home, "--status", "Revoked")
    assert code == 0 and "Revoked" in out
    code, out, _ = run(capsys, "notes", "archive", tea, "--home", home, "--json")
    assert json.loads(out)["status"] == "Archived"
    with MemoryService.from_env(home) as svc:
        assert [e.event for e in svc.history(tea)] == ["created", "updated", "revoked", "archived"]
    code, out, _ = run(capsys, "notes", "erase", tea, "--home", home, "--json")
    assert code == 0 and json.loads(out)["notes"] == 1
    code, _, err = run(capsys, "notes", "get", tea, "--home", home)
    assert code == 1 and "does not exist" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["notes", "get", "missing"],
        ["notes", "archive", "missing"],
        ["notes", "erase", "missing"],
        ["notes", "update", "missing", "--status", "Active"],
        ["notes", "update", "TEA"],  # nothing to change
        ["notes", "update", "TEA", "--note", "  "],
        ["notes", "list", "--cursor", "garbage"],
        ["agents", "set", "a9", "--max-notes", "101"],
    ],
)
def test_errors_are_one_line_and_exit_1(capsys, home, argv):
    ids = _seed(home)
    argv = [ids["tea"] if a == "TEA" else a for a in argv]
    code, _, err = run(capsys, *argv, "--home", home)
    assert code == 1 and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "argv",
    [
        ["notes", "list", "--limit", "0"],
        ["notes", "list", "--limit", "501"],
        ["notes", "list", "--status", "Gone"],
        ["notes", "update", "x", "--type", "Wish"],
        ["agents", "set", "a1", "--strategy", "Loud"],
    ],
)
def test_bad_options_are_usage_errors(capsys, home, argv):
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--home", str(home)])
    assert exc.value.code == 2


def test_agents_list_and_set(capsys, home):
    code, out, _ = run(capsys, "agents", "set", "analyst", "--home", home, "--max-notes", "7",
                       "--strategy", "Recent", "--allow-writes", "false", "--json")
    body = json.loads(out)
    assert code == 0 and body["max_notes_to_inject"] == 7 and body["allow_memory_write"] is False
    code, out, _ = run(capsys, "agents", "set", "analyst", "--home", home, "--max-examples", "2")
    assert code == 0 and "notes=7" in out  # other fields kept
    code, out, _ = run(capsys, "agents", "list", "--home", home, "--json")
    assert [a["agent_id"] for a in json.loads(out)] == ["analyst"]
    code, out, _ = run(capsys, "agents", "list", "--home", home)
    assert out.startswith("analyst")
