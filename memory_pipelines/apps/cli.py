"""The ``memory-pipelines`` command line: every command, its options and what it runs.

:func:`main` routes ``memory-pipelines COMMAND ARGS`` to the command's function
(:data:`COMMANDS`: below, or in an ``apps/*_commands.py`` module: notes and agents,
history, export/import, doctor, keys, the MCP, model and Dask servers), which parses ``ARGS`` with that command's parser and calls plain
functions of the domain (``explain``, ``note_inventory``, the service) or of an app
(``apps.http.serve``, ``apps.demo.run_demo`` ...). The apps that bring a server stack or
Dagster with them (``http``, ``proxy``, ``mcp_server``, ``demo``) are imported when their
command runs, so ``memory-pipelines why`` never loads Dagster or uvicorn.
``memory-pipelines bench NAME ARGS`` calls ``memory_pipelines.bench.NAME.main(ARGS)``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

# Only light modules at the top: `--help` of every command loads neither the service nor
# LanceDB, SQLAlchemy, pandas, litellm or Dagster; each command imports what it runs.
from memory_pipelines.apps import (
    admin_commands,
    db_commands,
    doctor_commands,
    history_commands,
    keys_commands,
    server_commands,
    transfer_commands,
)
from memory_pipelines.apps.progress import add_progress_flag
from memory_pipelines.apps.terminal import printable, printable_json
from memory_pipelines.errors import EmbeddingError, MemoryPipelineError, first_line
from memory_pipelines.keys import tcp_port

HOME_HELP = "memory home (default: $MEMORY_HOME or ./.memory)"
LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


def _app(name: str) -> ModuleType:
    """``memory_pipelines.apps.NAME``, imported when its command runs (see the module
    docstring)."""
    return importlib.import_module(f"memory_pipelines.apps.{name}")


# --------------------------------------------------------------------------- servers


def serve_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines serve``: open the memory home and serve the API until stopped."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines serve",
        description="Serve the memory write/inject HTTP API (once the home has an API key, "
        "requests need one; a non-loopback --host needs a key: `memory-pipelines keys create`).",
    )
    parser.add_argument("--home", default=None, help=HOME_HELP)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=tcp_port, default=8765, help="port (default: 8765)")
    parser.add_argument(
        "--llm",
        default=None,
        help="litellm model for the judge (default: $MEMORY_LLM_MODEL or offline)",
    )
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    args = parser.parse_args(argv)
    return _app("http").serve(
        args.home, args.host, args.port, llm=args.llm, log_level=args.log_level
    )


def proxy_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines proxy``: serve the OpenAI-compatible memory proxy until stopped."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines proxy",
        description="Give any OpenAI-compatible client memory: an OpenAI-compatible endpoint "
        "in front of a litellm model that injects memory and executes memoryWrites.",
    )
    parser.add_argument("--home", default=None, help=HOME_HELP)
    parser.add_argument(
        "--model", required=True,
        help="litellm model string of the upstream, e.g. openai/gpt-4o-mini (OPENAI_API_BASE "
        "and OPENAI_API_KEY apply to openai/...), or 'offline': a built-in deterministic demo "
        "model to try the proxy with no key or download",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=tcp_port, default=8766, help="port (default: 8766)")
    parser.add_argument(
        "--passthrough", action="store_true",
        help="forward requests without X-Memory-Agent untouched (default: refuse them)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=_env_number("MEMORY_PROXY_TIMEOUT", float),
        help="seconds to wait for the upstream model before answering 504 (default: "
        "MEMORY_PROXY_TIMEOUT, else 120)",
    )  # fmt: skip
    parser.add_argument(
        "--max-body-bytes", type=int, default=_env_number("MEMORY_PROXY_MAX_BODY_BYTES", int),
        help="largest request body; a larger one is answered 413 (default: "
        "MEMORY_PROXY_MAX_BODY_BYTES, else 8 MiB)",
    )  # fmt: skip
    parser.add_argument(
        "--max-injected-tokens", action="append", default=[], metavar="[AGENT=]N",
        help="token budget of the system message the proxy adds per turn: N for every agent, "
        "AGENT=N for one (repeatable); the lowest-ranked notes are left out to fit "
        "(default: MEMORY_PROXY_MAX_INJECTED_TOKENS, else no budget)",
    )  # fmt: skip
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    args = parser.parse_args(argv)
    if args.timeout is not None and not args.timeout > 0:
        parser.error("--timeout must be a positive number of seconds")
    if args.max_body_bytes is not None and args.max_body_bytes < 1:
        parser.error("--max-body-bytes must be a positive integer")
    budgets: dict[str, int] = {}
    specs = args.max_injected_tokens or [
        s for s in os.environ.get("MEMORY_PROXY_MAX_INJECTED_TOKENS", "").split(",") if s.strip()
    ]
    for spec in specs:
        agent, _, number = spec.strip().rpartition("=")
        if not number.strip().isdigit() or int(number) < 1:
            parser.error(f"--max-injected-tokens takes N or AGENT=N with N a positive integer, got {spec!r}")
        budgets[agent.strip() or "*"] = int(number)
    return _app("proxy").serve(
        args.home,
        args.model,
        args.host,
        args.port,
        passthrough=args.passthrough,
        log_level=args.log_level,
        timeout=args.timeout,
        max_body_bytes=args.max_body_bytes,
        max_injected_tokens=budgets or None,
    )


def _env_number(name: str, kind: type) -> Any:
    """A number from the environment variable ``name`` (None when unset); a malformed one
    is refused when the command starts."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise SystemExit(f"memory-pipelines: {name} must be a number, got {raw!r}") from None


# --------------------------------------------------------------------------- the Memory Manager


def demo_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines demo [--home H]``: seed (first run) and run the jobs through Dagster."""
    parser = argparse.ArgumentParser(prog="memory-pipelines demo", description=demo_command.__doc__)
    parser.add_argument(
        "--home", default=None, help="memory home (default $MEMORY_HOME or ./.memory)"
    )
    add_progress_flag(parser)
    args = parser.parse_args(argv)
    return _app("demo").run_demo(args.home, progress_bar=args.progress)


def cycle_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines cycle [--home H] [--force-maintenance]``: run one cycle in process
    (with ``DAGSTER_HOME`` set: through that Dagster instance, recorded in its catalog)."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines cycle",
        description="Run one Memory Manager cycle (and maintenance when its trigger fires). "
        "With DAGSTER_HOME set, the cycle runs through that Dagster instance as the "
        "memory_manager_cycle job (and memory_maintenance), so the UI shows the runs.",
    )
    parser.add_argument(
        "--home", default=None, help="memory home (default $MEMORY_HOME or ./.memory)"
    )
    parser.add_argument(
        "--force-maintenance", action="store_true", help="run the maintenance phases now"
    )
    parser.add_argument(
        "--wait", type=float, default=None, metavar="SECONDS",
        help="while another Memory Manager run holds the home, wait this long for it, then "
        "exit 75 having changed nothing (default: 600)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    from memory_pipelines.home import existing_home

    existing_home(args.home)  # a typo is refused (exit 2), never opened as a new empty home
    from importlib.util import find_spec

    dagster_home = os.environ.get("DAGSTER_HOME", "").strip()
    if dagster_home and find_spec("dagster") is not None:
        return _app("recorded_cycle").run_recorded_cycle(
            args.home, dagster_home, args.force_maintenance
        )
    if dagster_home:
        print("note: DAGSTER_HOME is set but Dagster is not installed "
              "(pip install 'memory-pipelines[dagster]'); this cycle is not recorded there",
              file=sys.stderr)  # fmt: skip
    from dataclasses import replace

    from tabulate import tabulate

    from memory_pipelines.phases.cycle import CycleError, cycle_message
    from memory_pipelines.phases.lease import ManagerBusyError
    from memory_pipelines.service import MemoryService

    with MemoryService.from_env(args.home) as svc:
        if args.wait is not None:
            svc.manager_config = replace(svc.manager_config, lease_wait_s=max(0.0, args.wait))
        try:
            report = svc.manager.run_cycle(force_maintenance=args.force_maintenance)
        except CycleError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except ManagerBusyError as e:  # another run kept the home past the wait: try later
            print(f"memory-pipelines cycle: {e}", file=sys.stderr)
            return 75
        rows = [(k, v) for k, v in report.items()]
        print(tabulate(rows, headers=["count", "value"], tablefmt="github"))
        print()
        print(cycle_message(report))
    return 0


def inventory_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines inventory [--home H]``: print the note inventory of a home."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines inventory", description=inventory_command.__doc__
    )
    parser.add_argument(
        "--home", default=None, help="memory home (default $MEMORY_HOME or ./.memory)"
    )
    args = parser.parse_args(argv)
    from memory_pipelines.home import existing_home
    from memory_pipelines.inventory import note_inventory
    from memory_pipelines.service import MemoryService

    existing_home(args.home)  # a typo is refused (exit 2), never opened as a new empty home
    with MemoryService.from_env(args.home) as svc:
        for name, frame in note_inventory(svc.context).items():
            print(f"## {name.replace('_', ' ')}\n")
            if frame.empty:
                print("_none_\n")
                continue
            print(printable(frame.to_markdown(index=name == "agent_status"), keep="\n"))
            print()
    return 0


def why_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines why --agent A [--user U] [--company C] [--all-scopes] [--home H]
    [--json] [--as-of ISO] TOPIC``: scoped to the context like the API unless ``--all-scopes``."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines why",
        description="Explain why an agent does (or does not) remember a topic: status, scope, "
        "rank, provenance and retirement of every note about it.",
    )
    parser.add_argument("topic", help="words to look for in the notes")
    parser.add_argument("--agent", required=True, help="agent id")
    parser.add_argument("--user", default=None, help="user id of the context")
    parser.add_argument("--company", default=None, help="company id of the context")
    parser.add_argument(
        "--input", dest="current_input", default=None, help="the run's input (default: the topic)"
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="notes to explain (default 10)"
    )
    parser.add_argument(
        "--all-scopes",
        action="store_true",
        help="operator view: also show the agent's notes outside the context's scope "
        "(other users', companies' and tenants'), with the rule that excludes each",
    )
    parser.add_argument(
        "--all-agents",
        action="store_true",
        help="with --all-scopes, also search other agents' notes",
    )
    parser.add_argument("--home", default=None, help=HOME_HELP)
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON")
    parser.add_argument(
        "--as-of", default=None, help="explain as of this ISO instant with a timezone (time travel)"
    )
    args = parser.parse_args(argv)
    from memory_pipelines.apps.why_table import render_table
    from memory_pipelines.explain import DEFAULT_LIMIT, explain
    from memory_pipelines.history.as_of import check_as_of
    from memory_pipelines.home import existing_home
    from memory_pipelines.notes import RunContext
    from memory_pipelines.service import MemoryService

    existing_home(args.home)  # a typo is refused (exit 2), never opened as a new empty home
    try:
        with MemoryService.from_env(args.home) as svc:
            ctx = RunContext(agent_id=args.agent, user_id=args.user, company_id=args.company)
            result = explain(
                svc.context,
                ctx,
                args.topic,
                args.current_input,
                limit=DEFAULT_LIMIT if args.limit is None else args.limit,
                all_agents=args.all_agents,
                all_scopes=args.all_scopes,
                as_of=None if args.as_of is None else check_as_of(args.as_of),
            )
    except MemoryPipelineError as e:
        print(f"memory-pipelines why: {e}", file=sys.stderr)
        return 1
    if args.json:
        text = json.dumps(result.model_dump(mode="json"), indent=2, ensure_ascii=False)
        print(printable_json(text))
    else:
        print(render_table(result))
    return 0


def purge_user_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines purge-user USER_ID [--home H]``: erase one user, print counts."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines purge-user",
        description="Erase one user's notes, history and audit, and print the counts.",
    )
    parser.add_argument("user_id")
    parser.add_argument(
        "--home", default=None, help="memory home (default $MEMORY_HOME or ./.memory)"
    )
    args = parser.parse_args(argv)
    from memory_pipelines.home import existing_home
    from memory_pipelines.purge import user_seen
    from memory_pipelines.service import MemoryService

    existing_home(args.home)  # a typo is refused (exit 2), never opened as a new empty home
    with MemoryService.from_env(args.home) as svc:
        if not user_seen(svc.context, args.user_id):
            print(f"memory-pipelines purge-user: user {printable(args.user_id)!r} is unknown to"
                  f" the memory home {svc.home}; nothing changed", file=sys.stderr)  # fmt: skip
            return 1
        counts = svc.purge_user(args.user_id)
    print(json.dumps(counts, indent=2, sort_keys=True))
    return 0


# --------------------------------------------------------------------------- API keys


def fetch_model_command(argv: list[str]) -> int:
    """``memory-pipelines fetch-model [--dest DIR]``: fetch the MiniLM files, print the folder."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines fetch-model",
        description="Download the offline all-MiniLM-L6-v2 files (setup only; needs network).",
    )
    parser.add_argument(
        "--dest", type=Path, default=None,
        help="default: $MEMORY_MODEL_DIR, else ~/.cache/memory-pipelines/all-MiniLM-L6-v2",
    )  # fmt: skip
    args = parser.parse_args(argv)
    from memory_pipelines.embeddings.fetch import fetch_model
    try:
        folder = fetch_model(args.dest)
    except EmbeddingError as e:
        print(f"fetch-model failed: {e}", file=sys.stderr)
        return 1
    print(folder)
    return 0


# --------------------------------------------------------------------------- routing

keys_command = keys_commands.keys_command
mcp_command = server_commands.mcp_command
llm_server_command = server_commands.llm_server_command
dask_cluster_command = server_commands.dask_cluster_command

#: subcommand -> (its function, one-line help)
COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "fetch-model": (fetch_model_command, "download the offline embedding model (setup only)"),
    "serve": (serve_command, "serve the write/inject HTTP API"),
    "proxy": (proxy_command, "give any OpenAI-compatible client memory (chat proxy)"),
    "demo": (demo_command, "seed a demo store and run the Memory Manager jobs"),
    "inventory": (inventory_command, "print the note inventory of a memory home"),
    "cycle": (cycle_command, "run one Memory Manager cycle (through Dagster if DAGSTER_HOME is set)"),
    "why": (why_command, "explain why an agent does (or does not) remember a topic"),
    "mcp": (mcp_command, "serve inject/write/remember/explain/history as MCP tools (stdio)"),
    "purge-user": (purge_user_command, "erase one user's notes, history and audit"),
    "keys": (keys_command, "create, list and revoke HTTP API keys"),
    "dask-cluster": (dask_cluster_command, "run a local Dask cluster for MEMORY_EXECUTOR=dask"),
    "llm-server": (llm_server_command, "serve a small local model for the litellm judge"),
}
COMMANDS.update(history_commands.COMMANDS)
COMMANDS.update(admin_commands.COMMANDS)
COMMANDS.update(transfer_commands.COMMANDS)
COMMANDS.update(doctor_commands.COMMANDS)
COMMANDS.update(db_commands.COMMANDS)

#: ``memory-pipelines bench NAME`` -> one-line help (``memory_pipelines.bench.NAME.main``)
BENCHMARKS: dict[str, str] = {
    "embed": "embedder throughput",
    "bulk": "svc.add_notes against the embedder alone on the same texts (ratio)",
    "store": "LanceDB add and search timings",
    "trickle": "single writes between maintenance runs: add and inject before/after compact",
    "writes": "in-flight write throughput and latency",
    "guarded": "10,000 single guarded writes: first vs last thousand, beside a raw add_note",
    "inject": "injection latency against an exact scan",
    "cold": "a scope's first read at N notes and a fresh home's first inject, beside warm",
    "proxy": "the chat proxy's added latency over a direct upstream call",
    "locomo": "retrieval quality on a LoCoMo-format file (--cv: cross-validated by conversation)",
    "ranker": "the learned ranker of inject, nested cross-validated on LoCoMo and its chat view",
    "extraction": "notes extracted from LoCoMo sessions against their observations",
    "maintenance": "maintenance phase timings",
    "cycle": "Memory Manager cycle time with a provisional backlog",
    "partitions": "partitioned maintenance on a Dask cluster, 1 vs 2 workers",
    "judge": "a litellm judge's latency, valid answers and agreement with the offline judge",
    "load": "8 HTTP clients writing and injecting against a real serve: group commit vs baselines",
    "history": "cost of lifecycle events (writes, maintenance) and of as_of injection",
    "notes": "notes list latency (one page) by filter, search and cursor depth",
    "startup": "start-up of each entry point (--help, import, mcp, serve, first inject)",
    "memory": "resident size over 60 open / fill / inject / close cycles in one process",
}


def _usage() -> str:
    lines = ["usage: memory-pipelines COMMAND [options]", "", "commands:"]
    for name, (_, help_) in COMMANDS.items():
        lines.append(f"  {name:<12} {help_}")
    lines.append(f"  {'bench':<12} benchmarks: {', '.join(BENCHMARKS)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name == "bench":
        if not rest or rest[0] not in BENCHMARKS:
            print("usage: memory-pipelines bench {" + ",".join(BENCHMARKS) + "} [options]")
            if rest[:1] in (["-h"], ["--help"]):
                print("\n".join(f"  {n:<12} {h}" for n, h in BENCHMARKS.items()))
                return 0
            return 2
        module = importlib.import_module(f"memory_pipelines.bench.{rest[0]}")
        return int(module.main(rest[1:]) or 0)
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    command, _ = COMMANDS[name]
    try:
        return int(command(rest) or 0)
    except MemoryPipelineError as e:  # a broken home, a bad setting: one line, no traceback
        print(f"memory-pipelines: error: {first_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
