"""Note text printed by the CLI cannot drive the terminal: escape sequences, NULs, bidi
overrides and other invisible controls are shown escaped (``\\x1b``, ``\\u202e``)."""

from __future__ import annotations

import json
import re

import pytest

from memory_pipelines.apps.cli import inventory_command, why_command
from memory_pipelines.apps.terminal import printable, printable_json
from memory_pipelines.notes import Note

HOSTILE = "User likes \x1b[31mred\x00\u202e tea"
AGENT = "agent-1"

#: what a terminal must never receive raw: C0 (but newline), DEL, C1, bidi and
#: invisible format characters
RAW_CONTROL = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u00ad\u061c\u200b\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff]"
)


@pytest.fixture
def hostile_home(tmp_path, monkeypatch, open_service):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    for name in ("MEMORY_HOME", "MEMORY_LANCE_URI", "MEMORY_SQL_URL", "MEMORY_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    with open_service(home) as svc:
        svc.configure_agent(AGENT, note_injection_strategy="Recent")
        svc.add_note(HOSTILE, agent_id=AGENT)
        # an id with controls is refused at the boundary now; a row stored before that
        # (or by another writer of the table) still reaches the CLI's tables
        svc.save_notes([Note(note="Plain note about tea", agent_id="agent\x1b]0;owned\x07")])
    return home


def test_printable_escapes_controls_and_keeps_text():
    assert printable(HOSTILE) == "User likes \\x1b[31mred\\x00\\u202e tea"
    assert printable("a\nb\tc") == "a\\nb\\tc"
    assert printable("a\nb\tc", keep="\n") == "a\nb\\tc"
    assert printable("\x85\x7f\u2066\ufeff\U000e0041") == "\\x85\\x7f\\u2066\\ufeff\\U000e0041"
    text = "Café naïve 東京 👩\u200d💻 \\x1b"  # letters, emoji sequences, a literal backslash
    assert printable(text) == text


def test_printable_json_stays_valid_json_with_the_same_values():
    doc = json.dumps({"note": HOSTILE + "\x85\u2028"}, ensure_ascii=False)
    safe = printable_json(doc)
    assert not RAW_CONTROL.search(safe)
    assert json.loads(safe) == {"note": HOSTILE + "\x85\u2028"}


def test_why_prints_no_raw_control_characters(hostile_home, capsys):
    assert why_command(["tea", "--agent", AGENT, "--home", str(hostile_home)]) == 0
    out = capsys.readouterr().out
    assert "red" in out
    assert not RAW_CONTROL.search(out), repr(out)
    assert "\\x1b[31mred\\x00\\u202e" in out


def test_why_json_prints_no_raw_control_characters(hostile_home, capsys):
    argv = ["tea", "--agent", AGENT, "--home", str(hostile_home), "--json"]
    assert why_command(argv) == 0
    out = capsys.readouterr().out
    assert not RAW_CONTROL.search(out), repr(out)
    notes = json.loads(out)["notes"]
    assert HOSTILE in [n["note"] for n in notes]  # escaped for the terminal, same value


def test_inventory_prints_no_raw_control_characters(hostile_home, capsys):
    assert inventory_command(["--home", str(hostile_home)]) == 0
    out = capsys.readouterr().out
    assert not RAW_CONTROL.search(out), repr(out)
    assert "agent\\x1b]0;owned\\x07" in out
