"""The memory proxy's work on one turn, apart from HTTP: :class:`ProxyEngine` holds what
``create_app`` was given (the service, the model, budgets, the upstream call's
arguments, the write queue) and does each step of a turn in order: check the caller and
the run (:meth:`~ProxyEngine.prepare`), call the model (:meth:`~ProxyEngine.call`), take
the ``memoryWrites`` out of its answer (:meth:`~ProxyEngine.answer_json`, or the stream
relay of :mod:`.streaming`), then write them and record the turn
(:meth:`~ProxyEngine.finish`). The routes of :mod:`.routes` call it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from memory_pipelines.apps.http import RunLocks, WriteQueue
from memory_pipelines.apps.proxy.offline import OFFLINE_MODEL, OfflineModel
from memory_pipelines.apps.proxy.streaming import StreamRelay
from memory_pipelines.apps.proxy.tokens import fit_injection, token_counter
from memory_pipelines.apps.proxy.turns import (
    FEEDBACK_KEY,
    MEMORY_TOOL,
    ProxyError,
    Turn,
    forwarded_fields,
    last_user,
    new_id,
    split_memory_writes,
    tool_writes,
    upstream_error,
)
from memory_pipelines.errors import ConfigError, MemoryPipelineError, NotFoundError
from memory_pipelines.injection import Injection
from memory_pipelines.injection.attribution import record_attribution
from memory_pipelines.keys import Authenticator, check_context
from memory_pipelines.limits import limits
from memory_pipelines.litellm_loader import import_litellm
from memory_pipelines.notes import AgentConfig, RunContext
from memory_pipelines.service import MemoryService
from memory_pipelines.sources import messages
from memory_pipelines.writes.ownership import claim_run
from memory_pipelines.writes.protocol import chat_write_instructions, scrub

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds the proxy waits for the upstream model (``--timeout``, ``MEMORY_PROXY_TIMEOUT``).
DEFAULT_TIMEOUT = 120.0


class AnswerResponse(JSONResponse):
    """A JSON answer whose lone surrogates (an upstream's ``"\\ud800"`` escape in any
    field: content, tool-call arguments, refusal) are sent as U+FFFD, not a 500."""

    def render(self, content: Any) -> bytes:
        return scrub(
            json.dumps(
                content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
            )
        ).encode("utf-8")


def json_requested(body: Mapping[str, Any]) -> bool:
    """Whether the client asked for a JSON answer (``response_format``)."""
    fmt = body.get("response_format")
    return isinstance(fmt, Mapping) and fmt.get("type") in ("json_object", "json_schema")


def budgets(value: int | Mapping[str, int] | None) -> tuple[int | None, dict[str, int]]:
    """``max_injected_tokens`` as (the default budget, the budget of each named agent)."""
    if value is None or isinstance(value, int):
        out: tuple[int | None, dict[str, int]] = (value, {})
    elif not isinstance(value, Mapping):
        raise ConfigError(
            f"max_injected_tokens must be a positive integer or a mapping, got {value!r}"
        )
    else:
        out = (value.get("*"), {k: v for k, v in value.items() if k != "*"})
    for v in [out[0], *out[1].values()]:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"max_injected_tokens must be a positive integer, got {v!r}")
    return out


async def in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking service call in the thread pool."""
    return await run_in_threadpool(fn)


class ProxyEngine:
    """One proxy's settings and the steps of its turns (see the module)."""

    def __init__(
        self,
        svc: MemoryService,
        model: str,
        *,
        passthrough: bool = False,
        upstream: Mapping[str, Any] | None = None,
        write_queue: bool = True,
        timeout: float | None = None,
        max_injected_tokens: int | Mapping[str, int] | None = None,
    ):
        import_litellm().suppress_debug_info = True
        self.svc = svc
        self.model = model
        self.passthrough = passthrough
        self.auth = Authenticator(svc.sources)
        self.run_locks = RunLocks()
        self.offline = OfflineModel() if model == OFFLINE_MODEL else None
        self.default_budget, self.agent_budgets = budgets(max_injected_tokens)
        self.counter = token_counter() if (self.default_budget or self.agent_budgets) else None
        self.call_kwargs: dict[str, Any] = {
            "max_retries": 0,
            "drop_params": True,
            "timeout": DEFAULT_TIMEOUT if timeout is None else timeout,
            **dict(upstream or {}),
        }
        self.writer = WriteQueue(svc) if write_queue else None

    def close(self) -> None:
        """Stop the write queue (its pending writes are written first)."""
        if self.writer is not None:
            self.writer.close()

    # -- before the model: the caller, the run, the system message ------------------------

    def prepare(
        self, api_key: Any, ctx: RunContext, msgs: list[Any], tools: Any, keep_json: bool
    ) -> tuple[Turn, str]:
        """Check the key, build the system message (taking the run's pending feedback)."""
        svc = self.svc
        check_context(api_key, ctx, svc.sources)
        agent = svc.get_agent(ctx.agent_id)  # UnknownAgentError -> 404
        self.check_owner(ctx)
        index, user_text = last_user(msgs)
        budget = self.budget_of(ctx)
        # under a budget only the notes and examples that reach the model are recorded
        injection = svc.inject(ctx, user_text, record=budget is None)
        # a client that asked for JSON gets the JSON field; a chat answer a trailing block
        instructions = (
            svc.write_instructions(ctx.agent_id)
            if keep_json
            else chat_write_instructions(agent, svc.write_config)
        )
        pending = self.take_feedback(ctx)
        message = injection.message
        if budget is not None:
            rest = "\n\n".join(p for p in (instructions, pending) if p)
            message = self.fit(ctx, agent, injection, budget, rest)
        system = "\n\n".join(p for p in (message, instructions, pending) if p)
        user_id = None
        if user_text is not None:
            digest = hashlib.sha256(
                f"{ctx.conversation_id}\0{index}\0{user_text}".encode()
            ).hexdigest()
            user_id = f"msg-{digest[:32]}"
        has_own = isinstance(tools, list) and any(
            isinstance(t, Mapping) and (t.get("function") or {}).get("name") == MEMORY_TOOL
            for t in tools
        )
        intercept = bool(instructions) and isinstance(tools, list) and bool(tools) and not has_own
        turn = Turn(
            ctx, new_id("chatcmpl-mp"), user_text, user_id, intercept, pending, keep_json=keep_json
        )
        return turn, system

    def budget_of(self, ctx: RunContext) -> int | None:
        """The agent's token budget for the injection; None: no budget, nothing to count."""
        if self.counter is None:
            return None
        return self.agent_budgets.get(ctx.agent_id, self.default_budget)

    def fit(
        self, ctx: RunContext, agent: AgentConfig, injection: Injection, budget: int, rest: str
    ) -> str:
        """The injection's message cut to ``budget`` tokens beside ``rest`` (the rest of the
        system message), and the attribution of the notes and examples it kept."""
        svc, counter = self.svc, self.counter
        assert counter is not None
        message = injection.message
        n_notes, n_examples = len(injection.notes), len(injection.examples)
        if message:
            message, n_notes, n_examples = fit_injection(
                message,
                injection.notes,
                injection.examples,
                budget=budget,
                others=counter.count(rest) + (2 if rest else 0),
                count=counter.count,
                include_memory_policy=svc.inject_config.include_memory_policy,
            )
        if svc.inject_config.record_attribution and (agent.inject_notes or agent.inject_examples):
            record_attribution(
                svc.context,
                ctx,
                injection.notes[:n_notes],
                injection.examples[:n_examples],
                svc.now(),
            )
        return message

    def check_owner(self, ctx: RunContext) -> None:
        """409 unless the run and the conversation are new or already this context's: a
        turn never appends to, or takes over, another agent's, user's or company's."""
        sources = self.svc.sources
        run = sources.get_agent_run(ctx.run_id) if ctx.run_id else None
        if run is not None and run["agent_id"] != ctx.agent_id:
            raise ProxyError(
                409, f"run {ctx.run_id!r} belongs to another agent", code="run_conflict"
            )
        conv = sources.get_conversation(ctx.conversation_id) if ctx.conversation_id else None
        who = ("agent_id", "user_id", "company_id")
        if conv is not None and any(conv.get(k) != getattr(ctx, k) for k in who):
            raise ProxyError(
                409,
                f"conversation {ctx.conversation_id!r} belongs to another agent, user or company",
                code="conversation_conflict",
            )
        # the agent's run of another company or user: 409 before its feedback is read
        claim_run(self.svc.context, ctx)

    # -- the run's write feedback, kept between turns -------------------------------------

    @staticmethod
    def feedback_key(ctx: RunContext) -> str:
        return f"{FEEDBACK_KEY}/{ctx.agent_id}/{ctx.run_id}"

    def take_feedback(self, ctx: RunContext) -> str:
        """The run's pending write feedback, cleared: this turn's model gets it."""
        sources = self.svc.sources
        with self.run_locks.get(f"{ctx.agent_id}\0{ctx.run_id}").lock:
            pending = sources.get_state(self.feedback_key(ctx)) or ""
            if pending:
                sources.set_state(self.feedback_key(ctx), "")
        return pending

    def keep_feedback(self, ctx: RunContext, feedback: str, *, first: bool) -> None:
        """Add ``feedback`` to the run's pending feedback (before it when ``first``)."""
        sources = self.svc.sources
        with self.run_locks.get(f"{ctx.agent_id}\0{ctx.run_id}").lock:
            pending = sources.get_state(self.feedback_key(ctx)) or ""
            parts = (feedback, pending) if first else (pending, feedback)
            sources.set_state(self.feedback_key(ctx), "\n\n".join(p for p in parts if p))

    # -- after the model: writes and the record of the turn -------------------------------

    def finish(self, turn: Turn, error: str | None = None) -> None:
        """Run the turn's writes (keeping their feedback for the next turn) and record it."""
        ctx = turn.ctx
        n_writes = len(turn.writes)
        try:
            # a failed turn's model never saw the feedback it carried: keep it for the next
            feedback = turn.pending if error else ""
            if turn.writes and error is None:
                feedback = self.run_writes(ctx, turn.writes)
            if feedback:
                self.keep_feedback(ctx, feedback, first=error is not None)
            self.record(turn, error)
        except Exception as e:  # the client keeps its answer; the log keeps ids only
            logger.error("memory proxy: recording run %s failed: %s", ctx.run_id, type(e).__name__)
            logger.debug("recording failure", exc_info=e)
            return
        logger.info(
            "proxy turn agent=%s run=%s conversation=%s status=%s writes=%d",
            ctx.agent_id,
            ctx.run_id,
            ctx.conversation_id,
            "failed" if error else "completed",
            n_writes,
        )

    def write(self, ctx: RunContext, writes: list[Any]) -> list[Any]:
        """Through the write queue when there is one, else in this thread."""
        return (
            self.writer.submit(ctx, writes)
            if self.writer is not None
            else self.svc.write(ctx, writes)
        )

    def run_writes(self, ctx: RunContext, writes: list[Any]) -> str:
        """Write the first writes one request may carry; the feedback reports every one."""
        most = limits().max_writes_per_request
        kept, extra = writes[:most], len(writes) - most
        try:
            with self.run_locks.get(f"{ctx.agent_id}\0{ctx.run_id}").lock:
                feedback = self.svc.format_write_feedback(self.write(ctx, kept))
        except MemoryPipelineError as e:
            logger.warning(
                "memory proxy: the writes of run %s failed: %s", ctx.run_id, type(e).__name__
            )
            feedback = f"Memory writes of the previous answer were not saved: {e}"
        if extra > 0:
            feedback += (
                f"\n{extra} more memoryWrites of the previous answer were not saved: one "
                f"answer may carry at most {most}."
            )
        return feedback

    def record(self, turn: Turn, error: str | None) -> None:
        """The turn's conversation, messages and agent run in the SQL sources."""
        svc, ctx = self.svc, turn.ctx
        conv = ctx.conversation_id
        assert conv is not None and ctx.run_id is not None
        svc.add_conversation(conv, ctx.agent_id, ctx.user_id, ctx.company_id)
        if (
            turn.user_text
            and turn.user_message_id
            and not self.message_row(conv, turn.user_message_id)
        ):
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

    def message_row(self, conversation_id: str, message_id: str) -> dict[str, Any] | None:
        with self.svc.sources.begin() as c:
            row = (
                c.execute(
                    select(messages).where(
                        messages.c.message_id == message_id,
                        messages.c.conversation_id == conversation_id,
                    )
                )
                .mappings()
                .first()
            )
        return dict(row) if row else None

    def rate(
        self, api_key: Any, cid: str, mid: str, rating: int, comment: str | None
    ) -> dict[str, Any]:
        """Store a rating of a recorded message, inside the key's binding."""
        svc = self.svc
        conv = svc.sources.get_conversation(cid)
        if conv is None:
            raise NotFoundError(f"conversation {cid!r} does not exist")
        check_context(
            api_key, {k: conv.get(k) for k in ("agent_id", "user_id", "company_id")}, svc.sources
        )
        row = self.message_row(cid, mid)
        if row is None:
            raise NotFoundError(f"message {mid!r} does not exist in conversation {cid!r}")
        svc.add_message(cid, mid, row["role"], row["text"], rating=rating, rating_comment=comment)
        logger.info("proxy feedback conversation=%s message=%s rating=%d", cid, mid, rating)
        return {"conversation_id": cid, "message_id": mid, "rating": rating, "comment": comment}

    # -- the upstream call ----------------------------------------------------------------

    def upstream_args(
        self, body: Mapping[str, Any], msgs: list[Any], stream: bool
    ) -> dict[str, Any]:
        return {
            **forwarded_fields(body),
            **self.call_kwargs,
            "model": self.model,
            "messages": msgs,
            "stream": stream,
        }

    async def call(
        self, body: dict[str, Any], msgs: list[Any], stream: bool, turn: Turn | None
    ) -> Any:
        """Ask the model, answer the client and finish the turn (a stream finishes it
        when the stream ends)."""
        headers = turn.headers() if turn else {}
        try:
            if self.offline is not None:
                resp: Any = self.offline.stream(msgs) if stream else self.offline.completion(msgs)
            else:
                resp = await import_litellm().acompletion(**self.upstream_args(body, msgs, stream))
        except Exception as e:  # noqa: BLE001 - every upstream failure is the client's error
            err = upstream_error(e)
            if turn is not None:
                await in_thread(lambda: self.finish(turn, err.message))
            return err.response(headers)
        if stream:
            relay = StreamRelay(turn, strip=turn is not None, finish=self.finish)
            return StreamingResponse(
                relay.events(resp), media_type="text/event-stream", headers=headers
            )
        data = self.answer_json(resp, turn)
        if turn is not None:
            await in_thread(lambda: self.finish(turn))
        return AnswerResponse(content=data, headers=headers)

    @staticmethod
    def answer_json(resp: Any, turn: Turn | None) -> dict[str, Any]:
        """The model's answer for the client, its ``memoryWrites`` and memory tool calls
        taken into the turn."""
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
