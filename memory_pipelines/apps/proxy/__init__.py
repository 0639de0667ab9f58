"""The memory proxy: memory for any OpenAI-compatible client (``memory-pipelines proxy``).

:mod:`.app` builds the application (``create_app(svc, model)``) and serves it
(``serve``); :mod:`.turns` holds what one turn carries: identity headers, OpenAI-format
errors and the ``memoryWrites`` split out of answers.
"""

from memory_pipelines.apps.proxy.app import create_app, serve
from memory_pipelines.apps.proxy.turns import (
    HEADERS,
    MEMORY_TOOL,
    MEMORY_TOOL_SPEC,
    ProxyError,
    split_memory_writes,
    tool_writes,
)

__all__ = [
    "HEADERS",
    "MEMORY_TOOL",
    "MEMORY_TOOL_SPEC",
    "ProxyError",
    "create_app",
    "serve",
    "split_memory_writes",
    "tool_writes",
]
