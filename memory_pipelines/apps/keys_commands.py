"""``memory-pipelines keys create|list|revoke``: the HTTP API keys of a memory home
(CONTRACT §2.8). ``create`` prints the secret as its last line; ``list --json`` prints
the rows as JSON; errors print one line on stderr and exit 1."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memory_pipelines.apps.admin_commands import HOME_HELP
from memory_pipelines.apps.terminal import printable, printable_json
from memory_pipelines.errors import MemoryPipelineError
from memory_pipelines.keys import ROLES, binding, key_id_of, role_of


def _scope_pair(value: str) -> tuple[str, str]:
    dim, sep, v = value.partition("=")
    if not sep or not dim or not v:
        raise argparse.ArgumentTypeError(f"{value!r} is not DIMENSION=VALUE")
    return dim, v


def _keys_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines keys", description="manage the HTTP API keys of a memory home"
    )
    sub = parser.add_subparsers(dest="action", required=True)

    create = sub.add_parser("create", help="create a key and print its secret (last line)")
    create.add_argument("--home", default=None, help=HOME_HELP)
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument("--admin", action="store_true", help="a key that may act for any context")
    who.add_argument("--company", default=None, help="the company the key is bound to")
    create.add_argument("--agent", default=None, help="also bind the key to this agent")
    create.add_argument("--user", default=None, help="also bind the key to this user")
    create.add_argument(
        "--primary-scope", nargs=2, metavar=("ENTITY", "RECORD"), default=None,
        help="the primary scope the key may claim",
    )  # fmt: skip
    create.add_argument(
        "--scope", action="append", type=_scope_pair, default=[], metavar="DIM=VALUE",
        help="a secondary scope the key may claim (repeatable)",
    )  # fmt: skip
    create.add_argument(
        "--role", choices=ROLES, default=None,
        help="what the key may do: agent (write, inject, explain, remember, proxy), analyst "
        "(also read and change notes, /ui) or admin; default: agent with --agent, else analyst",
    )  # fmt: skip

    listing = sub.add_parser("list", help="list keys (id, role, binding, created, revoked)")
    listing.add_argument("--home", default=None, help=HOME_HELP)
    listing.add_argument("--json", action="store_true", help="print JSON")

    revoke = sub.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id")
    revoke.add_argument("--home", default=None, help=HOME_HELP)
    return parser


def keys_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines keys create|list|revoke``."""
    parser = _keys_parser()
    args = parser.parse_args(argv)
    if (
        args.action == "create"
        and args.admin
        and (args.agent or args.user or args.primary_scope or args.scope)
    ):
        parser.error("--admin takes no --agent, --user or scope")
    from memory_pipelines.service import MemoryService

    if args.action == "create" and args.admin and args.role not in (None, "admin"):
        parser.error(f"--admin is role admin, not {args.role}")
    if args.action != "create":  # list and revoke need a home; create makes one
        from memory_pipelines.home import existing_home

        existing_home(args.home)
    try:
        with MemoryService.from_env(args.home) as svc:
            if args.action == "create":
                secret = svc.create_api_key(
                    company_id=args.company,
                    agent_id=args.agent,
                    user_id=args.user,
                    admin=args.admin,
                    primary_scope=tuple(args.primary_scope) if args.primary_scope else None,
                    secondary_scopes=dict(args.scope) or None,
                    role=args.role,
                )
                print(f"created API key {key_id_of(secret)}; its secret is shown only once:")
                print(secret)
            elif args.action == "list":
                _print_keys(svc.list_api_keys(), as_json=args.json)
            else:
                svc.revoke_api_key(args.key_id)
                print(f"revoked API key {args.key_id}")
    except MemoryPipelineError as e:
        print(f"memory-pipelines keys: {e}", file=sys.stderr)
        return 1
    return 0


def _print_keys(keys: list[dict[str, Any]], *, as_json: bool) -> None:
    rows = [
        {
            "key_id": k["key_id"],
            "role": role_of(k),
            "binding": binding(k),
            "created_at": k["created_at"].isoformat(),
            "revoked_at": k["revoked_at"].isoformat() if k.get("revoked_at") else None,
        }
        for k in keys
    ]
    if as_json:
        print(printable_json(json.dumps(rows, indent=2)))
        return
    print(f"{'KEY_ID':<14} {'ROLE':<8} {'CREATED':<32} {'REVOKED':<32} BINDING")
    for r in rows:
        print(
            f"{r['key_id']:<14} {r['role']:<8} {r['created_at']:<32} {r['revoked_at'] or '-':<32} "
            f"{printable(r['binding'])}"
        )
