"""A streamed answer of the memory proxy: :class:`StreamRelay` passes the model's chunks on
as server-sent events, each choice through a :class:`~.turns.ChoiceFilter` (which holds
back the ``memoryWrites`` block and the memory tool's calls), then finishes the turn once:
completed when the stream ends, failed when the upstream fails or the client leaves."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
from starlette.concurrency import run_in_threadpool

from memory_pipelines.apps.proxy.turns import ChoiceFilter, Turn, upstream_error
from memory_pipelines.writes.protocol import scrub


class StreamRelay:
    """One streamed answer: the upstream's chunks in, the client's events out."""

    def __init__(
        self, turn: Turn | None, *, strip: bool, finish: Callable[[Turn, str | None], None]
    ):
        self.turn = turn
        self.strip = strip
        self.finish = finish
        self.choices: dict[int, ChoiceFilter] = {}
        self.intercept = bool(turn and turn.intercept_tools)
        self.done = False
        self.meta: dict[str, Any] = {}

    async def events(self, upstream_iter: Any) -> AsyncIterator[str]:
        """The events for the client; the turn is finished exactly once."""
        try:
            async for part in upstream_iter:
                for out in self.relay(part):
                    yield out
            for index, f in sorted(self.choices.items()):
                if not f.finished:
                    for out in self.close_choice(index, f, "stop"):
                        yield out
            await self.finish_once(None)
            yield "data: [DONE]\n\n"
        except Exception as e:  # noqa: BLE001 - recorded as failed, then sent as an error event
            err = upstream_error(e)
            await self.finish_once(err.message)
            yield self.event(
                {
                    "error": {
                        "message": err.message,
                        "type": err.type,
                        "param": None,
                        "code": err.code,
                    }
                }
            )
        finally:
            await self.finish_once("the stream was interrupted")

    async def finish_once(self, error: str | None) -> None:
        """Finish the turn (failed with ``error``, else completed) unless it is finished."""
        turn = self.turn
        if turn is None or self.done:
            return
        self.done = True
        turn.answer = self.choices[0].sent if 0 in self.choices else ""
        with anyio.CancelScope(shield=True):
            await run_in_threadpool(self.finish, turn, error)

    def relay(self, part: Any) -> list[str]:
        """The events for one upstream chunk."""
        data = part.model_dump() if hasattr(part, "model_dump") else dict(part)
        turn = self.turn
        self.meta = {
            "id": turn.completion_id if turn else data.get("id"),
            "object": "chat.completion.chunk",
            "created": data.get("created") or int(time.time()),
            "model": data.get("model"),
        }
        if data.get("system_fingerprint"):
            self.meta["system_fingerprint"] = data["system_fingerprint"]
        out: list[str] = []
        for choice in data.get("choices") or []:
            index = int(choice.get("index") or 0)
            f = self.choices.setdefault(
                index, ChoiceFilter(self.strip, self.intercept, bool(turn and turn.keep_json))
            )
            if f.finished:
                continue
            delta = self.delta(f, choice.get("delta") or {})
            if delta:
                out.append(self.chunk(index, delta, None))
            if choice.get("finish_reason"):
                out.extend(self.close_choice(index, f, choice["finish_reason"]))
        if data.get("usage"):
            out.append(self.event({**self.meta, "choices": [], "usage": data["usage"]}))
        return out

    @staticmethod
    def delta(f: ChoiceFilter, raw: Mapping[str, Any]) -> dict[str, Any]:
        """What the client gets of one choice's delta (held-back text and calls left out)."""
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
        return delta

    def close_choice(self, index: int, f: ChoiceFilter, reason: str | None) -> list[str]:
        """A choice's last events: the text it held back, then its finish reason."""
        out = []
        content, writes = f.flush()
        if content:
            out.append(self.chunk(index, {"content": content}, None))
        if self.turn is not None:
            self.turn.writes.extend(writes)
            self.turn.writes.extend(f.tool_writes())
        f.finished = True
        out.append(self.chunk(index, {}, f.finish_reason(reason)))
        return out

    def chunk(self, index: int, delta: dict[str, Any], finish: str | None) -> str:
        return self.event(
            {**self.meta, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}
        )

    @staticmethod
    def event(body: Mapping[str, Any]) -> str:
        return f"data: {scrub(json.dumps(body, ensure_ascii=False))}\n\n"
