"""Note, Example, AgentConfig and RunContext models, the lifecycle enums and
``INJECTABLE_STATUSES``, the single source of truth for what agents can see.

Every column of the reference data model (``AIAgentNote``, ``AIAgentExample`` and the
memory configuration of ``AIAgent``) appears here in snake_case. Datetimes are always
timezone-aware UTC; a naive datetime is rejected at the boundary.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator

from memory_pipelines.limits import check_id, check_text


class NoteStatus(StrEnum):
    """Lifecycle of a note. Only ``INJECTABLE_STATUSES`` reach an agent."""

    PENDING = "Pending"
    ACTIVE = "Active"
    PROVISIONAL = "Provisional"
    REVOKED = "Revoked"
    ARCHIVED = "Archived"


class ExampleStatus(StrEnum):
    """Lifecycle of an example (examples are never provisional)."""

    PENDING = "Pending"
    ACTIVE = "Active"
    REVOKED = "Revoked"
    ARCHIVED = "Archived"


class NoteType(StrEnum):
    """What kind of memory a note holds."""

    PREFERENCE = "Preference"
    CONSTRAINT = "Constraint"
    CONTEXT = "Context"
    EXAMPLE = "Example"
    ISSUE = "Issue"


class ProtectionTier(StrEnum):
    """What maintenance may do to a note."""

    IMMUTABLE = "Immutable"
    PROTECTED = "Protected"
    STANDARD = "Standard"
    EPHEMERAL = "Ephemeral"


class AuthorType(StrEnum):
    """Who created a note: the agent in flight, the Memory Manager, or a person."""

    AGENT = "Agent"
    MEMORY_MANAGER = "MemoryManager"
    USER = "User"


class NoteInjectionStrategy(StrEnum):
    RELEVANT = "Relevant"
    RECENT = "Recent"
    ALL = "All"


class ExampleInjectionStrategy(StrEnum):
    SEMANTIC = "Semantic"
    RECENT = "Recent"
    RATED = "Rated"


#: The single source of truth for the statuses an agent can see. Every read filter
#: (injection, vector search of candidates, TTL pruning) derives from this tuple.
INJECTABLE_STATUSES: tuple[NoteStatus, ...] = (NoteStatus.ACTIVE, NoteStatus.PROVISIONAL)

#: Note types an agent may write in flight (descriptive only; never behavioural).
IN_FLIGHT_TYPES: tuple[NoteType, ...] = (NoteType.PREFERENCE, NoteType.CONTEXT)

#: Order of note types used by the ``All`` strategy.
TYPE_ORDER: tuple[NoteType, ...] = (
    NoteType.CONSTRAINT,
    NoteType.PREFERENCE,
    NoteType.CONTEXT,
    NoteType.ISSUE,
    NoteType.EXAMPLE,
)


def is_injectable(status: str) -> bool:
    """True when a note of this status may be injected into an agent's context."""
    return status in {s.value for s in INJECTABLE_STATUSES}


def new_id() -> str:
    """A fresh random id (uuid4, as text)."""
    return str(uuid.uuid4())


def stable_id(*parts: str | None) -> str:
    """A deterministic id from its parts (uuid5), so a retried write upserts, not duplicates."""
    key = "\x1f".join("" if p is None else str(p) for p in parts)
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "memory-pipelines:" + key))


#: the instants the service can store and compute with (the nanosecond range of the
#: data frames the phases read, with a margin): anything a client sends outside it is
#: refused rather than failing later inside a phase or a query
EARLIEST_INSTANT = datetime(1678, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(2262, 1, 1, tzinfo=UTC)


def utc(value: datetime | str | None) -> datetime | None:
    """Coerce to an aware UTC datetime; naive datetimes, and instants outside
    :data:`EARLIEST_INSTANT`..:data:`LATEST_INSTANT`, are rejected (``ValueError``)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if not isinstance(value, datetime):
        raise TypeError(f"expected a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("datetimes must be timezone-aware (UTC)")
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+14:00 is before year 1 in UTC
        value = None
    if value is None or not EARLIEST_INSTANT <= value < LATEST_INSTANT:
        raise ValueError(
            f"instant out of range: the service stores instants from {EARLIEST_INSTANT.year}"
            f" to {LATEST_INSTANT.year - 1}"
        )
    return value


def _parse_scopes(value: Any) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError("secondary_scopes must be a JSON object of dimension -> value")
    return value or None


class _Row(BaseModel):
    model_config = ConfigDict(use_enum_values=True, validate_assignment=True, extra="forbid")

    @field_validator(
        "last_accessed_at", "expires_at", "created_at", "updated_at", mode="before", check_fields=False
    )
    @classmethod
    def _aware(cls, v: Any) -> datetime | None:
        return utc(v)

    @field_validator("secondary_scopes", mode="before", check_fields=False)
    @classmethod
    def _scopes(cls, v: Any) -> dict[str, Any] | None:
        return _parse_scopes(v)


class Note(_Row):
    """One memory: the reference ``AIAgentNote`` row in snake_case."""

    id: str = Field(default_factory=new_id)
    agent_id: str | None = None
    user_id: str | None = None
    company_id: str | None = None
    note: str
    type: NoteType = NoteType.PREFERENCE
    status: NoteStatus = NoteStatus.ACTIVE
    author_type: AuthorType = AuthorType.MEMORY_MANAGER
    protection_tier: ProtectionTier = ProtectionTier.STANDARD
    importance_score: float | None = None
    access_count: int = 0
    last_accessed_at: datetime | None = None
    expires_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    consolidated_into_note_id: str | None = None
    derived_from_note_ids: list[str] | None = None
    consolidation_count: int = 0
    source_run_id: str | None = None
    source_conversation_id: str | None = None
    source_conversation_detail_id: str | None = None
    primary_scope_entity_id: str | None = None
    primary_scope_record_id: str | None = None
    secondary_scopes: dict[str, Any] | None = None
    comments: str | None = None
    is_auto_generated: bool = False
    note_type_name: str = "AI"
    embedding_model_id: str | None = None
    project_id: str | None = None

    @property
    def scope_key(self) -> str:
        """``agent|user|company`` with empty strings for nulls."""
        return "|".join(v or "" for v in (self.agent_id, self.user_id, self.company_id))

    @property
    def injectable(self) -> bool:
        return is_injectable(self.status)


class Example(_Row):
    """A curated input/output demonstration: the reference ``AIAgentExample`` row."""

    id: str = Field(default_factory=new_id)
    agent_id: str
    user_id: str | None = None
    company_id: str | None = None
    type: str = "Example"
    example_input: str
    example_output: str
    is_auto_generated: bool = False
    source_conversation_id: str | None = None
    source_conversation_detail_id: str | None = None
    source_run_id: str | None = None
    success_score: float | None = None
    comments: str | None = None
    status: ExampleStatus = ExampleStatus.ACTIVE
    primary_scope_entity_id: str | None = None
    primary_scope_record_id: str | None = None
    secondary_scopes: dict[str, Any] | None = None
    last_accessed_at: datetime | None = None
    access_count: int = 0
    expires_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    embedding_model_id: str | None = None


class AgentConfig(BaseModel):
    """The memory configuration of an agent."""

    model_config = ConfigDict(use_enum_values=True, extra="forbid", validate_assignment=True)

    agent_id: str
    name: str | None = None
    status: str = "Active"
    inject_notes: bool = True
    max_notes_to_inject: int = Field(default=5, ge=0)
    note_injection_strategy: NoteInjectionStrategy = NoteInjectionStrategy.RELEVANT
    inject_examples: bool = False
    max_examples_to_inject: int = Field(default=3, ge=0)
    example_injection_strategy: ExampleInjectionStrategy = ExampleInjectionStrategy.SEMANTIC
    allow_memory_write: bool = True
    auto_archive_enabled: bool = True
    scope_config: dict[str, Any] | None = None
    reranker_config: dict[str, Any] | None = None
    note_retention_days: int | None = 90
    example_retention_days: int | None = 180

    @property
    def active(self) -> bool:
        return self.status == "Active"


class RunContext(BaseModel):
    """Who is running: the agent, the run and the scope a write or injection applies to."""

    model_config = ConfigDict(extra="forbid")

    agent_id: str = Field(min_length=1)
    run_id: str | None = None
    user_id: str | None = None
    company_id: str | None = None
    conversation_id: str | None = None
    conversation_detail_id: str | None = None
    primary_scope_entity_id: str | None = None
    primary_scope_record_id: str | None = None
    secondary_scopes: dict[str, Any] | None = None
    #: Not a field (no request can set it): False once an API key bound to the context's
    #: company but not to its user vouched for it (``keys.check_context``). Such a caller
    #: reads no note of a user that has no company: that note belongs to no company.
    _companyless_user_notes: bool = PrivateAttr(default=True)

    @property
    def reads_companyless_user_notes(self) -> bool:
        """Whether the context sees notes of its user stored without a company (the scope
        lattice's rule); False for a context a company-bound key vouched for."""
        return self._companyless_user_notes or self.company_id is None

    def company_bound(self) -> RunContext:
        """This context for a caller bound to its company only: notes of its user stored
        without a company are out of its scope (returns ``self``, marked)."""
        self._companyless_user_notes = False
        return self

    @field_validator(
        "run_id",
        "user_id",
        "company_id",
        "conversation_id",
        "conversation_detail_id",
        "primary_scope_entity_id",
        "primary_scope_record_id",
        mode="before",
    )
    @classmethod
    def _blank_is_none(cls, v: Any) -> Any:
        if isinstance(v, str) and not v.strip():
            return None
        return v

    @field_validator("secondary_scopes", mode="before")
    @classmethod
    def _scopes(cls, v: Any) -> dict[str, Any] | None:
        return _parse_scopes(v)

    @field_validator("*", mode="after")
    @classmethod
    def _utf8(cls, v: Any, info: ValidationInfo) -> Any:
        """Every text must be encodable as UTF-8 (CONTRACT §2.8): no lone surrogates;
        ids are at most ``Limits.max_id_chars`` long, without control characters."""
        name = info.field_name or "context"
        if name == "secondary_scopes":
            check_text(name, v)
        else:
            check_id(name, v)
        return v


NOTE_FIELDS: tuple[str, ...] = tuple(Note.model_fields)
EXAMPLE_FIELDS: tuple[str, ...] = tuple(Example.model_fields)


def append_comment(existing: str | None, text: str) -> str:
    """Append an audit marker to a note's comments; earlier comments are never replaced."""
    text = text.strip()
    if not existing:
        return text
    return f"{existing.rstrip()} {text}"
