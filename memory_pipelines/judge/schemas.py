"""The shapes of a model's replies: pydantic reply models and each task's JSON schema.

The reply models validate what a model returned (camelCase or snake_case keys, note
types, scope levels, confidence 0-100); :data:`TASK_SCHEMAS` are sent for constrained
decoding, with id properties narrowed per call by :func:`_narrow_ids`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, field_validator
from pydantic.alias_generators import to_camel

from memory_pipelines.judge.decisions import CONTRADICTION_TYPES, NOTE_TYPES, SCOPE_LEVELS


def _choice(options: Sequence[str]) -> Any:
    """A before-validator mapping a value case-insensitively onto one of ``options``."""
    table = {o.lower(): o for o in options}

    def check(value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in table:
            return table[value.strip().lower()]
        return value

    return check


_NoteTypeName = Annotated[
    Literal["Preference", "Constraint", "Context", "Example", "Issue"],
    BeforeValidator(_choice(NOTE_TYPES)),
]
_ScopeName = Annotated[Literal["global", "company", "user"], BeforeValidator(_choice(SCOPE_LEVELS))]
_Confidence = Annotated[float, Field(ge=0, le=100)]


class _Out(BaseModel):
    """Base of the model-output schemas: camelCase or snake_case keys, extra keys ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class _NoteOut(_Out):
    content: str = Field(min_length=1, max_length=1000)
    type: _NoteTypeName
    scope_level: _ScopeName | None = None
    confidence: _Confidence
    merge_with_existing_id: str | None = None
    merge_with_existing_ids: list[str] = Field(default_factory=list, max_length=100)
    protection_tier_hint: (
        Annotated[
            Literal["Ephemeral", "Standard"], BeforeValidator(_choice(("Ephemeral", "Standard")))
        ]
        | None
    ) = None
    source_message_id: str | None = None


class _NotesOut(_Out):
    notes: list[_NoteOut] = Field(default_factory=list, max_length=1000)


class _ExampleOut(_Out):
    example_input: str = Field(min_length=1, max_length=20000)
    example_output: str = Field(min_length=1, max_length=50000)
    success_score: Annotated[float, Field(ge=0, le=100)]
    confidence: _Confidence
    source_message_id: str | None = None


class _ExamplesOut(_Out):
    examples: list[_ExampleOut] = Field(default_factory=list, max_length=1000)


class _DedupeOut(_Out):
    should_add: StrictBool
    reason: str = Field(default="", max_length=2000)


class _ConsolidatedNoteOut(_Out):
    type: _NoteTypeName | None = None
    content: str = Field(default="", max_length=4000)
    scope_level: _ScopeName | None = None
    confidence: _Confidence = 85.0


class _ConsolidateOut(_Out):
    should_consolidate: StrictBool
    consolidated_note: _ConsolidatedNoteOut | None = None
    source_note_ids: list[str] = Field(default_factory=list, max_length=100)
    reason: str = Field(default="", max_length=2000)


def _triple(value: Any) -> Any:
    if isinstance(value, dict):
        return [value.get("entity"), value.get("attribute"), value.get("value")]
    return value


class _ContradictionOut(_Out):
    entity_triples: list[Annotated[tuple[str, str, str], BeforeValidator(_triple)]] = Field(
        default_factory=list, max_length=50
    )
    is_contradiction: StrictBool
    contradiction_type: (
        Annotated[
            Literal["competing_relation", "negation", "temporal_supersession"],
            BeforeValidator(_choice(CONTRADICTION_TYPES)),
        ]
        | None
    ) = None
    keep_note_id: str | None = None
    revoke_note_id: str | None = None
    reason: str = Field(default="", max_length=2000)
    confidence: _Confidence = 0.0

    @field_validator("contradiction_type", mode="before")
    @classmethod
    def _null_type(cls, v: Any) -> Any:
        return None if isinstance(v, str) and v.strip().lower() in ("", "null", "none") else v


def _string(*, nullable: bool = False) -> dict[str, Any]:
    """A string (lengths are left to ``max_tokens`` and the reply models: a ``maxLength``
    becomes a deeply nested grammar rule that slows llama.cpp's sampling)."""
    if nullable:
        return {"anyOf": [{"type": "string"}, {"type": "null"}]}
    return {"type": "string"}


def _enum(values: Sequence[str | None]) -> dict[str, Any]:
    """One of ``values`` (``None`` allows null)."""
    return {"enum": list(values)}


def _object(**properties: Any) -> dict[str, Any]:
    """A closed object whose properties are all required, in this order."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _array(items: dict[str, Any], max_items: int) -> dict[str, Any]:
    return {"type": "array", "items": items, "maxItems": max_items}


_SCORE = {"type": "integer"}
_BOOL = {"type": "boolean"}
_ID = _string()
#: The JSON schema of each task's reply, for constrained decoding: keys, enums, bounded
#: arrays. Here ids are free strings; each call narrows them to the ids it shows the model
#: (:func:`_narrow_ids`). Every reply is still checked after parsing (ids among the given
#: ones, confidence range, ...), for servers that ignore the schema and for every model.
TASK_SCHEMAS: dict[str, dict[str, Any]] = {
    "extract notes": _object(
        notes=_array(
            _object(
                content=_string(),
                type=_enum(("Preference", "Constraint", "Context", "Issue")),
                scopeLevel=_enum(SCOPE_LEVELS),
                confidence=_SCORE,
                mergeWithExistingIds=_array(_ID, 5),
                protectionTierHint=_enum(("Ephemeral", "Standard", None)),
                sourceMessageId=_string(nullable=True),
            ),
            5,
        )
    ),
    "extract examples": _object(
        examples=_array(
            _object(
                exampleInput=_string(),
                exampleOutput=_string(),
                successScore=_SCORE,
                confidence=_SCORE,
                sourceMessageId=_string(nullable=True),
            ),
            3,
        )
    ),
    "deduplicate": _object(shouldAdd=_BOOL, reason=_string()),
    "consolidate": _object(
        shouldConsolidate=_BOOL,
        consolidatedNote=_object(
            type=_enum(NOTE_TYPES),
            content=_string(),
            scopeLevel=_enum(SCOPE_LEVELS),
            confidence=_SCORE,
        ),
        sourceNoteIds=_array(_ID, 20),
        reason=_string(),
    ),
    "contradiction": _object(
        entityTriples=_array(
            {"type": "array", "items": _string(), "minItems": 3, "maxItems": 3}, 4
        ),
        isContradiction=_BOOL,
        contradictionType=_enum((*CONTRADICTION_TYPES, None)),
        keepNoteId=_string(nullable=True),
        revokeNoteId=_string(nullable=True),
        reason=_string(),
        confidence=_SCORE,
    ),
}


def _narrow_ids(schema: Any, ids: Mapping[str, Sequence[str]]) -> Any:
    """``schema`` with the properties named in ``ids`` limited to those ids: a (nullable)
    string becomes an enum of them (plus null), an array of ids takes only them (or none)."""
    if isinstance(schema, list):
        return [_narrow_ids(v, ids) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _narrow_ids(v, ids) for k, v in schema.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        for key, allowed in ids.items():
            prop = props.get(key)
            if prop is None:
                continue
            allowed = list(dict.fromkeys(allowed))
            if prop.get("type") == "array":
                props[key] = (
                    {"type": "array", "items": {"enum": allowed}, "maxItems": prop["maxItems"]}
                    if allowed
                    else {"type": "array", "items": _ID, "maxItems": 0}
                )
            else:
                props[key] = {"enum": [*allowed, None] if "anyOf" in prop else allowed}
    return out
