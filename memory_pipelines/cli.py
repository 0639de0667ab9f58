"""The ``memory-pipelines`` command line.

Each subcommand lives in its own module and parses its own options, so this file only
routes: ``memory-pipelines bench writes --sizes 10000`` calls
``memory_pipelines.benchmarks.writes.main(["--sizes", "10000"])``.
"""

from __future__ import annotations

import importlib
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from memory_pipelines.errors import MemoryPipelineError  # noqa: E402
from memory_pipelines.home import first_line  # noqa: E402

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "fetch-model": ("memory_pipelines.embeddings.fetch", "download the offline embedding model (setup only)"),
    "serve": ("memory_pipelines.http", "serve the write/inject HTTP API"),
    "proxy": ("memory_pipelines.proxy", "give any OpenAI-compatible client memory (chat proxy)"),
    "demo": ("memory_pipelines.demo", "seed a demo store and run the Memory Manager jobs"),
    "inventory": ("memory_pipelines.inventory", "print the note inventory of a memory home"),
    "cycle": ("memory_pipelines.manager", "run one Memory Manager cycle in process"),
    "why": ("memory_pipelines.explain", "explain why an agent does (or does not) remember a topic"),
    "mcp": ("memory_pipelines.mcp_server", "serve write/inject/explain as MCP tools over stdio"),
    "purge-user": ("memory_pipelines.purge", "erase one user's notes, history and audit"),
    "keys": ("memory_pipelines.keys", "create, list and revoke HTTP API keys"),
    "dask-cluster": ("memory_pipelines.distributed", "run a local Dask cluster for MEMORY_EXECUTOR=dask"),
    "llm-server": ("memory_pipelines.llm_server", "serve a small local model for the litellm judge"),
}

BENCHMARKS: dict[str, str] = {
    "embed": "embedder throughput",
    "store": "LanceDB add and search timings",
    "writes": "in-flight write throughput and latency",
    "inject": "injection latency against an exact scan",
    "proxy": "the chat proxy's added latency over a direct upstream call",
    "locomo": "retrieval quality on a LoCoMo-format file",
    "maintenance": "maintenance phase timings",
    "cycle": "Memory Manager cycle time with a provisional backlog",
    "partitions": "partitioned maintenance on a Dask cluster, 1 vs 2 workers",
    "judge": "a litellm judge's latency, valid answers and agreement with the offline judge",
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
            return 2
        module = importlib.import_module(f"memory_pipelines.benchmarks.{rest[0]}")
        return int(module.main(rest[1:]) or 0)
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except MemoryPipelineError as e:  # a broken home, a bad setting: one line, no traceback
        print(f"memory-pipelines: error: {first_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
