"""The partitioned maintenance job as a module-level function, so ``bench partitions``
can hand Dagster a reconstructable pointer (Dask workers re-import it by name)."""

from typing import Any


def maintenance_by_agent() -> Any:
    """``memory_maintenance_by_agent`` from the one ``Definitions``."""
    from memory_pipelines.definitions import defs

    return defs.resolve_job_def("memory_maintenance_by_agent")
