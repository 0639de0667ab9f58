"""The litellm judge: every decision asked of any litellm chat model, validated.

Prompts come from :mod:`memory_pipelines.judge.prompts`, reply shapes from
:mod:`memory_pipelines.judge.schemas`. A reply that cannot be parsed or fails its schema,
or a call that fails, raises ``JudgeError``; what the offline rules never mine (injection
attempts, personal data) a model may not write either.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from memory_pipelines.errors import ConfigError, JudgeError, ValidationError
from memory_pipelines.judge.decisions import (
    MIN_EXAMPLE_SCORE,
    RATING_CONTEXTS,
    CandidateExample,
    CandidateNote,
    ConsolidationDecision,
    ContradictionDecision,
    ConversationMessage,
    DedupeDecision,
    _cluster_problem,
    _pair_precheck,
    _recency_key,
    _scope_level,
)
from memory_pipelines.judge.lexicon import _missing_entities, entities
from memory_pipelines.judge.prompts import (
    CONSOLIDATE_SYSTEM,
    CONTRADICTION_SYSTEM,
    DEDUPE_SYSTEM,
    EXTRACT_EXAMPLES_SYSTEM,
    EXTRACT_NOTES_SYSTEM,
    render,
)
from memory_pipelines.judge.rules import _INJECTION, _PII
from memory_pipelines.judge.schemas import (
    TASK_SCHEMAS,
    _ConsolidateOut,
    _ContradictionOut,
    _DedupeOut,
    _ExamplesOut,
    _narrow_ids,
    _NotesOut,
    _Out,
)
from memory_pipelines.litellm_loader import import_litellm
from memory_pipelines.notes import Example, Note
from memory_pipelines.text import normalize_text

#: How the judge asks for JSON (``LiteLLMJudge(response_format=...)``,
#: ``$MEMORY_LLM_RESPONSE_FORMAT``): "json_object" (JSON mode where litellm says the model
#: has it), "schema" (``{"type": "json_object", "schema": ...}``: llama-cpp-python's server
#: and others constrain decoding to the task's JSON schema), "json_schema" (OpenAI structured
#: outputs, also llama.cpp's own server and vLLM) or "none".
RESPONSE_FORMATS: tuple[str, ...] = ("json_object", "schema", "json_schema", "none")


def judge_options_from_env(env: Any = None) -> dict[str, Any]:
    """``LiteLLMJudge`` options from ``$MEMORY_LLM_RESPONSE_FORMAT``,
    ``$MEMORY_LLM_MAX_TOKENS`` and ``$MEMORY_LLM_TIMEOUT`` (unset: the defaults). A bad value
    is a ``ConfigError``."""
    env = os.environ if env is None else env
    options: dict[str, Any] = {}
    fmt = (env.get("MEMORY_LLM_RESPONSE_FORMAT") or "").strip().lower()
    if fmt:
        if fmt not in RESPONSE_FORMATS:
            raise ConfigError(
                f"MEMORY_LLM_RESPONSE_FORMAT must be one of {', '.join(RESPONSE_FORMATS)}; got {fmt!r}"
            )
        options["response_format"] = fmt
    for key, name, kind in (
        ("max_tokens", "MEMORY_LLM_MAX_TOKENS", int),
        ("timeout", "MEMORY_LLM_TIMEOUT", float),
    ):
        raw = (env.get(name) or "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
        except ValueError:
            value = 0
        if not value > 0:
            raise ConfigError(f"{name} must be a positive number; got {raw!r}")
        options[key] = value
    return options


def _untrusted(text: str | None) -> bool:
    """Text a model's answer may not turn into memory: an injection attempt or personal
    data (the offline rules' filters, applied to the model's output and its sources)."""
    return bool(text) and bool(_INJECTION.search(text) or _PII.search(text))


#: the kind of a JudgeError for a reply that holds no JSON object
UNPARSABLE = "unparsable reply"

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object in a model's reply: ```json fences and prose around the object are
    tolerated, and trailing commas are repaired. Raises ``JudgeError`` otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise JudgeError("the model returned an empty reply", kind=UNPARSABLE)
    s = text.strip()
    if m := _FENCE.search(s):
        s = m.group(1).strip()
    attempts = [s]
    start, end = s.find("{"), s.rfind("}")
    if start != -1 and end > start:
        attempts.append(s[start : end + 1])
    attempts += [re.sub(r",\s*([}\]])", r"\1", a) for a in list(attempts)]
    last: Exception | None = None
    for candidate in attempts:
        try:
            value = json.loads(candidate)
        except ValueError as e:
            last = e
            continue
        if not isinstance(value, dict):
            raise JudgeError(
                f"the model returned JSON {type(value).__name__}, expected an object",
                kind=UNPARSABLE,
            )
        return value
    raise JudgeError(f"the model returned malformed JSON: {last}", kind=UNPARSABLE) from last


class LiteLLMJudge:
    """Judge backed by any litellm chat model (OpenAI, Anthropic, Ollama, ...).

    Every call: temperature 0, ``timeout`` seconds, ``num_retries`` retries, at most
    ``max_tokens`` tokens when set, and the reply format of ``response_format`` (see
    :data:`RESPONSE_FORMATS`: JSON mode when the model supports it by default; "schema" or
    "json_schema" send the task's JSON schema from :data:`TASK_SCHEMAS` for constrained
    decoding); ``completion_kwargs`` are passed to ``litellm.completion`` last
    (tests use ``mock_response``). The reply is parsed and validated (note types, scope
    levels, confidence 0-100, ids among the given ones); any failure raises ``JudgeError``.
    litellm is imported on the first call, never at module import.
    """

    def __init__(
        self,
        model: str,
        *,
        timeout: float = 30,
        num_retries: int = 2,
        temperature: float = 0,
        completion_kwargs: dict[str, Any] | None = None,
        response_format: str = "json_object",
        max_tokens: int | None = None,
    ) -> None:
        """Store the settings; nothing is imported or called yet."""
        if not isinstance(model, str) or not model.strip():
            raise ConfigError("LiteLLMJudge needs a litellm model string")
        if response_format not in RESPONSE_FORMATS:
            raise ConfigError(
                f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; got {response_format!r}"
            )
        self.response_format = response_format
        self.max_tokens = max_tokens
        self.model = model.strip()
        self.name = f"litellm:{self.model}"
        self.timeout = timeout
        self.num_retries = int(num_retries)
        self.temperature = temperature
        self.completion_kwargs = dict(completion_kwargs or {})
        self._json_mode: bool | None = None

    # ------------------------------------------------------------------ transport

    def _litellm(self) -> Any:
        try:
            litellm = import_litellm()
        except ImportError as e:  # pragma: no cover - litellm is a dependency
            raise JudgeError("litellm is not installed") from e
        litellm.suppress_debug_info = True
        return litellm

    def _supports_json(self, litellm: Any) -> bool:
        if self._json_mode is None:
            try:
                params = litellm.get_supported_openai_params(model=self.model) or []
            except Exception:
                params = []
            self._json_mode = "response_format" in params
        return self._json_mode

    def _response_format(
        self, task: str, litellm: Any, ids: Mapping[str, Sequence[str]] | None = None
    ) -> dict[str, Any] | None:
        """The ``response_format`` of a call for ``task`` in this judge's mode (a schema's
        id properties limited to ``ids``)."""
        schema = _narrow_ids(TASK_SCHEMAS[task], ids or {})
        if self.response_format == "schema":
            return {"type": "json_object", "schema": schema}
        if self.response_format == "json_schema":
            name = task.replace(" ", "_")
            return {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            }
        if self.response_format == "json_object" and self._supports_json(litellm):
            return {"type": "json_object"}
        return None

    def _ask(
        self,
        task: str,
        messages: list[dict[str, str]],
        ids: Mapping[str, Sequence[str]] | None = None,
    ) -> dict[str, Any]:
        """One completion for ``task``; the reply's JSON object (``JudgeError`` on failure)."""
        litellm = self._litellm()
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "timeout": self.timeout,
            "num_retries": self.num_retries,
        }
        if self.max_tokens:
            kwargs["max_tokens"] = self.max_tokens
        response_format = self._response_format(task, litellm, ids)
        if response_format is not None:
            kwargs["response_format"] = response_format
        kwargs.update(self.completion_kwargs)
        try:
            response = litellm.completion(**kwargs)
        except Exception as e:
            kind = "timed out" if "timeout" in type(e).__name__.lower() else "call failed"
            raise JudgeError(
                f"{self.name}: {task} call failed ({type(e).__name__}): {e}", kind=kind
            ) from e
        try:
            choice = response.choices[0]
            content = choice.message.content
        except (AttributeError, IndexError, KeyError, TypeError) as e:
            raise JudgeError(f"{self.name}: {task} reply has no message content", kind=UNPARSABLE) from e
        try:
            return parse_json_object(content)
        except JudgeError as e:
            if getattr(choice, "finish_reason", None) == "length":
                raise JudgeError(
                    f"{self.name}: {task}: the reply was cut off at max_tokens="
                    f"{self.max_tokens or 'the server default'} before its JSON ended; "
                    "raise MEMORY_LLM_MAX_TOKENS",
                    kind="cut off at max_tokens",
                ) from e
            raise JudgeError(f"{self.name}: {task}: {e}", kind=e.kind) from e

    def _validate(self, task: str, schema: type[_Out], data: dict[str, Any]) -> Any:
        try:
            return schema.model_validate(data)
        except PydanticValidationError as e:
            raise JudgeError(
                f"{self.name}: {task} reply fails its schema: {e}", kind="reply fails its schema"
            ) from e

    # ------------------------------------------------------------------ decisions

    def extract_notes(
        self,
        messages: Sequence[ConversationMessage],
        existing: Sequence[Note],
        *,
        rating_context: str,
    ) -> list[CandidateNote]:
        """Notes the model extracts (prompt 'extract notes'). Merge ids must name existing
        notes and source ids given messages; "failure" keeps at most one Issue/Context lesson
        with the Ephemeral hint. No messages: [] without a call."""
        if rating_context not in RATING_CONTEXTS:
            raise ValidationError(
                f"rating_context must be one of {', '.join(RATING_CONTEXTS)}; got {rating_context!r}"
            )
        if not messages:
            return []
        data = {
            "ratingContext": rating_context,
            "messages": [
                {
                    "id": m.message_id,
                    "role": m.role,
                    "text": m.text,
                    "rating": m.rating,
                    "ratingComment": m.rating_comment,
                }
                for m in messages
            ],
            "existingNotes": [
                {"id": n.id, "type": str(n.type), "content": n.note} for n in existing
            ],
        }
        prompt = render(EXTRACT_NOTES_SYSTEM, data, rating_context=rating_context)
        existing_ids = {n.id for n in existing}
        message_ids = {m.message_id for m in messages if m.message_id}
        ids = {"sourceMessageId": sorted(message_ids), "mergeWithExistingIds": sorted(existing_ids)}
        out = self._validate("extract notes", _NotesOut, self._ask("extract notes", prompt, ids))
        hostile = {m.message_id for m in messages if m.message_id and _untrusted(m.text)}
        notes: list[CandidateNote] = []
        for item in out.notes:
            merge = list(item.merge_with_existing_ids)
            if item.merge_with_existing_id:
                merge.append(item.merge_with_existing_id)
            merge = list(dict.fromkeys(m for m in merge if m))
            unknown = [m for m in merge if m not in existing_ids]
            if unknown:
                raise JudgeError(
                    f"{self.name}: extract notes names unknown existing notes {unknown[:5]}"
                )
            if item.source_message_id and item.source_message_id not in message_ids:
                raise JudgeError(
                    f"{self.name}: extract notes names unknown message {item.source_message_id!r}"
                )
            if _untrusted(item.content) or item.source_message_id in hostile:
                continue  # what the offline rules never mine, a model may not write either
            type_, hint = item.type, item.protection_tier_hint
            if rating_context == "failure":
                type_ = type_ if type_ in ("Issue", "Context") else "Issue"
                hint = "Ephemeral"
            notes.append(
                CandidateNote(
                    content=item.content.strip(),
                    type=type_,
                    scope_level=item.scope_level or "user",
                    confidence=float(item.confidence),
                    merge_with_existing_ids=tuple(merge),
                    protection_tier_hint=hint,
                    source_message_id=item.source_message_id,
                )
            )
        return notes[:1] if rating_context == "failure" else notes

    def extract_examples(
        self, messages: Sequence[ConversationMessage], existing: Sequence[Example]
    ) -> list[CandidateExample]:
        """Examples the model picks; kept when success_score >= 70 and confidence >= 70 and
        the normalised input is new. No messages: [] without a call."""
        if not messages:
            return []
        data = {
            "messages": [
                {
                    "id": m.message_id,
                    "role": m.role,
                    "text": m.text,
                    "rating": m.rating,
                    "ratingComment": m.rating_comment,
                }
                for m in messages
            ],
            "existingExamples": [{"id": e.id, "input": e.example_input} for e in existing],
        }
        prompt = render(EXTRACT_EXAMPLES_SYSTEM, data)
        message_ids = {m.message_id for m in messages if m.message_id}
        ids = {"sourceMessageId": sorted(message_ids)}
        out = self._validate(
            "extract examples", _ExamplesOut, self._ask("extract examples", prompt, ids)
        )
        seen = {normalize_text(e.example_input) for e in existing}
        result: list[CandidateExample] = []
        for item in out.examples:
            if item.source_message_id and item.source_message_id not in message_ids:
                raise JudgeError(
                    f"{self.name}: extract examples names unknown message {item.source_message_id!r}"
                )
            key = normalize_text(item.example_input)
            if _untrusted(item.example_input) or _PII.search(item.example_output):
                continue
            if (
                item.success_score < MIN_EXAMPLE_SCORE
                or item.confidence < MIN_EXAMPLE_SCORE
                or key in seen
            ):
                continue
            seen.add(key)
            result.append(
                CandidateExample(
                    example_input=item.example_input,
                    example_output=item.example_output,
                    success_score=float(item.success_score),
                    confidence=float(item.confidence),
                    source_message_id=item.source_message_id,
                )
            )
        return result

    def is_duplicate(self, candidate: str, matches: Sequence[Note]) -> DedupeDecision:
        """The model's {shouldAdd, reason}; no matches: add without a call."""
        if not matches:
            return DedupeDecision(True, "no similar notes")
        data = {
            "candidate": candidate,
            "similarNotes": [{"id": n.id, "type": str(n.type), "content": n.note} for n in matches],
        }
        out = self._validate(
            "deduplicate", _DedupeOut, self._ask("deduplicate", render(DEDUPE_SYSTEM, data))
        )
        return DedupeDecision(
            bool(out.should_add),
            out.reason or ("adds information" if out.should_add else "duplicate"),
        )

    def synthesize_cluster(self, notes: Sequence[Note], *, anchored: bool) -> ConsolidationDecision:
        """The model's consolidation; an invalid cluster is refused without a call. Source
        ids must be cluster ids (none given: all); the note must keep every entity of the
        cluster (as the offline synthesis does), else ``JudgeError``; a missing type becomes
        the type of the newest note."""
        problem = _cluster_problem(notes)
        if problem is not None:
            return ConsolidationDecision(False, reason=problem)
        data = {
            "anchoredMode": anchored,
            "notes": [
                {
                    "id": n.id,
                    "type": str(n.type),
                    "content": n.note,
                    "createdAt": n.created_at.isoformat() if n.created_at else None,
                    "accessCount": n.access_count,
                    "importanceScore": n.importance_score,
                    "consolidationCount": n.consolidation_count,
                    "agentId": n.agent_id,
                    "userId": n.user_id,
                    "companyId": n.company_id,
                }
                for n in notes
            ],
        }
        prompt = render(CONSOLIDATE_SYSTEM, data, anchored=str(anchored).lower())
        ids = {n.id for n in notes}
        out = self._validate(
            "consolidate",
            _ConsolidateOut,
            self._ask("consolidate", prompt, {"sourceNoteIds": sorted(ids)}),
        )
        unknown = [i for i in out.source_note_ids if i not in ids]
        if unknown:
            raise JudgeError(
                f"{self.name}: consolidate names notes outside the cluster {unknown[:5]}"
            )
        if not out.should_consolidate:
            return ConsolidationDecision(
                False, reason=out.reason or "the model kept the notes separate"
            )
        note = out.consolidated_note
        if note is None or not note.content.strip():
            raise JudgeError(f"{self.name}: consolidate said yes but gave no consolidated note")
        missing = _missing_entities(entities(" ".join(n.note for n in notes)), note.content)
        if missing:  # archiving the sources into this note would lose them
            raise JudgeError(f"{self.name}: consolidate drops entities {missing[:5]}")
        newest = max(notes, key=_recency_key)
        return ConsolidationDecision(
            should_consolidate=True,
            content=note.content.strip(),
            type=note.type or str(newest.type),
            scope_level=note.scope_level or _scope_level(notes),
            confidence=float(note.confidence),
            source_note_ids=tuple(dict.fromkeys(out.source_note_ids)) or tuple(n.id for n in notes),
            reason=out.reason,
        )

    def detect_contradiction(self, a: Note, b: Note) -> ContradictionDecision:
        """The model's two-stage contradiction verdict. Self-pairs and pairs of different
        agents or scopes are answered without a call; keep/revoke ids must be the two notes."""
        pre = _pair_precheck(a, b)
        if pre is not None:
            return pre
        data = {
            "notes": [
                {
                    "id": n.id,
                    "type": str(n.type),
                    "content": n.note,
                    "createdAt": n.created_at.isoformat() if n.created_at else None,
                    "importanceScore": n.importance_score,
                    "accessCount": n.access_count,
                }
                for n in (a, b)
            ]
        }
        prompt = render(CONTRADICTION_SYSTEM, data)
        pair_ids = [a.id, b.id]
        out = self._validate(
            "contradiction",
            _ContradictionOut,
            self._ask("contradiction", prompt, {"keepNoteId": pair_ids, "revokeNoteId": pair_ids}),
        )
        pair = {a.id, b.id}
        named = [i for i in (out.keep_note_id, out.revoke_note_id) if i]
        if any(i not in pair for i in named):
            raise JudgeError(f"{self.name}: contradiction names notes outside the pair {named}")
        triples = tuple(tuple(t) for t in out.entity_triples)
        if not out.is_contradiction:
            return ContradictionDecision(
                False,
                contradiction_type=out.contradiction_type,
                reason=out.reason,
                confidence=float(out.confidence),
                entity_triples=triples,  # type: ignore[arg-type]
            )
        if out.contradiction_type is None:
            raise JudgeError(f"{self.name}: contradiction without a contradictionType")
        if {out.keep_note_id, out.revoke_note_id} != pair:
            raise JudgeError(
                f"{self.name}: a contradiction must keep one note of the pair and revoke the other"
            )
        return ContradictionDecision(
            True,
            contradiction_type=out.contradiction_type,
            keep_note_id=out.keep_note_id,
            revoke_note_id=out.revoke_note_id,
            reason=out.reason,
            confidence=float(out.confidence),
            entity_triples=triples,  # type: ignore[arg-type]
        )
