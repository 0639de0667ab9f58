"""The proxy's built-in offline demo model (``memory-pipelines proxy --model offline``).

It is not a language model: a small deterministic responder, so a newcomer can see the
proxy inject memory and learn from a conversation with no hosted key, no download and
no local model build. Every answer starts with ``[offline demo model]``.

- A user message that states a durable fact or preference ("I prefer metric units",
  "we deploy on Fridays") is read by the offline judge's extraction rules; the answer
  says what it noted and, when the proxy's instructions allow writing, ends with a
  ``memoryWrites`` block holding those facts, which the proxy saves.
- Any other message is answered from the notes the proxy injected (the system message),
  those sharing a word with the message first, or says that it has none yet.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from memory_pipelines.judge.decisions import ConversationMessage
from memory_pipelines.judge.offline import OfflineJudge
from memory_pipelines.writes.protocol import BLOCK_OPEN

#: The ``--model`` value that selects the offline demo model.
OFFLINE_MODEL = "offline"
LABEL = "[offline demo model]"

_NOTE_LINE = re.compile(r"^\[(?:Preference|Context|Constraint|Issue|[A-Za-z]+)(?:, \d{4}-\d{2}-\d{2})?\]"
                        r"(?: \(provisional\))? (.+)$")
_WORD = re.compile(r"[a-z0-9]{3,}")
_STOP = frozenset("the and for with what which who how are you your does did was were that this "
                  "have has had about from into user".split())


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def _words(text: str) -> set[str]:
    return {w.rstrip("s") for w in _WORD.findall(text.lower()) if w not in _STOP}


class OfflineModel:
    """The deterministic responder (see the module docstring)."""

    def __init__(self) -> None:
        self.judge = OfflineJudge(embedder=None)

    def reply(self, messages: Sequence[Any]) -> str:
        """The answer to a chat (OpenAI message dicts)."""
        system = "\n".join(_text(m.get("content")) for m in messages
                           if isinstance(m, Mapping) and m.get("role") == "system")
        user = next((_text(m.get("content")) for m in reversed(messages)
                     if isinstance(m, Mapping) and m.get("role") == "user"), "")
        facts = self.judge.extract_notes(
            [ConversationMessage(role="user", text=user)], [], rating_context="unrated"
        ) if user.strip() else []
        if facts:
            answer = f"{LABEL} Noted: " + " ".join(f.content for f in facts)
            if "## Durable Memory" in system:
                writes = [
                    {"note": f.content, "type": f.type if f.type in ("Preference", "Context") else "Context",
                     **({"scopeHint": "agent"} if f.scope_level != "user" else {})}
                    for f in facts
                ]
                answer += f"\n\n{BLOCK_OPEN}\n{json.dumps(writes, ensure_ascii=False)}\n```"
            return answer
        notes = [m.group(1).strip() for line in system.splitlines() if (m := _NOTE_LINE.match(line.strip()))]
        if not notes:
            return (f"{LABEL} I have no memory for this yet. Tell me something about yourself, "
                    "for example: I prefer short answers.")
        asked = _words(user)
        relevant = [n for n in notes if _words(n) & asked] or notes
        return f"{LABEL} From memory: " + " ".join(relevant)

    def completion(self, messages: Sequence[Any]) -> dict[str, Any]:
        """A chat completion in the OpenAI format."""
        content = self.reply(messages)
        return {
            "id": f"chatcmpl-offline-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": OFFLINE_MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    async def stream(self, messages: Sequence[Any]) -> AsyncIterator[dict[str, Any]]:
        """The same answer as OpenAI stream chunks, a few words at a time."""
        content = self.reply(messages)
        base = {"id": f"chatcmpl-offline-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": OFFLINE_MODEL}
        yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]}
        for piece in re.findall(r"\S+\s*|\s+", content):
            yield {**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
