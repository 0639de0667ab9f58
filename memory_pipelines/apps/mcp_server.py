"""The memory service as Model Context Protocol tools (the ``mcp`` SDK's ``MCPServer``).

``build_server(svc)`` registers four tools over an open :class:`MemoryService`, each a
thin call into the same guarded service path the HTTP API and the Dagster resource use:

- ``memory_write(context, writes)`` -> ``{"results": [WriteResult], "feedback": "..."}``
  (the guard pipeline; a malformed write comes back ``rejected-type``);
- ``memory_inject(context, current_input)`` -> ``{"message": "...", "note_ids": [...],
  "example_ids": [...]}``;
- ``memory_explain(context, topic, current_input, limit)`` -> the
  :class:`~memory_pipelines.explain.Explanation` as JSON;
- ``memory_history(context, note_id)`` -> ``{"note_id": ..., "events": [NoteEvent]}``
  for a note visible to the context (the scope injection uses); any other id is an
  error saying the note does not exist.

``context`` is a :class:`~memory_pipelines.notes.RunContext` as a JSON object
(``agent_id`` required; ``run_id`` required for writes). A project error (unknown agent,
invalid context or argument) becomes a tool error whose message says what is wrong; any
other failure is a tool error that names the tool, with the traceback in the server log.

``memory-pipelines mcp [--home H]`` opens the memory home from the environment and
serves the tools over stdio until the client disconnects. Tools run in worker threads;
the writes of one run are serialised by a per-run lock (as in the HTTP API) so the run's
cap and idempotency checks see each other.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from memory_pipelines.apps.http import RunLocks
from memory_pipelines.errors import (
    MemoryPipelineError,
    NotFoundError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.history.read import history_for
from memory_pipelines.notes import RunContext
from memory_pipelines.service import MemoryService

logger = logging.getLogger(__name__)

T = TypeVar("T")

SERVER_NAME = "memory-pipelines"
INSTRUCTIONS = (
    "Durable memory for this agent. Call memory_inject at the start of a run to get the "
    "notes to follow; call memory_write with short Preference or Context notes worth "
    "remembering (the framework dedupes, caps and scopes them); call memory_explain to "
    "find out why a topic is or is not remembered; call memory_history for what happened to "
    "one note."
)


def _plain(value: Any) -> Any:
    """``value`` as plain JSON types (datetimes as ISO text, anything else as text)."""
    return json.loads(json.dumps(value, default=str))


def _guarded(tool: str, fn: Callable[[], T]) -> T:
    """Run a service call, turning project errors into tool errors with their message."""
    try:
        return fn()
    except (UnknownAgentError, NotFoundError) as e:
        raise ToolError(str(e)) from e
    except ValidationError as e:
        raise ToolError(f"invalid arguments: {e}") from e
    except MemoryPipelineError as e:
        raise ToolError(f"{type(e).__name__}: {e}") from e
    except ToolError:
        raise
    except Exception as e:  # logged with its traceback; the client gets a plain message
        logger.exception("MCP tool %s failed", tool)
        raise ToolError(f"internal error ({type(e).__name__}); see the server log") from e


def build_server(svc: MemoryService) -> MCPServer:
    """An MCP server exposing ``memory_write``, ``memory_inject``, ``memory_explain`` and
    ``memory_history`` over ``svc`` (the caller keeps ownership of the service)."""
    server = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS)
    run_locks = RunLocks()

    @server.tool()
    def memory_write(context: dict[str, Any], writes: list[Any]) -> dict[str, Any]:
        """Save durable memories through the guard pipeline.

        context: {"agent_id": ..., "run_id": ..., "user_id"?: ..., "company_id"?: ...,
        "conversation_id"?: ...}. writes: [{"note": "...", "type": "Preference" |
        "Context", "scopeHint"?: "user" | "agent"}]. Returns one result per write
        (disposition: written, superseded-own, deduped, skipped-duplicate, skipped-cap,
        rejected-type, skipped-disabled or error) and the feedback text for the next turn.
        """

        def run() -> dict[str, Any]:
            run_id = context.get("run_id") if isinstance(context, dict) else None
            if not isinstance(run_id, str) or not run_id:
                results = svc.write(context, writes)
            else:  # one run's writes are serialised, as in the HTTP API
                holder = run_locks.get(run_id)
                with holder.lock:
                    results = svc.write(context, writes)
            return {
                "results": [
                    _plain(r.model_dump(mode="json", exclude={"request"}))
                    | {"request": _plain(r.request)}
                    for r in results
                ],
                "feedback": svc.format_write_feedback(results),
            }

        return _guarded("memory_write", run)

    @server.tool()
    def memory_inject(context: dict[str, Any], current_input: str | None = None) -> dict[str, Any]:
        """The memory to prepend to a run: one system message plus the injected note and
        example ids, ranked by the agent's strategies for ``current_input``."""

        def run() -> dict[str, Any]:
            injection = svc.inject(context, current_input)
            return {
                "message": injection.message,
                "note_ids": [n.id for n in injection.notes],
                "example_ids": [e.id for e in injection.examples],
            }

        return _guarded("memory_inject", run)

    @server.tool()
    def memory_explain(
        context: dict[str, Any], topic: str, current_input: str | None = None, limit: int = 10
    ) -> dict[str, Any]:
        """Why the agent does (or does not) remember ``topic``: for each note about it,
        its status, scope, rank under the agent's strategy, provenance and when TTL or
        decay retires it, with a one-line verdict."""
        return _guarded(
            "memory_explain",
            lambda: svc.explain(context, topic, current_input, limit=limit).model_dump(mode="json"),
        )

    @server.tool()
    def memory_history(context: dict[str, Any], note_id: str) -> dict[str, Any]:
        """What happened to a note the context may see: its lifecycle events, oldest first
        (created, deduped, merged, revoked, archived, restored, ...), each with when, who,
        the status before and after, related note ids and the reason. An unknown note, or
        one outside the context's scope, is an error saying it does not exist."""

        def run() -> dict[str, Any]:
            events = history_for(svc.context, _run_context(context), note_id)
            return {"note_id": note_id, "events": [e.model_dump(mode="json") for e in events]}

        return _guarded("memory_history", run)

    return server


def _run_context(context: Any) -> RunContext:
    try:
        return RunContext.model_validate(context)
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise ValidationError(f"invalid run context: {e}") from e


def serve_stdio(home: str | None, *, llm: str | None = None) -> int:
    """``memory-pipelines mcp [--home H]``: serve the memory tools over stdio."""
    # stdout carries the protocol: every log line goes to stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    overrides: dict[str, Any] = {"llm": llm} if llm else {}
    try:
        svc = MemoryService.from_env(home, **overrides)
    except MemoryPipelineError as e:
        print(f"memory-pipelines mcp: {e}", file=sys.stderr)
        return 1
    try:
        build_server(svc).run("stdio")
    finally:
        svc.close()
    return 0

