"""``memory-pipelines mcp``, ``llm-server`` and ``dask-cluster``: the commands that serve
something other than the memory API (MCP tools over stdio, a local model for the litellm
judge, a local Dask cluster for partitioned maintenance). ``serve`` and ``proxy`` stay in
:mod:`memory_pipelines.apps.cli`."""

from __future__ import annotations

import argparse
import importlib

from memory_pipelines.apps import dask_cluster, llm_server
from memory_pipelines.apps.admin_commands import HOME_HELP
from memory_pipelines.keys import is_loopback, tcp_port


def mcp_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines mcp [--home H] [--agent A] [--user U] [--company C]``: serve the
    memory tools over stdio, bound to an identity when given."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines mcp",
        description="Serve memory_inject, memory_write, memory_remember, memory_explain and"
        " memory_history as MCP tools over stdio. With --agent, every tool's context is"
        " optional (it defaults to these flags, with one run id per session) and a call"
        " naming another agent, user or company is refused.",
    )
    parser.add_argument("--home", default=None, help=HOME_HELP)
    parser.add_argument("--agent", default=None, help="the agent every call acts for")
    parser.add_argument("--user", default=None, help="the user every call acts for")
    parser.add_argument("--company", default=None, help="the company every call acts for")
    parser.add_argument(
        "--llm",
        default=None,
        help="litellm model for the judge (default: $MEMORY_LLM_MODEL or offline)",
    )
    args = parser.parse_args(argv)
    return importlib.import_module("memory_pipelines.apps.mcp_server").serve_stdio(
        args.home, llm=args.llm, agent=args.agent, user=args.user, company=args.company
    )


def _loopback(value: str) -> str:
    if not is_loopback(value):
        raise argparse.ArgumentTypeError(f"the model server binds loopback only, got {value!r}")
    return value


def llm_server_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines llm-server``: serve the local model until stopped."""
    port = llm_server.DEFAULT_PORT
    parser = argparse.ArgumentParser(
        prog="memory-pipelines llm-server",
        description="Serve a small local GGUF model (OpenAI-compatible /v1/chat/completions) "
        "on loopback for the litellm judge. Needs the local-llm extra.",
    )
    parser.add_argument("--port", type=tcp_port, default=port, help=f"port (default: {port})")
    parser.add_argument("--host", type=_loopback, default="127.0.0.1", help="loopback address")
    parser.add_argument(
        "--model-path", default=None, help="GGUF file (default: the installed model package)"
    )
    parser.add_argument("--model-name", default=None, help="served model name (judge: openai/NAME)")
    parser.add_argument(
        "--n-ctx", type=int, default=4096, help="context size in tokens (default: 4096)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: llama.cpp's)"
    )
    parser.add_argument("--print-path", action="store_true", help="print the model file and exit")
    args = parser.parse_args(argv)
    return llm_server.serve_model(
        port=args.port,
        host=args.host,
        model_path=args.model_path,
        model_name=args.model_name,
        n_ctx=args.n_ctx,
        threads=args.threads,
        print_path=args.print_path,
    )


def dask_cluster_command(argv: list[str] | None = None) -> int:
    """``memory-pipelines dask-cluster --workers N [--port P]``: run a local Dask cluster
    in the foreground until SIGTERM or SIGINT."""
    port = dask_cluster.DEFAULT_PORT
    parser = argparse.ArgumentParser(
        prog="memory-pipelines dask-cluster",
        description=(
            "Run a Dask scheduler and N worker processes on 127.0.0.1 until SIGTERM/SIGINT. "
            "Workers inherit this shell's environment (MEMORY_HOME, MEMORY_EMBEDDING_MODEL, "
            "...). Then run jobs with MEMORY_EXECUTOR=dask MEMORY_DASK_ADDRESS=<address>."
        ),
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--port",
        type=int,
        default=port,
        help=f"scheduler port on 127.0.0.1 (default {port}; 0 picks a free port)",
    )
    parser.add_argument(
        "--threads-per-worker", type=int, default=1, help="task threads per worker (default 1)"
    )
    args = parser.parse_args(argv)
    return dask_cluster.run_cluster(
        args.workers, port=args.port, threads_per_worker=args.threads_per_worker
    )
