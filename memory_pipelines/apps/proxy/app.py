"""The memory proxy's application: ``create_app(svc, model)`` builds the
OpenAI-compatible endpoint over an open service and :func:`serve` serves it until
stopped. The protocol (identity headers, injection, ``memoryWrites``, recording,
streaming, keys, errors) is described in :mod:`memory_pipelines.apps.proxy`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse, StreamingResponse  # noqa: E402
from sqlalchemy import select  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402

from memory_pipelines.apps.http import (  # noqa: E402
    OPEN_PATHS,
    RunLocks,
    WriteQueue,
    run_server,
    write_queue_enabled,
)
from memory_pipelines.apps.http.common import BodyLimit  # noqa: E402
from memory_pipelines.apps.proxy.offline import OFFLINE_MODEL, OfflineModel  # noqa: E402
from memory_pipelines.apps.proxy.tokens import fit_injection, token_counter  # noqa: E402
from memory_pipelines.apps.proxy.turns import (  # noqa: E402
    FEEDBACK_KEY,
    HEADERS,
    MEMORY_TOOL,
    MEMORY_TOOL_SPEC,
    ChoiceFilter,
    ProxyError,
    Turn,
    forwarded_fields,
    last_user,
    new_id,
    proxy_error,
    split_memory_writes,
    tool_writes,
    upstream_error,
)
from memory_pipelines.errors import (  # noqa: E402
    AuthenticationError,
    ConfigError,
    MemoryPipelineError,
    NotFoundError,
)
from memory_pipelines.injection.attribution import buffer_attribution, record_attribution  # noqa: E402
from memory_pipelines.keys import Authenticator, bind_refusal, check_context  # noqa: E402
from memory_pipelines.limits import limits  # noqa: E402
from memory_pipelines.litellm_loader import import_litellm  # noqa: E402
from memory_pipelines.notes import RunContext  # noqa: E402
from memory_pipelines.service import MemoryService  # noqa: E402
from memory_pipelines.sources import messages  # noqa: E402
from memory_pipelines.writes.ownership import claim_run  # noqa: E402
from memory_pipelines.writes.protocol import chat_write_instructions, scrub  # noqa: E402

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds the proxy waits for the upstream model (``--timeout``, ``MEMORY_PROXY_TIMEOUT``).
DEFAULT_TIMEOUT = 120.0
#: Largest request body the proxy takes (``--max-body-bytes``, ``MEMORY_PROXY_MAX_BODY_BYTES``):
#: larger than ``serve``'s, as a chat turn carries the whole history and may carry images.
DEFAULT_MAX_BODY_BYTES = 8 << 20


class ProxyBodyLimit(BodyLimit):
    """``serve``'s body limit, answering 413 in the OpenAI error format."""

    async def _too_large(self, send: Any) -> None:
        body = json.dumps({"error": {
            "message": f"request body is larger than {self.max_bytes} bytes (the proxy's "
            "--max-body-bytes / MEMORY_PROXY_MAX_BODY_BYTES)",
            "type": "invalid_request_error", "param": None, "code": "request_too_large",
        }}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]})
        await send({"type": "http.response.body", "body": body})


class AnswerResponse(JSONResponse):
    """A JSON answer whose lone surrogates (an upstream's ``"\\ud800"`` escape in any
    field: content, tool-call arguments, refusal) are sent as U+FFFD, not a 500."""

    def render(self, content: Any) -> bytes:
        return scrub(json.dumps(
            content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        )).encode("utf-8")


def json_requested(body: Mapping[str, Any]) -> bool:
    """Whether the client asked for a JSON answer (``response_format``)."""
    fmt = body.get("response_format")
    return isinstance(fmt, Mapping) and fmt.get("type") in ("json_object", "json_schema")


def _budgets(value: int | Mapping[str, int] | None) -> tuple[int | None, dict[str, int]]:
    if value is None or isinstance(value, int):
        budgets: tuple[int | None, dict[str, int]] = (value, {})
    elif not isinstance(value, Mapping):
        raise ConfigError(f"max_injected_tokens must be a positive integer or a mapping, got {value!r}")
    else:
        budgets = (value.get("*"), {k: v for k, v in value.items() if k != "*"})
    for v in [budgets[0], *budgets[1].values()]:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"max_injected_tokens must be a positive integer, got {v!r}")
    return budgets


# --------------------------------------------------------------------------- app


def create_app(
    svc: MemoryService,
    model: str,
    *,
    passthrough: bool = False,
    upstream: Mapping[str, Any] | None = None,
    write_queue: bool = True,
    timeout: float | None = None,
    max_body_bytes: int | None = None,
    max_injected_tokens: int | Mapping[str, int] | None = None,
) -> FastAPI:
    """The proxy over an open service (the caller keeps ownership of it), in front of the
    litellm ``model`` (``"offline"``: the built-in offline demo model,
    :mod:`~memory_pipelines.apps.proxy.offline`); ``upstream`` adds keyword arguments to
    every litellm call (e.g. ``api_base``, ``api_key``). ``write_queue``: the turns'
    ``memoryWrites`` go through one group-commit writer
    (:class:`~memory_pipelines.apps.http.WriteQueue`, on ``app.state.write_queue``, stopped
    with the app); False runs them in the request threads. ``timeout``: seconds to wait
    for the upstream (default :data:`DEFAULT_TIMEOUT`; then 504). ``max_body_bytes``: the
    largest request body (default :data:`DEFAULT_MAX_BODY_BYTES`; larger is 413).
    ``max_injected_tokens``: a token budget for the system message the proxy adds, one
    number for every agent or a mapping agent id -> budget (key ``"*"``: the others);
    the lowest-ranked examples, then notes, are left out until it fits."""
    litellm = import_litellm()

    litellm.suppress_debug_info = True
    auth = Authenticator(svc.sources)
    run_locks = RunLocks()
    offline = OfflineModel() if model == OFFLINE_MODEL else None
    default_budget, agent_budgets = _budgets(max_injected_tokens)
    counter = token_counter() if (default_budget or agent_budgets) else None
    call_kwargs: dict[str, Any] = {
        "max_retries": 0, "drop_params": True, "timeout": DEFAULT_TIMEOUT if timeout is None else timeout,
        **dict(upstream or {}),
    }
    writer = WriteQueue(svc) if write_queue else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if writer is not None:
                await run_in_threadpool(writer.close)

    app = FastAPI(
        title="memory-pipelines proxy",
        description="An OpenAI-compatible endpoint that gives any agent memory.",
        lifespan=lifespan,
    )
    app.state.write_queue = writer
    app.add_middleware(ProxyBodyLimit, max_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES)

    def write(ctx: RunContext, writes: list[Any]) -> list[Any]:
        return writer.submit(ctx, writes) if writer is not None else svc.write(ctx, writes)

    @app.middleware("http")
    async def _authenticate(request: Request, call_next: Any) -> Any:
        request.state.api_key = None
        if request.url.path not in OPEN_PATHS:
            try:
                request.state.api_key = await run_in_threadpool(
                    auth.authenticate, request.headers.get("authorization")
                )
            except Exception as e:  # noqa: BLE001 - every failure answers in the OpenAI format
                headers = {"WWW-Authenticate": "Bearer"} if isinstance(e, AuthenticationError) else None
                return proxy_error(e).response(headers)
        return await call_next(request)

    async def in_thread(fn: Callable[[], T]) -> T:
        return await run_in_threadpool(fn)

    # -- service side (synchronous, run in the thread pool) ------------------------------

    def feedback_key(ctx: RunContext) -> str:
        return f"{FEEDBACK_KEY}/{ctx.agent_id}/{ctx.run_id}"

    def prepare(
        request: Request, ctx: RunContext, msgs: list[Any], tools: Any, keep_json: bool
    ) -> tuple[Turn, str]:
        """Check the key, build the system message (taking the run's pending feedback)."""
        check_context(request.state.api_key, ctx, svc.sources)
        agent = svc.get_agent(ctx.agent_id)  # UnknownAgentError -> 404
        check_owner(ctx)
        index, user_text = last_user(msgs)
        budget = agent_budgets.get(ctx.agent_id, default_budget)
        fitting = budget is not None and counter is not None
        # under a budget only the notes and examples that reach the model are recorded
        injection = svc.inject(ctx, user_text, record=not fitting)
        # a client that asked for JSON gets the JSON field; a chat answer a trailing block
        instructions = (
            svc.write_instructions(ctx.agent_id) if keep_json
            else chat_write_instructions(agent, svc.write_config)
        )
        holder = run_locks.get(f"{ctx.agent_id}\0{ctx.run_id}")
        with holder.lock:
            pending = svc.sources.get_state(feedback_key(ctx)) or ""
            if pending:
                svc.sources.set_state(feedback_key(ctx), "")
        message = injection.message
        if fitting:
            assert budget is not None and counter is not None
            n_notes, n_examples = len(injection.notes), len(injection.examples)
            if message:
                rest = "\n\n".join(p for p in (instructions, pending) if p)
                message, n_notes, n_examples = fit_injection(
                    message, injection.notes, injection.examples, budget=budget,
                    others=counter.count(rest) + (2 if rest else 0), count=counter.count,
                    include_memory_policy=svc.inject_config.include_memory_policy,
                )
            if svc.inject_config.record_attribution and (agent.inject_notes or agent.inject_examples):
                record_attribution(
                    svc.context, ctx, injection.notes[:n_notes], injection.examples[:n_examples], svc.now()
                )
        system = "\n\n".join(p for p in (message, instructions, pending) if p)
        user_id = None
        if user_text is not None:
            digest = hashlib.sha256(f"{ctx.conversation_id}\0{index}\0{user_text}".encode()).hexdigest()
            user_id = f"msg-{digest[:32]}"
        has_own = isinstance(tools, list) and any(
            isinstance(t, Mapping) and (t.get("function") or {}).get("name") == MEMORY_TOOL for t in tools
        )
        intercept = bool(instructions) and isinstance(tools, list) and bool(tools) and not has_own
        turn = Turn(ctx, new_id("chatcmpl-mp"), user_text, user_id, intercept, pending, keep_json=keep_json)
        return turn, system

    def check_owner(ctx: RunContext) -> None:
        """409 unless the run and the conversation are new or already this context's: a
        turn never appends to, or takes over, another agent's, user's or company's."""
        run = svc.sources.get_agent_run(ctx.run_id) if ctx.run_id else None
        if run is not None and run["agent_id"] != ctx.agent_id:
            raise ProxyError(409, f"run {ctx.run_id!r} belongs to another agent", code="run_conflict")
        conv = svc.sources.get_conversation(ctx.conversation_id) if ctx.conversation_id else None
        who = ("agent_id", "user_id", "company_id")
        if conv is not None and any(conv.get(k) != getattr(ctx, k) for k in who):
            raise ProxyError(
                409,
                f"conversation {ctx.conversation_id!r} belongs to another agent, user or company",
                code="conversation_conflict",
            )
        # the agent's run of another company or user: 409 before its feedback is read
        claim_run(svc.context, ctx)

    def finish(turn: Turn, error: str | None = None) -> None:
        """Run the turn's writes (keeping their feedback for the next turn) and record it."""
        ctx = turn.ctx
        n_writes = len(turn.writes)
        try:
            # a failed turn's model never saw the feedback it carried: keep it for the next
            feedback = turn.pending if error else ""
            if turn.writes and error is None:
                feedback = run_writes(ctx, turn.writes)
            if feedback:
                holder = run_locks.get(f"{ctx.agent_id}\0{ctx.run_id}")
                with holder.lock:
                    pending = svc.sources.get_state(feedback_key(ctx)) or ""
                    parts = (feedback, pending) if error else (pending, feedback)
                    svc.sources.set_state(feedback_key(ctx), "\n\n".join(p for p in parts if p))
            record(turn, error)
        except Exception as e:  # the client keeps its answer; the log keeps ids only
            logger.error("memory proxy: recording run %s failed: %s", ctx.run_id, type(e).__name__)
            logger.debug("recording failure", exc_info=e)
            return
        logger.info(
            "proxy turn agent=%s run=%s conversation=%s status=%s writes=%d",
            ctx.agent_id, ctx.run_id, ctx.conversation_id, "failed" if error else "completed", n_writes,
        )

    def run_writes(ctx: RunContext, writes: list[Any]) -> str:
        """Write the first writes one request may carry; the feedback reports every one."""
        most = limits().max_writes_per_request
        kept, extra = writes[:most], len(writes) - most
        holder = run_locks.get(f"{ctx.agent_id}\0{ctx.run_id}")
        try:
            with holder.lock:
                feedback = svc.format_write_feedback(write(ctx, kept))
        except MemoryPipelineError as e:
            logger.warning("memory proxy: the writes of run %s failed: %s", ctx.run_id, type(e).__name__)
            feedback = f"Memory writes of the previous answer were not saved: {e}"
        if extra > 0:
            feedback += (
                f"\n{extra} more memoryWrites of the previous answer were not saved: one "
                f"answer may carry at most {most}."
            )
        return feedback

    def record(turn: Turn, error: str | None) -> None:
        ctx = turn.ctx
        conv = ctx.conversation_id
        assert conv is not None and ctx.run_id is not None
        svc.add_conversation(conv, ctx.agent_id, ctx.user_id, ctx.company_id)
        if turn.user_text and turn.user_message_id and not message_row(conv, turn.user_message_id):
            svc.add_message(conv, turn.user_message_id, "user", turn.user_text)
        if turn.answer:
            svc.add_message(conv, turn.completion_id, "assistant", turn.answer)
        previous = svc.sources.get_agent_run(ctx.run_id)
        now = svc.now()
        svc.add_agent_run(
            ctx.run_id,
            ctx.agent_id,
            user_id=ctx.user_id,
            company_id=ctx.company_id,
            conversation_id=conv,
            status="Failed" if error else "Completed",
            success=error is None,
            error_message=error,
            created_at=previous["created_at"] if previous else now,
            finished_at=now,
        )

    def message_row(conversation_id: str, message_id: str) -> dict[str, Any] | None:
        with svc.sources.begin() as c:
            row = c.execute(
                select(messages).where(
                    messages.c.message_id == message_id, messages.c.conversation_id == conversation_id
                )
            ).mappings().first()
        return dict(row) if row else None

    # -- the upstream call -----------------------------------------------------------------

    def upstream_args(body: Mapping[str, Any], msgs: list[Any], stream: bool) -> dict[str, Any]:
        return {**forwarded_fields(body), **call_kwargs, "model": model, "messages": msgs, "stream": stream}

    def answer_json(resp: Any, turn: Turn | None) -> dict[str, Any]:
        data = resp.model_dump() if hasattr(resp, "model_dump") else dict(resp)
        if turn is None:
            return data
        data["id"] = turn.completion_id
        for choice in data.get("choices") or []:
            message = choice.get("message") or {}
            content = message.get("content")
            if isinstance(content, str):
                cleaned, writes = split_memory_writes(content, keep_json=turn.keep_json)
                message["content"] = scrub(cleaned)
                turn.writes.extend(writes or [])
            calls = message.get("tool_calls") or []
            if turn.intercept_tools and calls:
                kept = [c for c in calls if (c.get("function") or {}).get("name") != MEMORY_TOOL]
                for c in calls:
                    if c not in kept:
                        turn.writes.extend(tool_writes((c.get("function") or {}).get("arguments")))
                message["tool_calls"] = kept or None
                if not kept and choice.get("finish_reason") == "tool_calls":
                    choice["finish_reason"] = "stop"
            if choice.get("index", 0) == 0 and isinstance(message.get("content"), str):
                turn.answer = message["content"]
        return data

    async def stream_answer(upstream_iter: Any, turn: Turn | None, strip: bool) -> AsyncIterator[str]:
        choices: dict[int, ChoiceFilter] = {}
        intercept = bool(turn and turn.intercept_tools)
        done = False
        meta: dict[str, Any] = {}

        async def failed(reason: str) -> None:
            """Record the turn as failed, once, unless it completed."""
            nonlocal done
            if turn is None or done:
                return
            done = True
            turn.answer = choices[0].sent if 0 in choices else ""
            with anyio.CancelScope(shield=True):
                await in_thread(lambda: finish(turn, reason))

        def event(body: Mapping[str, Any]) -> str:
            return f"data: {scrub(json.dumps(body, ensure_ascii=False))}\n\n"

        def chunk(index: int, delta: dict[str, Any], finish: str | None) -> str:
            return event({**meta, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]})

        def close_choice(index: int, f: ChoiceFilter, reason: str | None) -> list[str]:
            out = []
            content, writes = f.flush()
            if content:
                out.append(chunk(index, {"content": content}, None))
            if turn is not None:
                turn.writes.extend(writes)
                turn.writes.extend(f.tool_writes())
            f.finished = True
            out.append(chunk(index, {}, f.finish_reason(reason)))
            return out

        try:
            async for part in upstream_iter:
                data = part.model_dump() if hasattr(part, "model_dump") else dict(part)
                meta = {
                    "id": turn.completion_id if turn else data.get("id"),
                    "object": "chat.completion.chunk",
                    "created": data.get("created") or int(time.time()),
                    "model": data.get("model"),
                }
                if data.get("system_fingerprint"):
                    meta["system_fingerprint"] = data["system_fingerprint"]
                for choice in data.get("choices") or []:
                    index = int(choice.get("index") or 0)
                    f = choices.setdefault(index, ChoiceFilter(strip, intercept, bool(turn and turn.keep_json)))
                    if f.finished:
                        continue
                    raw = choice.get("delta") or {}
                    delta: dict[str, Any] = {}
                    if raw.get("role"):
                        delta["role"] = raw["role"]
                    if isinstance(raw.get("content"), str):
                        piece = f.content(raw["content"])
                        if piece or (raw["content"] == "" and "role" in delta):
                            delta["content"] = piece
                    if raw.get("refusal"):
                        delta["refusal"] = raw["refusal"]
                    calls = [c for c in (f.tool_delta(c) for c in raw.get("tool_calls") or []) if c]
                    if calls:
                        delta["tool_calls"] = calls
                    if delta:
                        yield chunk(index, delta, None)
                    if choice.get("finish_reason"):
                        for out in close_choice(index, f, choice["finish_reason"]):
                            yield out
                if data.get("usage"):
                    yield event({**meta, "choices": [], "usage": data["usage"]})
            for index, f in sorted(choices.items()):
                if not f.finished:
                    for out in close_choice(index, f, "stop"):
                        yield out
            done = True
            if turn is not None:
                turn.answer = choices[0].sent if 0 in choices else ""
                with anyio.CancelScope(shield=True):
                    await in_thread(lambda: finish(turn))
            yield "data: [DONE]\n\n"
        except Exception as e:  # noqa: BLE001 - recorded as failed, then sent as an error event
            err = upstream_error(e)
            await failed(err.message)
            yield event({"error": {"message": err.message, "type": err.type, "param": None, "code": err.code}})
        finally:
            await failed("the stream was interrupted")

    # -- routes ------------------------------------------------------------------------------

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        """Liveness (no key needed)."""
        return {"status": "ok", "model": model}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        """The one model this proxy serves."""
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "memory-pipelines"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        """One turn of an agent run (see the module docstring)."""
        try:
            body = await request.json()
        except ValueError:
            return ProxyError(400, "invalid request: the body is not valid JSON").response()
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return ProxyError(400, "invalid request: 'messages' must be a non-empty array").response()
        stream = bool(body.get("stream"))
        try:
            forwarded_fields(body)
        except ProxyError as e:
            return e.response()
        ids = {name: (request.headers.get(h) or "").strip() or None for name, h in HEADERS.items()}
        if ids["agent_id"] is None:
            if not passthrough:
                return ProxyError(
                    400, "invalid request: the X-Memory-Agent header is required (the proxy "
                    "was not started with --passthrough)", code="missing_agent",
                ).response()
            return await call(body, list(body["messages"]), stream, None)
        if ids["user_id"] is None and isinstance(body.get("user"), str) and body["user"].strip():
            ids["user_id"] = body["user"]
        ids["run_id"] = ids["run_id"] or new_id("run")
        ids["conversation_id"] = ids["conversation_id"] or new_id("conv")
        try:
            ctx = RunContext(**ids)
            turn, system = await in_thread(
                lambda: prepare(request, ctx, body["messages"], body.get("tools"), json_requested(body))
            )
        except Exception as e:  # noqa: BLE001 - mapped onto the OpenAI error format
            return proxy_error(e).response()
        msgs = ([{"role": "system", "content": system}] if system else []) + list(body["messages"])
        if turn.intercept_tools:
            body = {**body, "tools": [*body["tools"], MEMORY_TOOL_SPEC]}
        return await call(body, msgs, stream, turn)

    async def call(body: dict[str, Any], msgs: list[Any], stream: bool, turn: Turn | None) -> Any:
        litellm = import_litellm()

        headers = turn.headers() if turn else {}
        try:
            if offline is not None:
                resp: Any = offline.stream(msgs) if stream else offline.completion(msgs)
            else:
                resp = await litellm.acompletion(**upstream_args(body, msgs, stream))
        except Exception as e:  # noqa: BLE001 - every upstream failure is the client's error
            err = upstream_error(e)
            if turn is not None:
                await in_thread(lambda: finish(turn, err.message))
            return err.response(headers)
        if stream:
            return StreamingResponse(
                stream_answer(resp, turn, strip=turn is not None),
                media_type="text/event-stream",
                headers=headers,
            )
        data = answer_json(resp, turn)
        if turn is not None:
            await in_thread(lambda: finish(turn))
        return AnswerResponse(content=data, headers=headers)

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> Any:
        """Rate a recorded message: ``{"conversation_id", "message_id", "rating" (1-10),
        "comment"}`` -> the stored rating."""
        try:
            body = await request.json()
        except ValueError:
            return ProxyError(400, "invalid request: the body is not valid JSON").response()
        if not isinstance(body, dict):
            return ProxyError(400, "invalid request: the body must be a JSON object").response()
        cid, mid = body.get("conversation_id"), body.get("message_id")
        rating, comment = body.get("rating"), body.get("comment")
        if not isinstance(cid, str) or not cid or not isinstance(mid, str) or not mid:
            return ProxyError(400, "invalid request: conversation_id and message_id are required").response()
        if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 10:
            return ProxyError(400, f"invalid request: rating must be an integer 1-10, got {rating!r}").response()
        if comment is not None and not isinstance(comment, str):
            return ProxyError(400, "invalid request: comment must be a string").response()

        def run() -> dict[str, Any]:
            conv = svc.sources.get_conversation(cid)
            if conv is None:
                raise NotFoundError(f"conversation {cid!r} does not exist")
            check_context(request.state.api_key, {k: conv.get(k) for k in ("agent_id", "user_id", "company_id")}, svc.sources)
            row = message_row(cid, mid)
            if row is None:
                raise NotFoundError(f"message {mid!r} does not exist in conversation {cid!r}")
            svc.add_message(cid, mid, row["role"], row["text"], rating=rating, rating_comment=comment)
            logger.info("proxy feedback conversation=%s message=%s rating=%d", cid, mid, rating)
            return {"conversation_id": cid, "message_id": mid, "rating": rating, "comment": comment}

        try:
            return await in_thread(run)
        except Exception as e:  # noqa: BLE001
            return proxy_error(e).response()

    return app


# --------------------------------------------------------------------------- serving


def serve(
    home: str | None,
    model: str,
    host: str,
    port: int,
    *,
    passthrough: bool = False,
    log_level: str = "info",
    timeout: float | None = None,
    max_body_bytes: int | None = None,
    max_injected_tokens: int | Mapping[str, int] | None = None,
) -> int:
    """``memory-pipelines proxy``: serve the OpenAI-compatible memory proxy until stopped."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        svc = MemoryService.from_env(home)
    except MemoryPipelineError as e:
        print(f"memory-pipelines proxy: {e}", file=sys.stderr)
        return 1
    try:
        refusal = bind_refusal(host, svc.sources, "proxy")
        if refusal is not None:
            print(refusal, file=sys.stderr)
            return 1
        buffer_attribution(svc.context)
        app = create_app(
            svc, model, passthrough=passthrough, write_queue=write_queue_enabled(), timeout=timeout,
            max_body_bytes=max_body_bytes, max_injected_tokens=max_injected_tokens,
        )
        return run_server(app, host, port, log_level)
    finally:
        svc.close()

