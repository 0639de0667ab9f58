"""``GET /v1/notes/{note_id}/history``: a note's lifecycle events (CONTRACT §2.7).

404 for an unknown id and, with a key bound to a tenant, for a note outside its binding:
the answer never reveals whether another tenant's note exists, nor its text."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from memory_pipelines.apps.http.access import ApiKey, Service
from memory_pipelines.apps.http.common import call_service
from memory_pipelines.apps.http.models import ERROR_RESPONSES
from memory_pipelines.history.read import history_for_key
from memory_pipelines.note_events import NoteEvent


class HistoryResponse(BaseModel):
    """Body answered by ``GET /v1/notes/{note_id}/history``: the events, oldest first."""

    note_id: str
    events: list[NoteEvent]


router = APIRouter()


@router.get(
    "/v1/notes/{note_id}/history", response_model=HistoryResponse, responses=ERROR_RESPONSES
)
def note_history(note_id: str, svc: Service, key: ApiKey) -> HistoryResponse:
    """Every lifecycle event of a note, oldest first."""

    def run() -> HistoryResponse:
        events = history_for_key(svc.context, key, note_id)
        return HistoryResponse(note_id=note_id, events=events)

    return call_service(run)
