"""Reading a local Lance table's latest version from its ``_versions`` folder, without a
checkout (what the read cache asks on every inject)."""

from __future__ import annotations

import os

_U64_MAX = (1 << 64) - 1


def listed_latest_version(versions_dir: str) -> int | None:
    """The highest version among the ``.manifest`` files of a Lance ``_versions`` folder
    (V2 names hold ``u64::MAX - version``, V1 names the version); None when unreadable. A
    commit is visible once its manifest is in place, so this is the latest commit."""
    best: int | None = None
    try:
        with os.scandir(versions_dir) as entries:
            for e in entries:
                stem = e.name.removesuffix(".manifest")
                if stem == e.name or not stem.isdigit():
                    continue
                n = int(stem)
                v = _U64_MAX - n if n > _U64_MAX // 2 else n
                best = v if best is None or v > best else best
    except OSError:
        return None
    return best
