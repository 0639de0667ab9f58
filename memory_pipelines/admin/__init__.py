"""Administration (CONTRACT §2.9): what the operator's HTTP routes, CLI commands and the
memory browser call.

- :mod:`~memory_pipelines.admin.notes`: list notes (filters, text search, keyset cursor
  paging newest first), read, correct, archive and erase one note; every change is a
  lifecycle event and an audit step.
- what an API key may see (its binding as forced filters of a listing, and whether one
  note lies inside it) is a scope rule: :mod:`memory_pipelines.scope.binding`.
- :mod:`~memory_pipelines.admin.registry`: registration follows use: the users and
  companies a context names are registered on first sight.
"""

from memory_pipelines.admin.notes import (
    MAX_LIMIT,
    NotePage,
    archive_note,
    decode_cursor,
    encode_cursor,
    erase_note,
    get_note,
    list_notes,
    update_note,
)
from memory_pipelines.admin.registry import Registry

__all__ = [
    "MAX_LIMIT",
    "NotePage",
    "Registry",
    "archive_note",
    "decode_cursor",
    "encode_cursor",
    "erase_note",
    "get_note",
    "list_notes",
    "update_note",
]
