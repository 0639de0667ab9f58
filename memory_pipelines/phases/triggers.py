"""The maintenance gate (reference §4.6): forced, the frequency since the *last
maintenance*, or 100 new notes for one agent; and when the last maintenance ran."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.partitions import note_filter, state_key
from memory_pipelines.phases.common import ACTIVE
from memory_pipelines.store import and_, cmp, eq

#: manager_state key of the last completed maintenance
STATE_LAST = "maintenance.last"


def last_maintenance_at(mem: MemoryContext, partition: str | None = None) -> datetime | None:
    """When the last completed maintenance finished (``manager_state``, else the newest
    completed ``manager_runs`` row of kind 'maintenance'). For a ``partition``: the later
    of its own last maintenance and the last whole-pool one (which covered it)."""
    whole = _last_recorded(mem, None)
    if partition is None:
        return whole
    own = _last_recorded(mem, partition)
    return max((t for t in (whole, own) if t is not None), default=None)


def _last_recorded(mem: MemoryContext, partition: str | None) -> datetime | None:
    state = mem.sources.get_state(state_key(STATE_LAST, partition))
    if isinstance(state, dict) and state.get("at"):
        return datetime.fromisoformat(str(state["at"]).replace("Z", "+00:00"))
    if partition is not None:
        return None
    for finished, counts in mem.sources.manager_runs_finished("maintenance", "Completed"):
        if not (counts or {}).get("partition"):  # a whole-pool run
            return finished
    return None


def _cycles_since(mem: MemoryContext, since: datetime | None, partition: str | None = None) -> int:
    """Completed cycles started after ``since``: whole-pool ones, plus the partition's own
    for a ``partition`` (its name is in the recorded counts)."""
    rows = mem.sources.manager_run_counts("cycle", "Completed", since)
    names = {None} if partition is None else {None, partition}
    return sum(1 for counts in rows if (counts or {}).get("partition") in names)


def new_notes_per_agent(
    mem: MemoryContext, since: datetime | None, partition: str | None = None
) -> dict[str, int]:
    """Active auto-generated notes created after ``since``, counted per agent
    (cross-agent notes under ``""``), of one ``partition`` or of the whole pool."""
    conds = [eq("status", ACTIVE), eq("is_auto_generated", True), note_filter(partition)]
    if since is not None:
        conds.append(cmp("created_at", ">", since))
    df = mem.store.notes.scan(and_(*conds), columns=["agent_id"])
    if df.empty:
        return {}
    return {str(k): int(v) for k, v in df["agent_id"].fillna("").value_counts().items()}


def maintenance_trigger(
    mem: MemoryContext, force: bool = False, partition: str | None = None
) -> tuple[bool, str]:
    """Should maintenance run now, and why (reference §4.6, measured since the last
    *maintenance*, §6.2 item 1; the event count is per agent, FR-095/096). For a
    ``partition``: since its last maintenance, counting its cycles and its notes.

    Returns ``(True, "forced" | "every-run" | "time" | "count" | "event")`` or
    ``(False, "disabled" | "not-triggered")``.
    """
    if force:
        return True, "forced"
    cfg = mem.maintenance_config
    freq: Any = cfg.frequency
    if isinstance(freq, str) and freq.strip().isdigit():
        freq = int(freq.strip())
    if freq == "disabled":
        return False, "disabled"
    if isinstance(freq, bool) or not (freq in ("hourly", "daily") or isinstance(freq, int)):
        return True, "every-run"
    last = last_maintenance_at(mem, partition)
    if isinstance(freq, int):
        if freq <= 0:
            return True, "every-run"
        if _cycles_since(mem, last, partition) >= freq:
            return True, "count"
    else:
        if last is None:
            return True, "time"
        hours = (mem.now() - last).total_seconds() / 3600.0
        if hours >= (1.0 if freq == "hourly" else 24.0):
            return True, "time"
    counts = new_notes_per_agent(mem, last, partition)
    if counts and max(counts.values()) >= cfg.note_count_trigger:
        return True, "event"
    return False, "not-triggered"
