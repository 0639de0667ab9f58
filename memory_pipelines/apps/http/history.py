"""``GET /v1/notes/{note_id}/history``: a note's lifecycle events (CONTRACT §2.7).

404 for an unknown id and, with a key bound to a tenant, for a note outside its binding:
the answer never reveals whether another tenant's note exists, nor its text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel

from memory_pipelines.apps.http.common import call_service
from memory_pipelines.apps.http.models import ERROR_RESPONSES
from memory_pipelines.history.read import history_for_key
from memory_pipelines.note_events import NoteEvent
from memory_pipelines.service import MemoryService


class HistoryResponse(BaseModel):
    """Body answered by ``GET /v1/notes/{note_id}/history``: the events, oldest first."""

    note_id: str
    events: list[NoteEvent]


def add_history_routes(app: FastAPI, svc: MemoryService, allow: Callable[..., Any]) -> None:
    """Register the history route (``allow`` is the app's context check; the note's own
    binding is checked here against the request's key)."""

    @app.get(
        "/v1/notes/{note_id}/history", response_model=HistoryResponse, responses=ERROR_RESPONSES
    )
    def note_history(note_id: str, request: Request) -> HistoryResponse:
        """Every lifecycle event of a note, oldest first."""

        def run() -> HistoryResponse:
            key = getattr(request.state, "api_key", None)
            events = history_for_key(svc.context, key, note_id)
            return HistoryResponse(note_id=note_id, events=events)

        return call_service(run)
