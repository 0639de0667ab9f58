"""Progress bars for the long CLI commands (``demo``, ``bench locomo``, ``bench maintenance``).

``progress(iterable, total=None, desc=..., enabled=None)`` wraps an iterable in a ``tqdm``
bar written to stderr (stdout stays the command's result). ``enabled=None`` (auto) shows
the bar only when stderr is a terminal; ``True``/``False`` force it on or off (the
commands' ``--progress/--no-progress`` flag). Reads and writes nothing but stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress_enabled(enabled: bool | None = None) -> bool:
    """Whether a bar is drawn: ``enabled`` when given, else whether stderr is a TTY."""
    if enabled is not None:
        return bool(enabled)
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def progress(
    iterable: Iterable[T],
    total: int | None = None,
    desc: str = "",
    enabled: bool | None = None,
) -> Iterator[T]:
    """Iterate ``iterable`` with a tqdm bar on stderr (when enabled; see the module doc).

    When disabled the items are yielded unchanged and nothing is written.
    """
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    yield from tqdm(
        iterable,
        total=total,
        desc=desc,
        file=sys.stderr,
        disable=not progress_enabled(enabled),
        dynamic_ncols=True,
        leave=True,
    )


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--progress/--no-progress`` (``dest="progress"``, default None = auto)."""
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars on stderr (default: only when stderr is a terminal)",
    )
