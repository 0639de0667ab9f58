"""MemoryService: the agent-facing facade over the note store, the SQL sources, the
embedder and the judge (CONTRACT §2).

:mod:`.core` holds the class (construction, the agent-facing calls, reading notes and
examples); the operators' calls live once each in its parts, public sub-objects whose
methods are also names of the service (:mod:`.parts`): ``svc.directory`` (agents, users,
companies, conversations, runs), ``svc.notes_admin`` (manual notes, administration,
history, export/import, purge) and ``svc.api_keys``.
"""

from memory_pipelines.service.api_keys import ApiKeys
from memory_pipelines.service.core import MemoryService, default_home
from memory_pipelines.service.directory import Directory
from memory_pipelines.service.notes_admin import NotesAdmin

__all__ = ["ApiKeys", "Directory", "MemoryService", "NotesAdmin", "default_home"]
