"""MemoryService: the agent-facing facade over the note store, the SQL sources, the
embedder and the judge (CONTRACT §2).

:mod:`.core` holds the class (construction, notes and examples, the agent-facing calls);
its calls on the SQL sources (:mod:`.sources_calls`) and the operators' calls
(:mod:`.admin_calls`: notes administration, export/import, API keys) are mixins it is
composed of, so every public method is still ``svc.<name>``.
"""

from memory_pipelines.service.core import MemoryService, default_home

__all__ = ["MemoryService", "default_home"]
