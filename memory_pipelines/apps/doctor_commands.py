"""``memory-pipelines doctor [--home H] [--repair] [--json]``: check that every note and
example table of a home reads at its latest version, name the files it misses, and with
``--repair`` commit the newest version that reads as the newest one again, saying what
that cannot keep (see :mod:`memory_pipelines.store.doctor`)."""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from memory_pipelines.apps.terminal import printable, printable_json

HOME_HELP = "memory home (default: $MEMORY_HOME or ./.memory)"
#: ids of notes a restore cannot keep that the report names one by one
SHOWN_IDS = 20


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines doctor",
        description="Check that the note and example tables of a memory home read at their "
        "latest version and name the files they miss; with --repair, restore the newest "
        "version that reads (it says what it cannot keep). Exit 0: healthy (or repaired); "
        "1: a table does not read (or could not be repaired).",
    )
    parser.add_argument("--home", default=None, help=HOME_HELP)
    parser.add_argument(
        "--repair", action="store_true",
        help="restore the newest readable version of each table that does not read",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    return parser


def _describe(check: Any) -> list[str]:
    if check.readable:
        return [f"{check.name}: version {check.latest_version} reads ({check.rows_latest} rows)"]
    lines = [f"{check.name}: version {check.latest_version} does not read: {check.error}"]
    for path in check.missing_files[:SHOWN_IDS]:
        lines.append(f"  missing file: {path}")
    if len(check.missing_files) > SHOWN_IDS:
        lines.append(f"  ... and {len(check.missing_files) - SHOWN_IDS} more missing files")
    if check.readable_version is None:
        lines.append("  no earlier version reads either: restore the home from a backup")
        return lines
    lines.append(
        f"  newest version that reads: {check.readable_version} ({check.rows_readable} rows;"
        f" versions {', '.join(map(str, check.skipped_versions))} would be skipped)"
    )
    lines.append("  " + _not_kept(check))
    return lines


def _not_kept(check: Any) -> str:
    if not check.lost_ids and not check.lost_unreadable_rows:
        return "a restore keeps every row the latest version's intact files hold"
    parts = []
    if check.lost_ids:
        shown = ", ".join(check.lost_ids[:SHOWN_IDS])
        more = f" and {len(check.lost_ids) - SHOWN_IDS} more" if len(check.lost_ids) > SHOWN_IDS else ""
        parts.append(f"{len(check.lost_ids)} row(s) written since ({shown}{more})")
    if check.lost_unreadable_rows:
        parts.append(f"{check.lost_unreadable_rows} row(s) in the missing files")
    return (
        "a restore cannot keep " + " and ".join(parts) + "; their history stays in the SQL"
        " sources (memory-pipelines history ID), and an export taken before can re-import them"
    )


def doctor_command(argv: list[str]) -> int:
    """Check (and with ``--repair`` restore) the note tables of a home."""
    args = _parser().parse_args(argv)
    from memory_pipelines.home import existing_home, sqlite_file
    from memory_pipelines.storage import lance_storage_options
    from memory_pipelines.store import EXAMPLES_TABLE, NOTES_TABLE
    from memory_pipelines.store.doctor import check_table

    home = existing_home(args.home)
    lance_uri = os.environ.get("MEMORY_LANCE_URI") or str((home / "lance").resolve())
    options = lance_storage_options(lance_uri) or None
    tables = [(name, f"{lance_uri.rstrip('/')}/{name}.lance") for name in (NOTES_TABLE, EXAMPLES_TABLE)]
    checks = [
        check_table(uri, name, options)
        for name, uri in tables
        if "://" in uri.removeprefix("file://") or Path(uri.removeprefix("file://")).is_dir()
    ]
    repaired: list[dict[str, Any]] = []
    broken = [c for c in checks if not c.readable]
    if args.repair and broken:
        sql_url = os.environ.get("MEMORY_SQL_URL") or f"sqlite:///{(home / 'memory.sqlite3').resolve()}"
        if sqlite_file(sql_url) is not None and not sqlite_file(sql_url).is_file():
            sql_url = ""
        repaired = _repair(broken, sql_url, options)
    ok = all(c.readable for c in checks) or (
        bool(repaired) and all(r.get("readable") for r in repaired) and len(repaired) == len(broken)
    )
    if args.json:
        body = {"home": str(home), "tables": [c.as_dict() for c in checks], "repaired": repaired, "ok": ok}
        print(printable_json(json.dumps(body, indent=2, default=str)))
        return 0 if ok else 1
    for check in checks:
        for line in _describe(check):
            print(printable(line))
    for r in repaired:
        if "error" in r:
            print(printable(f"{r['table']}: not repaired: {r['error']}"))
        else:
            print(printable(
                f"{r['table']}: restored version {r['restored_version']} as version"
                f" {r['new_version']}; it reads: {'yes' if r['readable'] else 'NO'}"
            ))  # fmt: skip
    if broken and not args.repair:
        fixable = [c for c in broken if c.readable_version is not None]
        if fixable:
            print(f"run `memory-pipelines doctor --home {home} --repair` to restore "
                  + ", ".join(f"{c.name} version {c.readable_version}" for c in fixable))  # fmt: skip
    return 0 if ok else 1


def _repair(broken: list[Any], sql_url: str, options: dict[str, str] | None) -> list[dict[str, Any]]:
    """Restore each broken table's newest readable version, holding the home's Memory
    Manager lease (when the home has its SQL sources) so no run writes meanwhile."""
    from memory_pipelines.clock import AwareClock
    from memory_pipelines.phases.lease import MANAGER_LEASE as lease
    from memory_pipelines.sources import Sources
    from memory_pipelines.store.doctor import check_table, restore_table

    clock = AwareClock()
    sources = Sources(sql_url, clock) if sql_url else None
    owner = f"{socket.gethostname()}:{os.getpid()}:doctor"
    if sources is not None and not sources.take_lease(lease, owner, clock() + timedelta(minutes=10)):
        holders = ", ".join(x["owner"] for x in sources.live_leases(lease)) or "another process"
        sources.close()
        return [
            {"table": c.name, "error": f"a Memory Manager run ({holders}) holds this home;"
             " let it finish (or stop it) and run the repair again"}
            for c in broken
        ]  # fmt: skip
    results: list[dict[str, Any]] = []
    try:
        for check in broken:
            if check.readable_version is None:
                results.append({"table": check.name, "error": "no version reads; restore from a backup"})
                continue
            new_version = restore_table(check.uri, check.readable_version, options)
            again = check_table(check.uri, check.name, options)
            results.append(
                {
                    "table": check.name,
                    "restored_version": check.readable_version,
                    "new_version": new_version,
                    "readable": again.readable,
                    "not_kept_ids": check.lost_ids,
                    "not_kept_unreadable_rows": check.lost_unreadable_rows,
                }
            )
    finally:
        if sources is not None:
            sources.release_lease(lease, owner)
            sources.close()
    return results


#: subcommand -> (its function, one-line help)
COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "doctor": (doctor_command, "check a home's tables; --repair restores the newest readable version"),
}


__all__ = ["COMMANDS", "doctor_command"]
