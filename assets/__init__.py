"""The Memory Manager's Dagster assets, one module per phase (plus ``checks``).

``memory_pipelines.definitions`` loads every asset and asset check of this package; the
phase logic itself lives in ``memory_pipelines.phases`` (one module per phase).
"""
