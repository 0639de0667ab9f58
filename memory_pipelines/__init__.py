"""memory_pipelines: durable memory for AI agents on Dagster, LanceDB and litellm.

Importing the package is cheap: every public name below is resolved on first access
(PEP 562), so ``import memory_pipelines`` loads neither LanceDB, litellm, pandas nor
Dagster, and sets no environment variable. ``memory_pipelines.__version__`` is the
installed distribution's version.

The Dagster side (``assets``, ``resources``, ``sensors``, ``jobs``) is installed as
subpackages of this package (``memory_pipelines.assets`` ...). In a source checkout those
folders sit beside this one, at the top of the repository, and are found from there.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# In a checkout, assets/ resources/ sensors/ jobs/ live at the repository's top level; an
# installed wheel has them inside this package (pyproject's package-dir). Adding the
# checkout's root to this package's search path makes ``memory_pipelines.assets`` resolve
# to ``<checkout>/assets`` there, with no generic top-level name installed anywhere.
_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(_HERE)
if not os.path.isdir(os.path.join(_HERE, "assets")) and all(
    os.path.isfile(os.path.join(_CHECKOUT, *parts))
    for parts in (("pyproject.toml",), ("assets", "__init__.py"), ("resources", "__init__.py"))
):
    __path__.append(_CHECKOUT)  # noqa: F821 (a package's __path__)

#: public name -> the module that defines it (imported on first access)
_EXPORTS: dict[str, str] = {
    "InjectConfig": "memory_pipelines.config",
    "WriteConfig": "memory_pipelines.config",
    "ConfigError": "memory_pipelines.errors",
    "EmbeddingError": "memory_pipelines.errors",
    "EmbeddingModelMissingError": "memory_pipelines.errors",
    "HomeError": "memory_pipelines.errors",
    "JudgeError": "memory_pipelines.errors",
    "MemoryPipelineError": "memory_pipelines.errors",
    "NotFoundError": "memory_pipelines.errors",
    "SourceError": "memory_pipelines.errors",
    "StoreError": "memory_pipelines.errors",
    "UnknownAgentError": "memory_pipelines.errors",
    "ValidationError": "memory_pipelines.errors",
    "EventKind": "memory_pipelines.note_events",
    "NoteEvent": "memory_pipelines.note_events",
    "Injection": "memory_pipelines.injection",
    "INJECTABLE_STATUSES": "memory_pipelines.notes",
    "AgentConfig": "memory_pipelines.notes",
    "AuthorType": "memory_pipelines.notes",
    "Example": "memory_pipelines.notes",
    "Note": "memory_pipelines.notes",
    "NoteStatus": "memory_pipelines.notes",
    "NoteType": "memory_pipelines.notes",
    "ProtectionTier": "memory_pipelines.notes",
    "RunContext": "memory_pipelines.notes",
    "MemoryService": "memory_pipelines.service",
    "MemoryWrite": "memory_pipelines.writes",
    "WriteResult": "memory_pipelines.writes",
    "split_memory_writes": "memory_pipelines.writes.protocol",
}

__all__ = [
    "AgentConfig",
    "AuthorType",
    "ConfigError",
    "EmbeddingError",
    "EmbeddingModelMissingError",
    "EventKind",
    "Example",
    "HomeError",
    "INJECTABLE_STATUSES",
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
    "split_memory_writes",
    "StoreError",
    "UnknownAgentError",
    "ValidationError",
    "WriteConfig",
    "WriteResult",
]

DISTRIBUTION = "memory-pipelines"


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'memory_pipelines' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, "__version__"})


if TYPE_CHECKING:  # what type checkers and editors see
    from memory_pipelines.config import InjectConfig, WriteConfig
    from memory_pipelines.errors import (
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
    from memory_pipelines.injection import Injection
    from memory_pipelines.note_events import EventKind, NoteEvent
    from memory_pipelines.notes import (
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
    from memory_pipelines.service import MemoryService
    from memory_pipelines.writes import MemoryWrite, WriteResult
    from memory_pipelines.writes.protocol import split_memory_writes

    __version__: str
