"""Administration routes (CONTRACT §2.9): notes and agents over HTTP.

``GET /v1/notes`` (filters, ``q``, ``limit``, ``cursor``) → a page of notes and the next
cursor; ``GET``/``PATCH``/``DELETE /v1/notes/{id}`` read, correct and archive one note
(``DELETE ?erase=true`` erases it, admin keys only); ``POST /v1/notes/bulk`` adds many
notes and ``POST /v1/notes/bulk/status`` gives many one status; ``GET /v1/agents`` and
``PUT /v1/agents/{agent_id}``. Keys as §2.8: a key bound to a company, agent or user sees
only the notes inside its binding (its fields are forced filters, another value is 403;
a note outside it is 404, so its existence is not revealed). Roles: reading and changing
notes and listing agents need an analyst or admin key (an agent key is 403); configuring
an agent needs an admin key (or a home without keys), since agents serve every company.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, create_model

from memory_pipelines.admin.bulk import MAX_HTTP_ITEMS
from memory_pipelines.admin.notes import DEFAULT_LIMIT, MAX_LIMIT, NotePage
from memory_pipelines.apps.http.access import ApiKey, Service
from memory_pipelines.apps.http.common import call_service
from memory_pipelines.apps.http.models import BUSY_RESPONSE, ERROR_RESPONSES
from memory_pipelines.keys import ADMIN, ANALYST, require_role
from memory_pipelines.notes import AgentConfig, Note, NoteStatus, NoteType, ProtectionTier


class NotePatch(BaseModel):
    """Body of ``PATCH /v1/notes/{id}``: the fields to change (at least one)."""

    model_config = ConfigDict(extra="forbid")

    note: str | None = Field(default=None, description="the new text (re-embedded)")
    type: NoteType | None = None
    status: NoteStatus | None = None
    protection_tier: ProtectionTier | None = None


class BulkNotes(BaseModel):
    """Body of ``POST /v1/notes/bulk``: the notes to add, each an object of ``add_note``'s
    arguments (``note`` required), at most ``MAX_HTTP_ITEMS``."""

    model_config = ConfigDict(extra="forbid")

    notes: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_HTTP_ITEMS)


class BulkStatus(BaseModel):
    """Body of ``POST /v1/notes/bulk/status``: the notes and the status to give them."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(min_length=1, max_length=MAX_HTTP_ITEMS)
    status: NoteStatus
    comment: str | None = Field(default=None, description="appended to each note's comments")


class NoteList(BaseModel):
    """Answer of the bulk routes: the notes as saved, in the order given."""

    notes: list[Note]


class EraseResult(BaseModel):
    """Answer of ``DELETE /v1/notes/{id}?erase=true``: what was removed."""

    note_id: str
    notes: int
    note_events: int
    injection_events: int
    embedding_cache: int
    lance_versions_removed: int


class AgentList(BaseModel):
    """Answer of ``GET /v1/agents``."""

    agents: list[AgentConfig]


#: Body of ``PUT /v1/agents/{agent_id}``: any field of ``configure_agent``.
AgentSettings: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "AgentSettings",
    __config__=ConfigDict(extra="forbid"),
    __doc__="Body of ``PUT /v1/agents/{agent_id}``: the fields to set (others are kept).",
    **{
        name: (field.annotation | None, None)
        for name, field in AgentConfig.model_fields.items()
        if name != "agent_id"
    },
)


def _value(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


router = APIRouter(tags=["admin"])
NOT_FOUND = {**ERROR_RESPONSES, 404: {**ERROR_RESPONSES[404], "description": "Unknown note"}}


@router.get("/v1/notes", response_model=NotePage, responses=ERROR_RESPONSES)
def list_notes(
    svc: Service,
    key: ApiKey,
    agent_id: str | None = None,
    user_id: str | None = None,
    company_id: str | None = None,
    status: NoteStatus | None = None,
    q: str | None = Query(default=None, description="every word must appear (any case)"),
    limit: int = Query(default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT),
    cursor: str | None = Query(default=None, description="next_cursor of the previous page"),
) -> NotePage:
    """Notes newest first, filtered and searched, one page at a time."""
    return call_service(
        lambda: svc.list_notes(
            agent_id=agent_id,
            user_id=user_id,
            company_id=company_id,
            status=_value(status),
            q=q,
            limit=limit,
            cursor=cursor,
            key=key,
        )
    )


@router.post("/v1/notes/bulk", response_model=NoteList, responses=ERROR_RESPONSES)
def add_notes(body: BulkNotes, svc: Service, key: ApiKey) -> NoteList:
    """Add many notes at once (embedded in batches, few table versions); the whole list
    is checked first, and each note must lie inside the key's binding."""
    return call_service(lambda: NoteList(notes=svc.add_notes(body.notes, key=key)))


@router.post("/v1/notes/bulk/status", response_model=NoteList, responses=NOT_FOUND)
def set_notes_status(body: BulkStatus, svc: Service, key: ApiKey) -> NoteList:
    """Give many notes one status (e.g. archive them): every id is checked first."""
    return call_service(
        lambda: NoteList(
            notes=svc.set_notes_status(body.ids, _value(body.status), body.comment, key=key)
        )
    )


@router.get("/v1/notes/{note_id}", response_model=Note, responses=NOT_FOUND)
def get_note(note_id: str, svc: Service, key: ApiKey) -> Note:
    """One note."""
    return call_service(lambda: svc.note(note_id, key=key))


@router.patch("/v1/notes/{note_id}", response_model=Note, responses=NOT_FOUND)
def patch_note(note_id: str, body: NotePatch, svc: Service, key: ApiKey) -> Note:
    """Correct a note's text, type, status or protection tier (one event, one audit step)."""
    return call_service(
        lambda: svc.update_note(
            note_id,
            note=body.note,
            type=_value(body.type),
            status=_value(body.status),
            protection_tier=_value(body.protection_tier),
            key=key,
        )
    )


@router.delete(
    "/v1/notes/{note_id}",
    response_model=Note | EraseResult,
    responses={**NOT_FOUND, 503: BUSY_RESPONSE},
)
def delete_note(
    note_id: str,
    request: Request,
    svc: Service,
    key: ApiKey,
    erase: bool = Query(default=False, description="erase for good (admin keys only)"),
) -> Any:
    """Archive a note; with ``erase=true`` erase it and its history (admin keys only).
    An erase waits a few seconds (``MEMORY_HTTP_LEASE_WAIT``) while a Memory Manager
    run holds the home, then answers 503 with ``Retry-After``, having changed nothing."""
    if erase:
        wait = request.app.state.lease_wait_s
        return call_service(
            lambda: EraseResult(**svc.erase_note(note_id, key=key, lease_wait_s=wait))
        )
    return call_service(lambda: svc.archive_note(note_id, key=key))


@router.get("/v1/agents", response_model=AgentList, responses=ERROR_RESPONSES)
def list_agents(svc: Service, key: ApiKey) -> AgentList:
    """The configured agents (a key bound to an agent sees that agent only)."""

    def run() -> AgentList:
        require_role(key, ANALYST, "listing agents")
        agents = svc.list_agents()
        bound = (key or {}).get("agent_id") if key and not key.get("admin") else None
        if bound is not None:
            agents = [a for a in agents if a.agent_id == bound]
        return AgentList(agents=agents)

    return call_service(run)


@router.put(
    "/v1/agents/{agent_id}",
    response_model=AgentConfig,
    responses=ERROR_RESPONSES,
)
def put_agent(agent_id: str, body: AgentSettings, svc: Service, key: ApiKey) -> AgentConfig:  # type: ignore[valid-type]
    """Create or update an agent's memory configuration (admin keys only)."""

    def run() -> AgentConfig:
        require_role(key, ADMIN, "configuring an agent (agents serve every company)")
        fields = {k: _value(getattr(body, k)) for k in body.model_fields_set}
        return svc.configure_agent(agent_id, **fields)

    return call_service(run)
