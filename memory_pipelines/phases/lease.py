"""One Memory Manager at a time per home: the lease every phase runs under.

Two Memory Manager runs on one home at once (a schedule and an operator, two Dagster
runs, two machines sharing a PostgreSQL database) would both read the same candidates
and both apply the same decision: a cluster merged twice, a note hardened twice. So every
phase, the whole cycle and the table compaction run under the home's lease, a row of the
SQL sources (:mod:`memory_pipelines.sources.leases`):

- :func:`exclusive` takes it (or, in a thread that already holds it, just runs: the
  cycle holds it across its phases), renews it from a background thread every third of
  its time to live, and gives it back at the end. A process that dies holding it loses
  it when it expires (``ManagerConfig.lease_ttl_s`` after the last renewal, on the
  service clock), or at once to a run on the same machine, which sees its process gone.
- A second run waits for it, up to ``ManagerConfig.lease_wait_s``, then runs: the
  decisions of the first are already applied, so it finds nothing left to do. Past the
  wait it raises :class:`ManagerBusyError` naming the holder, having changed nothing.
- A partitioned run takes the lease of its partition (partitions are disjoint, so they
  run side by side) and never overlaps a whole-pool run: each takes its own lease, then
  looks for the other kind and, finding one, gives its own back and waits.

:data:`LEASE_HOOKS` lets tests observe the lease (``"waiting"``, ``"acquired"``,
``"released"``) to hold one run inside a phase while another starts, without sleeps.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import MemoryPipelineError

log = logging.getLogger(__name__)

#: the lease of a whole-pool run; a partition's is ``memory-manager:PARTITION``
MANAGER_LEASE = "memory-manager"
#: seconds between two attempts while another run holds the lease
POLL_S = 0.5
#: called as ``hook(event, lease_name, owner)`` for "waiting", "acquired" and "released"
LEASE_HOOKS: list[Callable[[str, str, str], None]] = []

_held = threading.local()

F = TypeVar("F", bound=Callable[..., Any])


class ManagerBusyError(MemoryPipelineError):
    """Another Memory Manager run held the home's lease for longer than this run waits;
    this run changed nothing."""


def lease_name(partition: str | None = None) -> str:
    """The lease of a whole-pool run, or of one partition's."""
    return MANAGER_LEASE if partition is None else f"{MANAGER_LEASE}:{partition}"


def _names() -> dict[tuple[int, str], str]:
    """The leases this thread holds: (its service's sources, name) -> owner."""
    if not hasattr(_held, "names"):
        _held.names = {}
    return _held.names


def _notify(event: str, name: str, owner: str) -> None:
    for hook in list(LEASE_HOOKS):
        hook(event, name, owner)


def _describe(lease: dict[str, Any]) -> str:
    details = lease.get("details") or {}
    who = f"{details.get('host', '?')} pid {details.get('pid', '?')}"
    return (
        f"{lease['name']} held by {who} since {lease['acquired_at'].isoformat()}"
        f" (expires {lease['expires_at'].isoformat()} unless renewed)"
    )


def _overlapping(mem: MemoryContext, name: str, owner: str) -> list[dict[str, Any]]:
    """Live leases of the other kind that overlap ``name``: the partitions' for a
    whole-pool run, the whole pool's for a partition's."""
    if name == MANAGER_LEASE:
        found = mem.sources.live_leases(MANAGER_LEASE + ":")
    else:
        found = [x for x in mem.sources.live_leases(MANAGER_LEASE) if x["name"] == MANAGER_LEASE]
    return [x for x in found if x["owner"] != owner]


def _dead_here(lease: dict[str, Any]) -> bool:
    """Whether the lease's holder ran on this machine and its process is gone (a run
    killed with -9 frees the home at once, not when its lease expires)."""
    details = lease.get("details") or {}
    pid = details.get("pid")
    if details.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return False  # this process: a thread of it holds it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive (another user's process, say)
        return False
    return False


def _try_take(mem: MemoryContext, name: str, owner: str, ttl: timedelta) -> str | None:
    """Take ``name``; None when taken, else what holds the home."""
    details = {"host": socket.gethostname(), "pid": os.getpid()}
    if not mem.sources.take_lease(name, owner, mem.now() + ttl, details):
        holders = [x for x in mem.sources.live_leases(name) if x["name"] == name]
        if not holders:
            return f"{name} is held"
        if not (
            _dead_here(holders[0])
            and mem.sources.take_over_lease(name, holders[0]["owner"], owner, mem.now() + ttl, details)
        ):
            return _describe(holders[0])
        log.warning("took over the Memory Manager lease of a process that died: %s", _describe(holders[0]))
    others = _overlapping(mem, name, owner)
    if others:  # taken together with an overlapping run: give ours back, wait
        mem.sources.release_lease(name, owner)
        return _describe(others[0])
    return None


class _Renewal(threading.Thread):
    """Renews a lease every third of its time to live until stopped."""

    def __init__(self, mem: MemoryContext, name: str, owner: str, ttl: timedelta):
        super().__init__(name=f"lease-{name}", daemon=True)
        self.mem, self.lease, self.owner, self.ttl = mem, name, owner, ttl
        self.stop = threading.Event()
        self.lost = False

    def run(self) -> None:
        while not self.stop.wait(self.ttl.total_seconds() / 3):
            try:
                if not self.mem.sources.renew_lease(self.lease, self.owner, self.mem.now() + self.ttl):
                    self.lost = True
                    log.error("lost the Memory Manager lease %s (expired and taken)", self.lease)
                    return
            except Exception as e:  # the database is away: try again at the next beat
                log.warning("could not renew the Memory Manager lease %s: %s", self.lease, e)


@contextmanager
def exclusive(
    mem: MemoryContext, partition: str | None = None, *, wait_s: float | None = None
) -> Iterator[str]:
    """Hold the home's Memory Manager lease (of ``partition``, if any) for the block;
    yields the owner id. Waits up to ``wait_s`` (default ``lease_wait_s``) for another
    run to finish, then raises :class:`ManagerBusyError`. Re-entrant per thread."""
    name = lease_name(partition)
    held = _names()
    home = id(mem.sources)  # one service's connection to one home
    for key in ((home, name), (home, MANAGER_LEASE)):
        if key in held:  # the cycle around this phase holds it
            yield held[key]
            return
    cfg = mem.manager_config
    ttl = timedelta(seconds=cfg.lease_ttl_s)
    wait = cfg.lease_wait_s if wait_s is None else wait_s
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    deadline = time.monotonic() + max(0.0, wait)
    while (busy := _try_take(mem, name, owner, ttl)) is not None:
        if time.monotonic() >= deadline:
            raise ManagerBusyError(
                f"another Memory Manager run holds this home ({busy}); waited {wait:g} s and"
                " changed nothing"
            )
        _notify("waiting", name, owner)
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    renewal = _Renewal(mem, name, owner, ttl)
    renewal.start()
    held[home, name] = owner
    _notify("acquired", name, owner)
    try:
        yield owner
    finally:
        held.pop((home, name), None)
        renewal.stop.set()
        renewal.join()
        try:
            mem.sources.release_lease(name, owner)
        finally:
            _notify("released", name, owner)


@contextmanager
def cleanup_allowed(mem: MemoryContext) -> Iterator[bool]:
    """Whether old table versions may be dropped now (for the block): True while this
    holds the home's lease (taken without waiting, or held by this thread), False while a
    Memory Manager run (a phase, a partition) holds it or the SQL sources cannot say. A
    run's writes start from the versions it read; dropping them under it is what a
    cleanup must never do."""
    held = _names()
    home = id(mem.sources)
    if (home, MANAGER_LEASE) in held:
        yield True
        return
    owner = f"{socket.gethostname()}:{os.getpid()}:cleanup-{uuid.uuid4().hex[:8]}"
    try:
        busy = _try_take(mem, MANAGER_LEASE, owner, timedelta(seconds=mem.manager_config.lease_ttl_s))
    except Exception as e:  # the database is away: keep every version this time
        log.debug("no version cleanup: the Memory Manager lease cannot be read (%s)", e)
        busy = "unknown"
    if busy is not None:
        yield False
        return
    try:
        yield True
    finally:
        try:
            mem.sources.release_lease(MANAGER_LEASE, owner)
        except Exception as e:  # expires on its own
            log.warning("could not release the cleanup's lease: %s", e)


def exclusive_phase(run: F) -> F:
    """Run ``run(mem, ...)`` (a phase, the cycle, the compaction) under the lease of its
    ``partition`` argument (the whole pool's when it has none)."""
    signature = inspect.signature(run)

    @functools.wraps(run)
    def wrapper(mem: MemoryContext, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(mem, *args, **kwargs)
        with exclusive(mem, bound.arguments.get("partition")):
            return run(mem, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = [
    "LEASE_HOOKS",
    "MANAGER_LEASE",
    "ManagerBusyError",
    "cleanup_allowed",
    "exclusive",
    "exclusive_phase",
    "lease_name",
]
