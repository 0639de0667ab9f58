"""Request and response bodies of the HTTP API (the OpenAPI document describes them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from memory_pipelines.notes import Example, Note, RunContext
from memory_pipelines.writes.models import WriteResult


class WritesRequest(BaseModel):
    """Body of ``POST /v1/memory-writes``."""

    model_config = ConfigDict(extra="forbid")

    context: RunContext
    writes: list[Any] = Field(
        description='The agent\'s memoryWrites: objects like {"note": "...", "type": '
        '"Preference", "scopeHint": "user"}; a malformed item is answered rejected-type.'
    )


class WriteResultBody(WriteResult):
    """One write's outcome, in request order."""


class WritesResponse(BaseModel):
    """Body answered by ``POST /v1/memory-writes``."""

    results: list[WriteResultBody]
    feedback: str


class RememberRequest(BaseModel):
    """Body of ``POST /v1/remember``."""

    model_config = ConfigDict(extra="forbid")

    context: RunContext
    messages: list[Any] = Field(
        description='The conversation in the OpenAI chat format: [{"role": "user" | '
        '"assistant" | "system", "content": "..."}]; the same messages sent again in a '
        "run add nothing."
    )


class RememberResponse(BaseModel):
    """Body answered by ``POST /v1/remember``: the notes that hold what was learnt
    (Provisional until the Memory Manager hardens them)."""

    notes: list[Note]


class InjectRequest(BaseModel):
    """Body of ``POST /v1/inject``."""

    model_config = ConfigDict(extra="forbid")

    context: RunContext
    current_input: str | None = None
    as_of: datetime | None = Field(
        default=None, description="time travel: inject as of this instant (with a timezone)"
    )


class InjectResponse(BaseModel):
    """Body answered by ``POST /v1/inject``: the system message and the items in it."""

    message: str
    notes: list[Note]
    examples: list[Example]


class ExplainRequest(BaseModel):
    """Body of ``POST /v1/explain``."""

    model_config = ConfigDict(extra="forbid")

    context: RunContext
    topic: str = Field(min_length=1, description="words to look for in the notes")
    current_input: str | None = Field(
        default=None, description="the run's input to rank with (default: the topic)"
    )
    limit: int = Field(default=10, ge=1, le=100, description="notes to explain")
    as_of: datetime | None = Field(
        default=None, description="time travel: explain as of this instant (with a timezone)"
    )


class HealthResponse(BaseModel):
    """Body answered by ``GET /healthz``."""

    status: str
    notes_version: int | None
    examples_version: int | None
    counts: dict[str, int]
    reason: str | None = None


class ErrorItem(BaseModel):
    """One request validation error."""

    loc: list[str]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    """Body of every error answer: a readable message (and, for 422, the errors)."""

    detail: str
    errors: list[ErrorItem] | None = None


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "Missing, unknown or revoked API key"},
    403: {
        "model": ErrorResponse,
        "description": "Context outside the API key's binding, or a key role that may not do this",
    },
    404: {"model": ErrorResponse, "description": "Unknown agent"},
    413: {"model": ErrorResponse, "description": "Request body over the size limit"},
    422: {"model": ErrorResponse, "description": "Body is not JSON or fails validation"},
    500: {"model": ErrorResponse, "description": "Internal error (details in the server log)"},
}
#: The answer of a route that needs the home's Memory Manager lease (erasing) while a
#: Memory Manager run holds it past the request's wait.
BUSY_RESPONSE: dict[str, Any] = {
    "model": ErrorResponse,
    "description": "A Memory Manager run holds this home; nothing was changed (see Retry-After)",
    "headers": {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}},
}
#: The answers of a route that acts within a run: also 409 for another tenant's run id.
RUN_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    409: {"model": ErrorResponse, "description": "Run id of another company or user of the agent"},
}
