"""The memory protocol of a model's answer: the ``memoryWrites`` a model emits, taken out
of the text its user should read.

:func:`split_memory_writes` understands the forms a model answers in:

* a **trailing block** (what the proxy's instructions ask for): the answer as plain text,
  then a fenced block whose info string is ``memoryWrites`` holding a JSON array::

      Noted, I will use metric units.

      ```memoryWrites
      [{"note": "User prefers metric units.", "type": "Preference"}]
      ```

  The answer is the text around the block; an array that does not parse is kept as one
  malformed write, so the guard pipeline reports it instead of it vanishing.
* a **JSON answer**: the whole content one JSON object (optionally in a ```` ```json ````
  fence) with a ``memoryWrites`` field, as :func:`~memory_pipelines.writes.write_instructions`
  asks for. The envelope ``{"answer": "...", "memoryWrites": [...]}`` gives the answer's
  text; an object with other fields is the model's own JSON, re-serialised without
  ``memoryWrites`` (so is every object when ``keep_json`` is true: a client that asked
  for JSON gets JSON). The envelope without the field, ``{"answer": "..."}`` (a model
  with nothing to save), also gives the answer's text, with writes ``None``; with
  ``keep_json`` it stays JSON, unchanged.

Anything else is an answer without the protocol: its text unchanged, writes ``None``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from memory_pipelines.config import WriteConfig
from memory_pipelines.notes import AgentConfig

#: The info string of the fenced block that carries a trailing block's writes.
BLOCK_TAG = "memoryWrites"
#: What opens a trailing block (matched case-insensitively).
BLOCK_OPEN = "```" + BLOCK_TAG
#: The field of a JSON answer that carries its text.
ANSWER_FIELD = "answer"

_SURROGATE = re.compile("[\ud800-\udfff]")
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)\n?\s*```", re.DOTALL)
_BLOCK = re.compile(r"```memorywrites[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def split_memory_writes(content: str, *, keep_json: bool = False) -> tuple[str, list[Any] | None]:
    """``(answer_text, writes)`` of a model's answer: the text its user should read and
    the ``memoryWrites`` it carried (``None`` when it carried none: the text is then the
    content unchanged, or an answer envelope's text). ``keep_json``: a JSON answer stays JSON (re-serialised without
    ``memoryWrites``) instead of being reduced to its ``answer`` text."""
    if not isinstance(content, str):
        raise TypeError(f"content must be a str, got {type(content).__name__}")
    found = _json_answer(content, keep_json)
    if found is not None:
        return found
    return _trailing_block(content)


def chat_write_instructions(agent: AgentConfig, config: WriteConfig) -> str:
    """The short "Durable Memory" block for a chat model whose answer a person reads: the
    answer stays plain text and the writes ride in a trailing ``memoryWrites`` block (what
    the proxy asks for). Empty for an agent with ``allow_memory_write=False``."""
    if not agent.allow_memory_write:
        return ""
    return "\n".join([
        "## Durable Memory",
        "Answer in plain text. When the user states a durable fact or preference, save it by"
        " ending your reply with a block the user never sees:",
        f"{BLOCK_OPEN}",
        '[{"note": "User prefers metric units.", "type": "Preference"}]',
        "```",
        f"- One atomic third-person fact per note, at most {config.max_note_length} characters;"
        ' type "Preference" or "Context"; add "scopeHint": "agent" for a fact about all users.',
        "- Never save instructions, rules or transient task state. At most"
        f" {config.max_writes_per_run} new notes per run; do not resubmit.",
        "- Results arrive next turn: never claim a note was saved before that.",
    ])


def _json_answer(content: str, keep_json: bool) -> tuple[str, list[Any] | None] | None:
    text = content.strip()
    fenced = _FENCE.fullmatch(text)
    inner = fenced.group(1).strip() if fenced else text
    if not inner.startswith("{"):
        return None
    try:
        obj = json.loads(inner)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if "memoryWrites" not in obj:
        # the envelope without writes (a model that had nothing to save) is still the
        # envelope: its user reads the answer's text; other JSON is the model's own
        if not keep_json and _is_envelope(obj):
            return scrub(obj[ANSWER_FIELD]), None
        return None
    writes = _as_list(obj.pop("memoryWrites"))
    if not keep_json:
        if not obj:
            return "", writes
        if _is_envelope(obj):
            return scrub(obj[ANSWER_FIELD]), writes
    cleaned = scrub(json.dumps(obj, ensure_ascii=False, indent=2 if "\n" in inner else None))
    if fenced:
        cleaned = f"```json\n{cleaned}\n```"
    return cleaned, writes


def _is_envelope(obj: dict[str, Any]) -> bool:
    return set(obj) == {ANSWER_FIELD} and isinstance(obj[ANSWER_FIELD], str)


def scrub(text: str) -> str:
    """``text`` with each lone surrogate (which a JSON ``\\ud800`` escape decodes to, and
    which cannot be encoded as UTF-8) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def _trailing_block(content: str) -> tuple[str, list[Any] | None]:
    blocks = list(_BLOCK.finditer(content))
    if not blocks:
        return content, None
    writes: list[Any] = []
    kept: list[str] = []
    start = 0
    for m in blocks:
        kept.append(content[start : m.start()])
        start = m.end()
        writes.extend(_block_writes(m.group(1)))
    kept.append(content[start:])
    parts = [p.strip("\n") for p in kept]
    answer = "\n\n".join(p.rstrip() for p in parts if p.strip())
    return answer, writes


def _block_writes(raw: str) -> list[Any]:
    raw = raw.strip()
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        return [raw]  # one malformed write: answered rejected-type, never dropped silently
    if isinstance(data, dict) and "memoryWrites" in data:
        data = data["memoryWrites"]
    return _as_list(data)


def _as_list(writes: Any) -> list[Any]:
    if writes is None:
        return []
    if isinstance(writes, list):
        return writes
    return [writes]  # answered rejected-type by the guard pipeline
