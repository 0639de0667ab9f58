"""The memory service as Model Context Protocol tools (the ``mcp`` SDK's ``MCPServer``).

``build_server(svc, identity=None)`` registers five tools over an open
:class:`MemoryService`, each a thin call into the same guarded service path the HTTP API
and the Dagster resource use:

- ``memory_inject(current_input, context)`` -> ``{"message": "...", "note_ids": [...],
  "example_ids": [...]}``;
- ``memory_write(writes, context)`` -> ``{"results": [{"disposition", "note_id"?}],
  "feedback": "..."}`` (the feedback holds each write's reason; the guard pipeline; a malformed write, or one holding
  text UTF-8 cannot encode, comes back ``rejected-type`` and the others proceed);
- ``memory_remember(messages, context)`` -> ``{"notes": [{"id", "note", "type",
  "status"}]}``: record a conversation and learn from it now;
- ``memory_explain(topic, current_input, limit, context)`` -> the
  :class:`~memory_pipelines.explain.Explanation` as JSON (empty fields left out);
- ``memory_history(note_id, context)`` -> ``{"note_id": ..., "events": [...]}`` for a
  note visible to the context; any other id is an error saying the note does not exist.

``context`` is a :class:`~memory_pipelines.notes.RunContext` as a JSON object. With an
:class:`Identity` (``memory-pipelines mcp --agent A [--user U] [--company C]``) it is
optional: what it leaves out comes from the identity, and a context naming another
agent, user or company than the identity is a tool error. A context without ``run_id``
gets one run id per MCP session (per agent, user and company), so a session's writes
share the run's cap and idempotency. Errors are one sentence: a project error (unknown
agent, invalid context or argument) says what is wrong; any other failure names the tool,
with the traceback in the server log.

``memory-pipelines mcp`` serves the tools over stdio until the client disconnects, on the
transport of :mod:`memory_pipelines.apps.mcp_stdio` (every request gets an answer). It
answers ``initialize`` before the service has opened: the home opens in a background
thread (:class:`OpeningService`), and tool calls wait for it.
Tools run in worker threads; the writes of one run are serialised by a per-run lock (as
in the HTTP API) so the run's cap and idempotency checks see each other.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field
from pydantic import ValidationError as PydanticValidationError

import memory_pipelines
from memory_pipelines.apps.launch import home_in_place
from memory_pipelines.apps.mcp_stdio import stdio_streams
from memory_pipelines.errors import (
    MemoryPipelineError,
    NotFoundError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.limits import printable, shown, unencodable_field, utf8_message
from memory_pipelines.notes import RunContext

if TYPE_CHECKING:  # the service (and LanceDB under it) is imported by the opening thread
    from memory_pipelines.apps.http.write_queue import RunLocks
    from memory_pipelines.service import MemoryService

logger = logging.getLogger(__name__)

T = TypeVar("T")

SERVER_NAME = "memory-pipelines"
TOOLS = ("memory_inject", "memory_write", "memory_remember", "memory_explain", "memory_history")
INSTRUCTIONS = (
    "Durable memory for this agent. Call memory_inject at the start of a run to get the "
    "notes to follow; call memory_write with short Preference or Context notes worth "
    "remembering (the framework dedupes, caps and scopes them), or memory_remember with "
    "the conversation's messages to let the memory learn from them; call memory_explain to "
    "find out why a topic is or is not remembered; call memory_history for what happened to "
    "one note."
)
IDENTITY_FIELDS = ("agent_id", "user_id", "company_id")
#: the flag of ``memory-pipelines mcp`` that sets each identity field
FLAGS = {"agent_id": "--agent", "user_id": "--user", "company_id": "--company"}

ContextArg = Annotated[
    dict[str, Any] | None,
    Field(
        description='Who is running: {"agent_id", "run_id"?, "user_id"?, "company_id"?, '
        '"conversation_id"?}. Optional when the server was started with --agent: what it '
        "leaves out comes from the server's flags, and the run id defaults to one per session."
    ),
]


@dataclass(frozen=True)
class Identity:
    """The agent, user and company a server is bound to (None: not bound)."""

    agent_id: str | None = None
    user_id: str | None = None
    company_id: str | None = None


def server_version() -> str:
    """The installed package's version (``memory_pipelines.__version__`` when present)."""
    found = getattr(memory_pipelines, "__version__", None)
    if isinstance(found, str) and found:
        return found
    try:
        return package_version("memory-pipelines")
    except PackageNotFoundError:
        return "0+unknown"


class MemoryMCPServer(MCPServer):
    """``MCPServer`` whose argument errors are one sentence naming the argument (the SDK's
    own message is a multi-line pydantic dump with a link)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as e:
            cause = e.__cause__
            if type(cause) is ToolError:  # ours: its sentence, without the SDK's prefix
                raise ToolError(str(cause)) from cause
            if isinstance(cause, PydanticValidationError):
                raise ToolError(
                    f"invalid arguments for {name}: {describe_errors(cause.errors())}"
                ) from cause
            raise


def describe_errors(errors: Sequence[Mapping[str, Any]], prefix: str = "") -> str:
    """Pydantic errors as one line, e.g. ``writes is required; context.user_id must be a
    string`` (``prefix`` names the object the locations are in)."""
    parts = []
    for err in errors:
        loc = [prefix] if prefix else []
        loc += [str(p) for p in err.get("loc", ()) if not str(p).startswith("function-")]
        where = ".".join(loc) or "arguments"
        kind = err.get("type", "")
        if kind == "missing":
            what = "is required"
        elif kind == "extra_forbidden":
            what = "is not a known field"
        elif kind.endswith("_type"):
            expected = {"dict": "an object", "list": "a list", "string": "a string"}
            what = f"must be {expected.get(kind[: -len('_type')], kind[: -len('_type')])}"
        elif kind == "value_error":
            what = f": {(err.get('ctx') or {}).get('error') or err.get('msg')}"
        else:
            what = f": {err.get('msg', 'invalid')}"
        parts.append(f"{where}{'' if what.startswith(':') else ' '}{what}")
    return "; ".join(dict.fromkeys(parts))


def _guarded(tool: str, fn: Callable[[], T]) -> T:
    """Run a service call, turning project errors into one-sentence tool errors."""
    try:
        return printable(fn())
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


class SessionRuns:
    """One run id per MCP session (and agent, user, company), for contexts without one."""

    def __init__(self) -> None:
        self._ids: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._fallback = uuid.uuid4().hex

    def run_id(self, session: Any, who: tuple[str | None, ...]) -> str:
        try:
            base = self._ids.setdefault(session, uuid.uuid4().hex)
        except TypeError:  # no session object to hold on to: one id for this server
            base = self._fallback
        digest = hashlib.sha256("\0".join([base, *(w or "" for w in who)]).encode()).hexdigest()
        return f"mcp-{digest[:24]}"


def resolve_context(
    identity: Identity, context: Any, runs: SessionRuns, session: Any, *, needs_run: bool = True
) -> RunContext:
    """The run context of a call: ``context`` over the server's identity, the session's run
    id when it has none. Raises ``ToolError`` (one sentence) when the context is not an
    object, is invalid, or names another agent, user or company than the identity."""
    if context is None:
        context = {}
    if not isinstance(context, Mapping):
        raise ToolError("invalid context: context must be an object")
    bad = unencodable_field(dict(context), "context")
    if bad:
        raise ToolError(f"invalid context: {utf8_message(bad)}")
    merged = dict(context)
    for field in IDENTITY_FIELDS:
        bound = getattr(identity, field)
        given = merged.get(field)
        if bound is None:
            continue
        if given not in (None, "") and given != bound:
            raise ToolError(
                f"context.{field} {shown(given)} is not this server's {field.removesuffix('_id')}"
                f" ({FLAGS[field]} {bound}); this server acts for {bound!r} only"
            )
        merged[field] = bound
    if not merged.get("agent_id"):
        raise ToolError(
            "invalid context: context.agent_id is required (or start the server with --agent)"
        )
    if needs_run and not merged.get("run_id") and isinstance(merged.get("agent_id"), str):
        who = tuple(m if isinstance(m, str) else None for m in map(merged.get, IDENTITY_FIELDS))
        merged["run_id"] = runs.run_id(session, who)
    try:
        run = RunContext.model_validate(merged)
    except PydanticValidationError as e:
        raise ToolError(f"invalid context: {describe_errors(e.errors(), 'context')}") from e
    if identity.company_id is not None and identity.user_id is None:
        run.company_bound()  # a user's notes without a company belong to no company
    return run


def _session(ctx: Context | None) -> Any:
    """What stands for the client's session: its connection (the SDK builds a new
    ``ServerSession`` per request over one ``Connection``); None outside a request."""
    try:
        session = ctx.session if ctx is not None else None
    except Exception:  # no request context (a direct call): one run id per server
        return None
    return getattr(session, "_connection", session)


#: How long a tool call waits for the service to finish opening (seconds).
OPEN_WAIT_S = 120.0


class OpeningService:
    """A :class:`MemoryService` being opened in a background thread, so the server answers
    ``initialize`` and ``tools/list`` at once while the home (and LanceDB) loads.

    ``open_fn`` returns the open service or raises. :meth:`get` waits for it (at most
    ``wait_s`` seconds) and raises a one-sentence ``ToolError`` naming the problem when the
    opening failed or is still running. :meth:`close` waits for the thread, then closes
    the service it opened."""

    def __init__(self, open_fn: Callable[[], MemoryService], *, wait_s: float = OPEN_WAIT_S):
        self.wait_s = wait_s
        self.error: BaseException | None = None
        self._open_fn = open_fn
        self._svc: MemoryService | None = None
        self._done = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="memory-open", daemon=True)

    def start(self) -> OpeningService:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            svc = self._open_fn()
        except BaseException as e:  # noqa: BLE001 - kept, and told to every tool call
            if not isinstance(e, MemoryPipelineError):
                logger.error("opening the memory service failed", exc_info=e)
            self.error = e
        else:
            self._svc = svc
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the opening has finished (opened or failed) within ``timeout``."""
        return self._done.wait(timeout)

    def failure(self) -> str:
        """What went wrong opening the service, as one sentence."""
        e = self.error
        if isinstance(e, MemoryPipelineError):
            return f"the memory service could not be opened: {e}"
        return f"the memory service could not be opened ({type(e).__name__}); see the server log"

    def get(self) -> MemoryService:
        """The open service, once the opening has finished (see the class docstring)."""
        if not self._done.wait(self.wait_s):
            raise ToolError(
                f"the memory service is still opening after {self.wait_s:g} seconds;"
                " try the call again"
            )
        if self._svc is None:
            raise ToolError(self.failure())
        if self._closed:
            raise ToolError("the memory service is closed")
        return self._svc

    def close(self, timeout: float | None = None) -> None:
        """Wait for the opening (``timeout``: at most that long), then close the service."""
        self._done.wait(self.wait_s if timeout is None else timeout)
        self._closed = True
        if self._svc is not None:
            self._svc.close()


class MemoryTools:
    """The five memory tools over one service, bound to an identity: each public method
    named in :attr:`NAMES` is a tool, its docstring (dedented) what the model reads.
    ``service`` returns the service (it may wait for it to open)."""

    NAMES = ("memory_inject", "memory_write", "memory_remember", "memory_explain", "memory_history")

    def __init__(self, service: Callable[[], MemoryService], identity: Identity):
        self.service = service
        self.identity = identity
        self.runs = SessionRuns()
        self._locks: RunLocks | None = None
        self._locks_guard = threading.Lock()

    def run_locks(self) -> RunLocks:
        with self._locks_guard:
            if self._locks is None:  # imported with the service, not before the server answers
                from memory_pipelines.apps.http.write_queue import RunLocks

                self._locks = RunLocks()
            return self._locks

    def context_of(self, context: Any, ctx: Context | None, *, needs_run: bool = True) -> RunContext:
        return resolve_context(self.identity, context, self.runs, _session(ctx), needs_run=needs_run)

    def locked(self, run: RunContext, fn: Callable[[], T]) -> T:
        """``fn()`` holding the run's lock (one write or remember of a run at a time)."""
        holder = self.run_locks().get(f"{run.agent_id}\0{run.run_id}")
        with holder.lock:
            return fn()

    def memory_inject(
        self, current_input: str | None = None, context: ContextArg = None, ctx: Context = None
    ) -> dict[str, Any]:
        """The memory to prepend to a run: one system message plus the injected note and
        example ids, ranked by the agent's strategies for current_input."""

        def run() -> dict[str, Any]:
            run_ctx = self.context_of(context, ctx, needs_run=False)
            injection = self.service().inject(run_ctx, current_input)
            return {
                "message": injection.message,
                "note_ids": [n.id for n in injection.notes],
                "example_ids": [e.id for e in injection.examples],
            }

        return _guarded("memory_inject", run)

    def memory_write(
        self, writes: list[Any], context: ContextArg = None, ctx: Context = None
    ) -> dict[str, Any]:
        """Save durable memories through the guard pipeline.

        writes: [{"note": "...", "type": "Preference" | "Context", "scopeHint"?: "user" |
        "agent"}], one short fact each. Returns one result per write (disposition: written,
        superseded-own, deduped, skipped-duplicate, skipped-cap, rejected-type,
        skipped-disabled or error, and the note id) and the feedback text with each reason.
        """

        def run() -> dict[str, Any]:
            run_ctx = self.context_of(context, ctx)
            results = self.locked(run_ctx, lambda: self.service().write(run_ctx, writes))
            return {
                "results": [
                    {"disposition": r.disposition, **({"note_id": r.note_id} if r.note_id else {})}
                    for r in results
                ],
                "feedback": self.service().format_write_feedback(results),
            }

        return _guarded("memory_write", run)

    def memory_remember(
        self, messages: list[Any], context: ContextArg = None, ctx: Context = None
    ) -> dict[str, Any]:
        """Learn from a conversation now: messages in the OpenAI chat format
        ([{"role": "user" | "assistant" | "system", "content": "..."}]) are recorded, the
        durable facts the user states are kept as memories (guarded like memory_write),
        and the notes kept are returned. The same messages sent again in a run add nothing.
        """

        def run() -> dict[str, Any]:
            run_ctx = self.context_of(context, ctx)
            notes = self.locked(run_ctx, lambda: self.service().remember(run_ctx, messages))
            return {
                "notes": [
                    {"id": n.id, "note": n.note, "type": n.type, "status": n.status} for n in notes
                ]
            }

        return _guarded("memory_remember", run)

    def memory_explain(
        self,
        topic: str,
        current_input: str | None = None,
        limit: int = 10,
        context: ContextArg = None,
        ctx: Context = None,
    ) -> dict[str, Any]:
        """Why the agent does (or does not) remember the topic: for each note about it,
        its status, scope, rank under the agent's strategy, provenance and when TTL or
        decay retires it, with a one-line verdict."""

        def run() -> dict[str, Any]:
            run_ctx = self.context_of(context, ctx, needs_run=False)
            found = self.service().explain(run_ctx, topic, current_input, limit=limit)
            return found.model_dump(mode="json", exclude_none=True)

        return _guarded("memory_explain", run)

    def memory_history(
        self, note_id: str, context: ContextArg = None, ctx: Context = None
    ) -> dict[str, Any]:
        """What happened to a note the context may see: its lifecycle events, oldest first
        (created, deduped, merged, revoked, archived, restored, ...), each with when, who,
        the status before and after, related note ids and the reason. An unknown note, or
        one outside the context's scope, is an error saying it does not exist."""

        def run() -> dict[str, Any]:
            run_ctx = self.context_of(context, ctx, needs_run=False)
            from memory_pipelines.history.read import history_for

            events = history_for(self.service().context, run_ctx, note_id)
            return {
                "note_id": note_id,
                "events": [e.model_dump(mode="json", exclude_none=True) for e in events],
            }

        return _guarded("memory_history", run)



def build_server(
    svc: MemoryService | OpeningService, identity: Identity | None = None
) -> MCPServer:
    """An MCP server exposing the five memory tools over ``svc`` (the caller keeps
    ownership of the service), bound to ``identity`` when given. ``svc`` may be an
    :class:`OpeningService`: the server answers at once, and each tool call waits for the
    service (a tool error when it could not be opened)."""
    server = MemoryMCPServer(
        SERVER_NAME, instructions=INSTRUCTIONS, version=server_version(), log_level="WARNING"
    )
    service: Callable[[], MemoryService] = (
        svc.get if isinstance(svc, OpeningService) else lambda: svc  # type: ignore[return-value]
    )
    tools = MemoryTools(service, identity or Identity())
    for name in MemoryTools.NAMES:
        fn = getattr(tools, name)
        server.tool(description=inspect.cleandoc(fn.__doc__ or ""))(fn)
    return server


def serve_stdio(
    home: str | None,
    *,
    llm: str | None = None,
    agent: str | None = None,
    user: str | None = None,
    company: str | None = None,
) -> int:
    """``memory-pipelines mcp [--home H] [--agent A] [--user U] [--company C]``: serve the
    memory tools over stdio, bound to the given identity.

    The server answers ``initialize`` and ``tools/list`` while the home opens in the
    background; tool calls wait for it. When it cannot be opened (a broken home, a missing
    model, an unknown ``--agent``) the reason goes to stderr, every tool call is an error
    saying it, and the command exits 1 when the client disconnects."""
    # stdout carries the protocol: every log line goes to stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    overrides: dict[str, Any] = {"llm": llm} if llm else {}
    identity = Identity(agent, user, company)

    def open_service() -> MemoryService:
        from memory_pipelines.service import MemoryService

        svc = MemoryService.from_env(home, **overrides)
        try:
            if agent is not None:
                try:  # an unknown agent fails every call with this hint
                    svc.get_agent(agent)
                except UnknownAgentError as e:
                    raise UnknownAgentError(
                        f"{e}: configure it first, e.g. memory-pipelines agents set {agent}"
                        + (f" --home {home}" if home else "")
                    ) from e
        except BaseException:
            svc.close()
            raise
        svc.warm_up(background=True)  # the model loads while the client initializes
        return svc

    def told(opening: OpeningService) -> None:  # said once, when the opening fails
        opening.wait()
        if opening.error is not None:
            print(f"memory-pipelines mcp: {opening.failure()}", file=sys.stderr)

    try:
        home_in_place(home)
    except MemoryPipelineError as e:
        print(f"memory-pipelines mcp: {e}", file=sys.stderr)
        return 1
    # the home opens (LanceDB imported, the agent checked) while the client initializes
    opening = OpeningService(open_service).start()
    teller = threading.Thread(target=told, args=(opening,), name="memory-open-told", daemon=True)
    teller.start()
    try:
        anyio.run(_serve, build_server(opening, identity))
    except MemoryPipelineError as e:
        print(f"memory-pipelines mcp: {e}", file=sys.stderr)
        return 1
    finally:
        opening.close()
        teller.join(timeout=5)
    return 1 if opening.error is not None else 0


async def _serve(server: MCPServer) -> None:
    # the SDK's stdio transport drops lines it cannot parse; ours answers every request
    lowlevel = server._lowlevel_server  # noqa: SLF001 - MCPServer has no public accessor
    async with stdio_streams() as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
