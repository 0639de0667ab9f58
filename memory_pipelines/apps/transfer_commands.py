"""``memory-pipelines export`` and ``memory-pipelines import``: notes, examples and their
history to and from a ``.jsonl`` or ``.parquet`` file (see
:mod:`memory_pipelines.history.transfer`); the migration path between homes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from memory_pipelines.apps.terminal import printable
from memory_pipelines.errors import MemoryPipelineError, first_line

HOME_HELP = "memory home (default: $MEMORY_HOME or ./.memory)"


def export_command(argv: list[str]) -> int:
    """``memory-pipelines export --home H --out FILE [--agent A] [--user U] [--company C]
    [--no-vectors]``: prints how many notes and examples it wrote."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines export",
        description="Write notes and examples (any status, every field, their history and "
        "vectors) to a .jsonl or .parquet file outside the memory home.",
    )
    parser.add_argument("--home", default=None, help=HOME_HELP)
    parser.add_argument("--out", required=True, help="the file to write (.jsonl or .parquet)")
    parser.add_argument("--agent", default=None, help="only notes and examples of this agent")
    parser.add_argument("--user", default=None, help="only those of this user")
    parser.add_argument("--company", default=None, help="only those of this company")
    parser.add_argument(
        "--no-vectors", action="store_true", help="leave vectors out (the import re-embeds)"
    )
    args = parser.parse_args(argv)
    from memory_pipelines.home import existing_home
    from memory_pipelines.service import MemoryService

    existing_home(args.home)  # a typo is refused (exit 2), never opened as a new empty home
    try:
        with MemoryService.from_env(args.home) as svc:
            written = svc.export_notes(
                args.out,
                agent_id=args.agent,
                user_id=args.user,
                company_id=args.company,
                include_vectors=not args.no_vectors,
            )
    except MemoryPipelineError as e:
        print(f"memory-pipelines export: {printable(first_line(e))}", file=sys.stderr)
        return 1
    print(f"exported {written} notes and examples to {printable(args.out)}")
    return 0


def import_command(argv: list[str]) -> int:
    """``memory-pipelines import --home H FILE``: prints the counts (imported, skipped ...)."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines import",
        description="Import an export file into the memory home, keeping ids, fields and "
        "history (validated whole first; importing it again adds nothing).",
    )
    parser.add_argument("file", help="a .jsonl or .parquet file written by `export`")
    parser.add_argument("--home", default=None, help=HOME_HELP)
    args = parser.parse_args(argv)
    from memory_pipelines.service import MemoryService

    try:
        with MemoryService.from_env(args.home) as svc:
            counts = svc.import_notes(args.file)
    except MemoryPipelineError as e:
        print(f"memory-pipelines import: {printable(first_line(e))}", file=sys.stderr)
        return 1
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    return 0


#: subcommand -> (its function, one-line help), merged into ``apps.cli.COMMANDS``
COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "export": (export_command, "write notes, examples and history to .jsonl/.parquet"),
    "import": (import_command, "import an export file (idempotent)"),
}
