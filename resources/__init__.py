"""Dagster ConfigurableResources: config only; clients live in private state."""

from memory_pipelines.resources.memory_api import MemoryApiResource, memory_api_from_env

__all__ = ["MemoryApiResource", "memory_api_from_env"]
