"""``memory-pipelines notes list|get|update|archive|erase`` and ``memory-pipelines agents
list|set`` (CONTRACT §2.9): the operator's commands over the administration service calls,
with the options of the HTTP routes. ``--json`` prints what the API answers; otherwise a
table (notes) or one line per agent. Errors print one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from memory_pipelines.apps.terminal import printable, printable_json
from memory_pipelines.errors import MemoryPipelineError
from memory_pipelines.limits import DEFAULT_PAGE_LIMIT as DEFAULT_LIMIT
from memory_pipelines.limits import MAX_PAGE_LIMIT as MAX_LIMIT
from memory_pipelines.notes import (
    AgentConfig,
    ExampleInjectionStrategy,
    Note,
    NoteInjectionStrategy,
    NoteStatus,
    NoteType,
    ProtectionTier,
)

HOME_HELP = "memory home (default: $MEMORY_HOME or ./.memory)"
TEXT_WIDTH = 60


def _limit(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 1 <= n <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{n} is outside 1..{MAX_LIMIT}")
    return n


def _json(value: Any) -> str:
    return printable_json(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _short(text: str | None, width: int = TEXT_WIDTH) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _note_rows(notes: list[Note]) -> list[list[Any]]:
    return [
        [
            n.id,
            n.created_at.isoformat(timespec="seconds") if n.created_at else "-",
            n.status,
            n.type,
            n.agent_id or "-",
            n.user_id or "-",
            n.company_id or "-",
            printable(_short(n.note)),
        ]
        for n in notes
    ]


NOTE_HEADERS = ["ID", "CREATED", "STATUS", "TYPE", "AGENT", "USER", "COMPANY", "NOTE"]


def _print_note(note: Note, as_json: bool) -> None:
    if as_json:
        print(_json(note.model_dump(mode="json")))
        return
    for name, value in note.model_dump(mode="json").items():
        if value not in (None, "", [], {}):
            print(f"{name:<32} {printable(str(value))}")


def _notes_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines notes",
        description="List, search, read, correct, archive and erase notes.",
    )
    sub = parser.add_subparsers(dest="action", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--home", default=None, help=HOME_HELP)
        p.add_argument("--json", action="store_true", help="print JSON (what the HTTP API answers)")

    ls = sub.add_parser("list", help="notes newest first, one page")
    common(ls)
    ls.add_argument("--agent", default=None, help="only this agent's notes")
    ls.add_argument("--user", default=None, help="only this user's notes")
    ls.add_argument("--company", default=None, help="only this company's notes")
    ls.add_argument("--status", default=None, choices=[s.value for s in NoteStatus])
    ls.add_argument("--q", default=None, help="every word must appear in the text (any case)")
    ls.add_argument("--limit", type=_limit, default=DEFAULT_LIMIT, help=f"1..{MAX_LIMIT}")
    ls.add_argument("--cursor", default=None, help="the next cursor a previous page printed")
    for name, help_ in (("get", "print one note"), ("archive", "archive a note"),
                        ("erase", "erase a note, its history and old versions for good")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("note_id")
        common(p)
    many = sub.add_parser(
        "add-many",
        help="add the notes of a JSON Lines file (one object of add_note's arguments a line)",
        description="Add every note of FILE (JSON Lines: one object a line holding add_note's "
        "arguments, `note` required; `-` reads standard input). The whole file is checked "
        "first: a bad line is named and nothing is saved. Texts are embedded in batches.",
    )
    many.add_argument("file", help="the JSON Lines file, or - for standard input")
    common(many)
    up = sub.add_parser("update", help="correct a note's text, type, status or tier")
    up.add_argument("note_id")
    common(up)
    up.add_argument("--note", default=None, help="the new text (re-embedded)")
    up.add_argument("--type", default=None, choices=[t.value for t in NoteType])
    up.add_argument("--status", default=None, choices=[s.value for s in NoteStatus])
    up.add_argument("--tier", default=None, choices=[t.value for t in ProtectionTier])
    return parser


def _jsonl(path: str) -> tuple[list[Any], list[int]]:
    """The objects of a JSON Lines file (``-``: standard input) and the line of each
    (blank lines are skipped); ``ValidationError`` naming the first bad line."""
    from memory_pipelines.errors import ValidationError

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValidationError(f"cannot read {path}: {e}") from None
    rows: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            raise ValidationError(f"line {number}: not JSON ({e})") from None
        lines.append(number)
    return rows, lines


def notes_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines notes list|get|update|archive|erase|add-many``."""
    args = _notes_parser().parse_args(argv)
    from memory_pipelines.home import existing_home
    from memory_pipelines.service import MemoryService

    existing_home(args.home)  # a typo is refused (exit 2), never opened as a new empty home
    try:
        rows, lines = _jsonl(args.file) if args.action == "add-many" else ([], [])
        with MemoryService.from_env(args.home) as svc:
            if args.action == "add-many":
                try:
                    saved = svc.add_notes(rows)
                except MemoryPipelineError as e:  # notes[i] -> the line it came from
                    where = re.sub(r"notes\[(\d+)\]\.?", lambda m: f"line {lines[int(m[1])]}: ", str(e))
                    raise type(e)(where) from None
                if args.json:
                    print(_json([n.model_dump(mode="json") for n in saved]))
                else:
                    print(f"added {len(saved)} notes")
            elif args.action == "list":
                page = svc.list_notes(
                    agent_id=args.agent,
                    user_id=args.user,
                    company_id=args.company,
                    status=args.status,
                    q=args.q,
                    limit=args.limit,
                    cursor=args.cursor,
                )
                if args.json:
                    print(_json(page.model_dump(mode="json")))
                elif not page.notes:
                    print("no notes")
                else:
                    print(tabulate(_note_rows(page.notes), headers=NOTE_HEADERS, tablefmt="plain"))
                    if page.next_cursor:
                        print(f"next page: --cursor {page.next_cursor}")
            elif args.action == "get":
                _print_note(svc.note(args.note_id), args.json)
            elif args.action == "update":
                _print_note(
                    svc.update_note(
                        args.note_id,
                        note=args.note,
                        type=args.type,
                        status=args.status,
                        protection_tier=args.tier,
                    ),
                    args.json,
                )
            elif args.action == "archive":
                _print_note(svc.archive_note(args.note_id), args.json)
            else:
                counts = svc.erase_note(args.note_id)
                print(_json(counts) if args.json else f"erased note {printable(args.note_id)}: {counts}")
    except MemoryPipelineError as e:
        print(f"memory-pipelines notes: {printable(str(e))}", file=sys.stderr)
        return 1
    return 0


def _flag(value: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "yes", "1", "on"):
        return True
    if low in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not true or false")


#: ``agents set`` option -> (AgentConfig field, argparse keyword arguments)
AGENT_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "--name": ("name", {}),
    "--status": ("status", {"choices": ["Active", "Inactive"]}),
    "--inject-notes": ("inject_notes", {"type": _flag, "metavar": "BOOL"}),
    "--max-notes": ("max_notes_to_inject", {"type": int}),
    "--strategy": (
        "note_injection_strategy",
        {"choices": [s.value for s in NoteInjectionStrategy]},
    ),
    "--inject-examples": ("inject_examples", {"type": _flag, "metavar": "BOOL"}),
    "--max-examples": ("max_examples_to_inject", {"type": int}),
    "--example-strategy": (
        "example_injection_strategy",
        {"choices": [s.value for s in ExampleInjectionStrategy]},
    ),
    "--allow-writes": ("allow_memory_write", {"type": _flag, "metavar": "BOOL"}),
    "--auto-archive": ("auto_archive_enabled", {"type": _flag, "metavar": "BOOL"}),
    "--note-retention-days": ("note_retention_days", {"type": int}),
    "--example-retention-days": ("example_retention_days", {"type": int}),
    "--scope-config": ("scope_config", {"type": json.loads, "metavar": "JSON"}),
    "--reranker-config": ("reranker_config", {"type": json.loads, "metavar": "JSON"}),
}


def _agents_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines agents", description="List and configure agents."
    )
    sub = parser.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="every configured agent")
    ls.add_argument("--home", default=None, help=HOME_HELP)
    ls.add_argument("--json", action="store_true")
    st = sub.add_parser("set", help="create or update an agent (other fields are kept)")
    st.add_argument("agent_id")
    st.add_argument("--home", default=None, help=HOME_HELP)
    st.add_argument("--json", action="store_true")
    for option, (field, kwargs) in AGENT_OPTIONS.items():
        st.add_argument(option, dest=field, default=None, **kwargs)
    return parser


def _agent_line(a: AgentConfig) -> str:
    return printable(
        f"{a.agent_id:<24} {a.status:<9} notes={a.max_notes_to_inject} "
        f"strategy={a.note_injection_strategy} examples={a.max_examples_to_inject if a.inject_examples else 0} "
        f"writes={'on' if a.allow_memory_write else 'off'}"
    )


def agents_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines agents list|set``."""
    args = _agents_parser().parse_args(argv)
    from memory_pipelines.home import existing_home
    from memory_pipelines.service import MemoryService

    if args.action == "list":  # `agents set` may configure the first agent of a new home
        existing_home(args.home)  # a typo is refused (exit 2), never opened as a new empty home
    try:
        with MemoryService.from_env(args.home) as svc:
            if args.action == "list":
                agents = svc.list_agents()
                if args.json:
                    print(_json([a.model_dump(mode="json") for a in agents]))
                else:
                    for a in agents:
                        print(_agent_line(a))
            else:
                fields = {
                    field: getattr(args, field)
                    for field, _ in AGENT_OPTIONS.values()
                    if getattr(args, field) is not None
                }
                agent = svc.configure_agent(args.agent_id, **fields)
                print(_json(agent.model_dump(mode="json")) if args.json else _agent_line(agent))
    except MemoryPipelineError as e:
        print(f"memory-pipelines agents: {printable(str(e))}", file=sys.stderr)
        return 1
    return 0


#: merged into ``memory_pipelines.apps.cli.COMMANDS``
COMMANDS = {
    "notes": (notes_command, "list, search, read, correct, archive and erase notes"),
    "agents": (agents_command, "list and configure agents"),
}
