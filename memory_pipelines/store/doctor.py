"""Checking a home's LanceDB tables, and bringing back the newest readable version.

A table version is a manifest naming data files (and deletion files). When a file one
names is gone, every read of that version fails ("Not found: .../data/....lance"), and
so does every read of the home, since reads go to the latest version. The versions
before it may still be whole. :func:`check_table` says, per table, whether the latest
version reads, which of its files are missing and which version is the newest that
reads; :func:`restore_table` commits that version again as the newest (Lance's
``restore``, indexes included), after saying what it cannot keep: the rows of the
latest version that the restored one does not hold (those in files still present, by
id; those in missing files, by count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_pipelines.errors import StoreError

#: versions a check reads back from the latest before it gives up looking for one that reads
MAX_VERSIONS_CHECKED = 200


@dataclass(frozen=True)
class TableCheck:
    """What :func:`check_table` found for one table."""

    name: str
    uri: str
    latest_version: int
    #: the latest version reads in full
    readable: bool
    #: the newest version that reads (the latest when ``readable``; None: none found)
    readable_version: int | None
    #: files the latest version names that are missing (relative to the table folder)
    missing_files: list[str] = field(default_factory=list)
    #: why the latest version does not read (the first line of the error)
    error: str | None = None
    #: rows of the latest version (from its manifest) and of the readable version
    rows_latest: int = 0
    rows_readable: int = 0
    #: ids in the latest version's intact files that the readable version does not hold
    lost_ids: list[str] = field(default_factory=list)
    #: rows in the latest version's missing files (their ids cannot be read)
    lost_unreadable_rows: int = 0
    #: versions between the readable one and the latest (skipped by a restore)
    skipped_versions: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _dataset(uri: str, version: int | None = None, storage_options: dict[str, str] | None = None):
    import lance

    return lance.dataset(uri, version=version, storage_options=storage_options)


def _local(uri: str) -> Path | None:
    path = Path(uri.removeprefix("file://")) if "://" not in uri.removeprefix("file://") else None
    return path if path is not None and path.is_dir() else None


def _missing(ds: Any, folder: Path | None) -> list[str]:
    """Files of ``ds``'s version that are not on disk (local tables only)."""
    if folder is None:
        return []
    missing = []
    for fragment in ds.get_fragments():
        meta = fragment.metadata
        for data_file in meta.data_files():
            if not (folder / "data" / data_file.path).is_file():
                missing.append(f"data/{data_file.path}")
        deletion = meta.deletion_file
        if deletion is not None:
            path = deletion.path(fragment.fragment_id)
            if not (folder / path).is_file():
                missing.append(str(path))
    return missing


def _reads(ds: Any) -> str | None:
    """None when every row of ``ds``'s version reads (its ids), else the error's first line."""
    try:
        ds.to_table(columns=["id"])
    except Exception as e:  # Lance raises plain exceptions (OSError, ValueError...)
        text = str(e).strip()
        return text.splitlines()[0][:500] if text else type(e).__name__
    return None


def _rows(ds: Any) -> int:
    return sum(f.metadata.num_rows - f.metadata.num_deletions for f in ds.get_fragments())


def _ids(ds: Any) -> set[str]:
    return set(ds.to_table(columns=["id"]).column("id").to_pylist())


def _intact_ids(ds: Any, folder: Path | None) -> tuple[set[str], int]:
    """Ids in the fragments of ``ds`` that read, and rows in those that do not."""
    ids: set[str] = set()
    unreadable = 0
    for fragment in ds.get_fragments():
        try:
            if folder is not None and _missing_fragment(fragment, folder):
                raise FileNotFoundError
            ids.update(fragment.to_table(columns=["id"]).column("id").to_pylist())
        except Exception:  # a fragment with a missing file
            meta = fragment.metadata
            unreadable += meta.num_rows - meta.num_deletions
    return ids, unreadable


def _missing_fragment(fragment: Any, folder: Path) -> bool:
    meta = fragment.metadata
    if any(not (folder / "data" / d.path).is_file() for d in meta.data_files()):
        return True
    deletion = meta.deletion_file
    return deletion is not None and not (folder / deletion.path(fragment.fragment_id)).is_file()


def check_table(
    uri: str, name: str, storage_options: dict[str, str] | None = None
) -> TableCheck:
    """Check the table at ``uri``: does its latest version read, which files it misses,
    the newest version that reads and what a restore of it would not keep."""
    try:
        latest = _dataset(uri, storage_options=storage_options)
    except Exception as e:
        raise StoreError(f"cannot open the table {name} at {uri}: {e}") from e
    folder = _local(uri)
    missing = _missing(latest, folder)
    error = None if missing else _reads(latest)
    if missing and error is None:
        error = f"{len(missing)} file(s) of version {latest.version} are missing"
    if not missing and error is None:
        rows = _rows(latest)
        return TableCheck(name, uri, latest.version, True, latest.version, rows_latest=rows, rows_readable=rows)
    versions = sorted((int(v["version"]) for v in latest.versions()), reverse=True)
    readable_version = None
    readable_ds = None
    for version in versions[1 : MAX_VERSIONS_CHECKED + 1]:
        try:
            candidate = _dataset(uri, version, storage_options)
        except Exception:  # its manifest is gone too
            continue
        if not _missing(candidate, folder) and _reads(candidate) is None:
            readable_version, readable_ds = version, candidate
            break
    lost: list[str] = []
    unreadable = 0
    rows_readable = 0
    if readable_ds is not None:
        intact, unreadable = _intact_ids(latest, folder)
        lost = sorted(intact - _ids(readable_ds))
        rows_readable = _rows(readable_ds)
    return TableCheck(
        name,
        uri,
        latest.version,
        False,
        readable_version,
        missing_files=missing,
        error=error,
        rows_latest=_rows(latest),
        rows_readable=rows_readable,
        lost_ids=lost,
        lost_unreadable_rows=unreadable,
        skipped_versions=[v for v in versions if readable_version is not None and v > readable_version],
    )


def restore_table(
    uri: str, version: int, storage_options: dict[str, str] | None = None
) -> int:
    """Commit ``version`` of the table at ``uri`` again as its newest version (data and
    indexes as they were then); returns the new version number. Nothing is deleted: the
    broken versions stay listed until a cleanup drops them."""
    try:
        ds = _dataset(uri, version, storage_options)
        ds.restore()
        return int(_dataset(uri, storage_options=storage_options).version)
    except Exception as e:
        raise StoreError(f"could not restore version {version} of {uri}: {e}") from e


__all__ = ["MAX_VERSIONS_CHECKED", "TableCheck", "check_table", "restore_table"]
