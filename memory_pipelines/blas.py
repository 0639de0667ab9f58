"""OpenBLAS's thread count around this library's matrix products.

Every product of a matrix above ~9,000 elements with a vector (a scope's vectors against
a query: the near-duplicate guard of every write, the cosine side of every injection) runs
on all of OpenBLAS's threads, and after each call its worker threads spin for a while
waiting for more work. Measured on 2 cores: 200 products of 5,000 x 384 with a query,
10 ms apart, kept a whole core busy (2.2 s of CPU in 2.1 s) for 14 ms of work; the same
products on one thread take 0.07 ms each and leave the core to the writer's own threads.
:func:`single_blas_thread` runs a block on one OpenBLAS thread; it changes the count
for the process, so it is kept to short products and restored as soon as no block of any
thread is inside (another thread's BLAS call in the meantime also runs on one thread).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_SYMBOLS = (
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
)
_lock = threading.Lock()
_controls: list[tuple[Callable[[], int], Callable[[int], None]]] | None = None
_inside = 0  # blocks of any thread inside single_blas_thread now
_previous: list[int] = []  # the counts found when the first of them entered


def _find_controls() -> list[tuple[Callable[[], int], Callable[[int], None]]]:
    """get/set thread-count functions of the OpenBLAS libraries loaded in this process
    (Linux only; the same technique as ``threadpoolctl``). Empty when none is found."""
    found: list[tuple[Callable[[], int], Callable[[int], None]]] = []
    if not sys.platform.startswith("linux"):
        return found
    import numpy  # noqa: F401  (loads the OpenBLAS it was built with)

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return found
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for getter, setter in _SYMBOLS:
            if hasattr(lib, getter) and hasattr(lib, setter):
                found.append((getattr(lib, getter), getattr(lib, setter)))
                break
    return found


def blas_controls() -> list[tuple[Callable[[], int], Callable[[int], None]]]:
    """The (get, set) thread-count functions found (found once, on the first call)."""
    global _controls
    with _lock:
        if _controls is None:
            _controls = _find_controls()
        return _controls


@contextmanager
def single_blas_thread() -> Iterator[None]:
    """Run OpenBLAS on one thread inside the block (best effort; a no-op elsewhere).

    Safe across threads and nested blocks: the first block to enter sets one thread, and
    the count it found comes back when the last block of any thread leaves (a block that
    restored on its own exit while another thread's was inside left the process on one
    thread for good)."""
    global _inside, _previous
    controls = blas_controls()
    with _lock:
        if _inside == 0:
            _previous = [get() for get, _ in controls]
            for _, set_ in controls:
                set_(1)
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                for (_, set_), count in zip(controls, _previous, strict=True):
                    set_(max(1, int(count)))
