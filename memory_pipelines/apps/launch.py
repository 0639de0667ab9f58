"""Checks a server makes at launch, before it answers anything, with no heavy import.

``serve`` and ``mcp`` open the memory home in the background so that they answer their
first request at once; the one check of opening that needs no import runs here first,
so a home that cannot be a folder is refused in one line before anything is bound.
"""

from __future__ import annotations

import os
from pathlib import Path

from memory_pipelines.errors import HomeError


def home_in_place(home: str | None) -> None:
    """``HomeError`` when the home (``None``: ``$MEMORY_HOME`` or ``./.memory``) is a file:
    the rest of opening (creating it, its databases, the model) runs in the background."""
    path = Path(home) if home is not None else Path(os.environ.get("MEMORY_HOME") or ".memory")
    if path.exists() and not path.is_dir():
        raise HomeError(f"memory home {path} is not a folder (a file is in its place)")
