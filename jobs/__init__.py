"""Running the jobs of ``memory_pipelines.definitions.defs`` on a Dagster instance (the job
runners of ``memory-pipelines demo`` and ``bench partitions``), kept beside the other Dagster
packages so the domain package imports Dagster only in ``definitions.py``."""
