"""``memory-pipelines history NOTE_ID [--home H] [--json]``: what happened to a note, one
row per lifecycle event (CONTRACT §2.7)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tabulate import tabulate

from memory_pipelines.apps.terminal import printable, printable_json
from memory_pipelines.errors import MemoryPipelineError, NotFoundError

if TYPE_CHECKING:
    from memory_pipelines.note_events import NoteEvent

HOME_HELP = "memory home (default: $MEMORY_HOME or ./.memory)"


def _short(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _why(event: NoteEvent) -> str:
    details = event.details
    for key in ("reason", "comment"):
        if isinstance(details.get(key), str) and details[key].strip():
            text = details[key]
            return text if not details.get("rule") else f"{details['rule']}: {text}"
    return str(details.get("rule") or "")


def render_history(note_id: str, events: Sequence[NoteEvent]) -> str:
    """The events as a table: at, event, actor, phase, status before -> after, related
    note ids and the reason (rule first); control characters escaped."""
    rows = [
        [
            e.at.isoformat(timespec="seconds") if e.at else "-",
            e.event,
            e.actor,
            e.phase or "-",
            f"{e.status_before or '-'} -> {e.status_after or '-'}",
            ", ".join(e.related_note_ids) or "-",
            _short(_why(e), 60) or "-",
        ]
        for e in events
    ]
    table = tabulate(
        rows,
        headers=["at", "event", "actor", "phase", "status", "related", "reason"],
        tablefmt="simple",
    )
    return printable(f"History of note {note_id} ({len(events)} events)\n\n{table}", keep="\n")


def history_command(argv: list[str] | None = None) -> int:
    """Print a note's history (the operator's view: any note of the home)."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines history",
        description="Print what happened to a note: its lifecycle events, oldest first.",
    )
    parser.add_argument("note_id", help="the note's id")
    parser.add_argument("--home", default=None, help=HOME_HELP)
    parser.add_argument("--json", action="store_true", help="print the events as JSON")
    args = parser.parse_args(argv)
    from memory_pipelines.home import existing_home

    existing_home(args.home)  # a typo is refused (exit 2), never opened as a new empty home
    try:
        from memory_pipelines.history.read import history_for_key
        from memory_pipelines.service import MemoryService

        with MemoryService.from_env(args.home) as svc:
            events = history_for_key(svc.context, None, args.note_id)
    except NotFoundError as e:
        print(f"memory-pipelines history: {printable(str(e))}", file=sys.stderr)
        return 1
    except MemoryPipelineError as e:
        print(f"memory-pipelines history: {printable(str(e))}", file=sys.stderr)
        return 2
    if args.json:
        body = {"note_id": args.note_id, "events": [e.model_dump(mode="json") for e in events]}
        print(printable_json(json.dumps(body, indent=2, ensure_ascii=False)))
    else:
        print(render_history(args.note_id, events))
    return 0


#: merged into ``memory_pipelines.apps.cli.COMMANDS``
COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "history": (history_command, "print a note's lifecycle events (--json: as JSON)"),
}
