"""Giving the C heap's free pages back to the system.

LanceDB and pylance allocate through the C library's ``malloc`` from many threads; glibc
keeps what they free in its arenas for the next allocation rather than returning it, so
a process that closed a home showed the same resident size as while the home was open
(measured: 718 MB after ``close()``, 397 MB once the heap was trimmed). ``malloc_trim(0)``
returns those free pages; it took ~1 ms (at most 8 ms) on these machines. Elsewhere than
glibc (musl, macOS, Windows) nothing is done.

While a home is open, the same arenas fragment: glibc serves a block above its *mmap
threshold* with its own mapping, returned whole when freed, and everything below from
the arenas. The threshold starts at 128 KiB and, by default, rises to the size of each
mapped block freed (up to 32 MiB), so after Lance has freed a few multi-megabyte buffers
its later ones are carved from the arenas of whichever thread asked, and the holes they
leave are seldom reused whole. Between its 1,000th and 5,000th single guarded write, a
writer's anonymous memory grew by 114 MB that way, by 52 MB with the threshold held (at
the same write times; the rest is its bounded caches filling). :func:`hold_mmap_threshold`
holds it, unless the host chose its own (``MALLOC_MMAP_THRESHOLD_`` in the environment).
"""

from __future__ import annotations

import ctypes
import os
import platform
from functools import cache
from typing import Any


@cache
def _glibc() -> Any | None:
    """glibc's handle, or None when this process does not run on glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def trim_native_heap() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim(0)``); whether
    it could (False off glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


#: ``mallopt``'s parameter number for the mmap threshold (glibc's ``M_MMAP_THRESHOLD``)
M_MMAP_THRESHOLD = -3
#: glibc refuses thresholds above this (``HEAP_MAX_SIZE / 2`` on 64-bit)
MAX_MMAP_THRESHOLD = 32 * 2**20


def hold_mmap_threshold(threshold_bytes: int) -> bool:
    """Hold glibc's mmap threshold at ``threshold_bytes`` (``mallopt(M_MMAP_THRESHOLD)``,
    which also stops glibc from raising it): blocks at least that large get their own
    mapping and go back to the system when freed (see the module notes). Whether it was
    set: False off glibc, for a threshold of 0 (leave glibc's own), and when the host set
    ``MALLOC_MMAP_THRESHOLD_``, whose value stands. It applies to the whole process."""
    if threshold_bytes <= 0 or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, min(int(threshold_bytes), MAX_MMAP_THRESHOLD)))
