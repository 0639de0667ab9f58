"""memory_pipelines: durable memory for AI agents on Dagster, LanceDB and litellm."""

import os as _os

_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from memory_pipelines.config import (
    InjectConfig,  # noqa: E402
    WriteConfig,  # noqa: E402
)
from memory_pipelines.errors import (  # noqa: E402
    ConfigError,
    EmbeddingError,
    EmbeddingModelMissingError,
    HomeError,
    JudgeError,
    MemoryPipelineError,
    NotFoundError,
    SourceError,
    StoreError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.events import EventKind, NoteEvent  # noqa: E402
from memory_pipelines.injection import Injection  # noqa: E402
from memory_pipelines.notes import (  # noqa: E402
    INJECTABLE_STATUSES,
    AgentConfig,
    AuthorType,
    Example,
    Note,
    NoteStatus,
    NoteType,
    ProtectionTier,
    RunContext,
)
from memory_pipelines.service import MemoryService  # noqa: E402
from memory_pipelines.writes import MemoryWrite, WriteResult  # noqa: E402

__all__ = [
    "INJECTABLE_STATUSES",
    "AgentConfig",
    "AuthorType",
    "ConfigError",
    "EmbeddingError",
    "EmbeddingModelMissingError",
    "EventKind",
    "Example",
    "HomeError",
    "InjectConfig",
    "Injection",
    "JudgeError",
    "MemoryPipelineError",
    "MemoryService",
    "MemoryWrite",
    "Note",
    "NoteEvent",
    "NoteStatus",
    "NoteType",
    "NotFoundError",
    "ProtectionTier",
    "RunContext",
    "SourceError",
    "StoreError",
    "UnknownAgentError",
    "ValidationError",
    "WriteConfig",
    "WriteResult",
]
