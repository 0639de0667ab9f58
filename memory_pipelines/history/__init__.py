"""What happened to notes and what the agent knew then: undo, time travel, export/import.

Built on the lifecycle events of :mod:`memory_pipelines.note_events` (the ``note_events`` table):
``restore`` (an analyst's undo of a Memory Manager decision), ``as_of`` (injection and
explain at a past instant), ``transfer`` (export and import of notes with their history).
"""
