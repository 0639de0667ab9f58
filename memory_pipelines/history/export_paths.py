"""Where an export may be written: a ``.jsonl`` or ``.parquet`` file in an existing
folder outside the memory home and a local note store (purge scans those for erased
text)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import ValidationError
from memory_pipelines.limits import unencodable_field, utf8_message

SUFFIXES = (".jsonl", ".parquet")


def export_suffix(path: Path) -> str:
    """The file's suffix, lower case: ``.jsonl`` or ``.parquet`` (``ValidationError`` otherwise)."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValidationError(
            f"export file {path.name!r} must end in .jsonl or .parquet (got {path.suffix or 'no suffix'!r})"
        )
    return suffix


def as_file_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path`` (``ValidationError`` for an empty, non-UTF-8 or NUL-holding one)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValidationError("the export path must be a non-empty file path")
    found = unencodable_field(str(path), "path")
    if found:
        raise ValidationError(utf8_message(found))
    if "\x00" in str(path):
        raise ValidationError("the export path must not contain a NUL character")
    return Path(path)


def _guarded_folders(mem: MemoryContext) -> list[Path]:
    """The local folders an export must stay out of: the home and a local note store."""
    folders = [] if mem.home is None else [Path(mem.home)]
    uri = str(mem.store.uri)
    if "://" not in uri:
        folders.append(Path(uri))
    return [f.resolve() for f in folders]


def check_export_path(mem: MemoryContext, path: str | os.PathLike[str]) -> Path:
    """The destination of an export: a ``.jsonl``/``.parquet`` file in an existing folder
    outside the memory home (``ValidationError`` otherwise)."""
    target = as_file_path(path)
    export_suffix(target)
    try:
        resolved = target.resolve()
    except (OSError, RuntimeError) as e:  # a name too long, a symlink loop
        raise ValidationError(f"cannot export to {target}: {e}") from None
    for folder in _guarded_folders(mem):
        if resolved == folder or resolved.is_relative_to(folder):
            raise ValidationError(
                f"refusing to export to {target}: exports must not land inside the memory home"
                f" ({folder}), which purge scans for erased text; choose a path outside it"
            )
    if not probe_path(resolved.parent, Path.is_dir):
        raise ValidationError(f"cannot export to {target}: folder {target.parent} does not exist")
    if probe_path(resolved, Path.is_dir):
        raise ValidationError(f"cannot export to {target}: it is a folder")
    return resolved


def probe_path(path: Path, test: Any) -> bool:
    """``test(path)`` (``Path.is_dir``, ``Path.is_file``); a ``ValidationError`` naming the
    path for what they do not swallow (a name too long)."""
    try:
        return bool(test(path))
    except OSError as e:
        raise ValidationError(f"cannot use {path}: {e.strerror or e}") from None
