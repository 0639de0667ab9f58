"""Per-agent partitions of the note pool, for the partitioned Memory Manager jobs.

Every note belongs to exactly one partition: the partition named by its ``agent_id``,
or :data:`SHARED_PARTITION` when the note has no agent (user-, company- and
global-level notes shared by every agent). Every Memory Manager phase takes an optional
``partition``: ``None`` is the whole pool (the unpartitioned jobs of small installs);
a partition key restricts what the phase reads and writes to that partition's notes,
examples, conversations and agent runs. Nothing a phase does crosses partitions:
consolidation, contradictions and hardening work within one exact scope (a scope names
at most one agent), and extraction only ever revokes notes of the mined agent. So the partitions of one pool can be maintained by separate
runs, in parallel, and the union of their work equals a whole-pool run, except for two
per-run quantities that become per-partition: the caps ("at most 200 notes per run")
and the uniqueness percentile cohort of importance scoring (the partition's Active
notes instead of the whole pool's).

Cursors and watermarks are kept per partition under :func:`state_key`. A partition's
effective cursor is the later of its own and the whole-pool one, because a whole-pool
run covers every partition; so a store can move from the unpartitioned jobs to the
partitioned ones without mining or folding anything twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from memory_pipelines.errors import ValidationError
from memory_pipelines.store import Cond, eq, is_null

#: The partition of notes that have no agent (shared across agents). Reserved: no
#: agent may be configured with this id.
SHARED_PARTITION = "_shared"

#: Substrings Dagster refuses in a partition key: an agent whose id holds one cannot
#: be a partition (its notes are still maintained by the unpartitioned jobs).
_INVALID_KEY_PARTS = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")


def partition_of(agent_id: str | None) -> str:
    """The partition a note or example with this ``agent_id`` belongs to."""
    return agent_id if agent_id else SHARED_PARTITION


def is_valid_key(key: str) -> bool:
    """Whether ``key`` can be a Dagster partition key (non-empty, no refused substring)."""
    return bool(key) and not any(part in key for part in _INVALID_KEY_PARTS)


def partition_keys(agent_ids: Iterable[str]) -> list[str]:
    """The partition keys of a pool with these agents: every valid agent id, then the
    shared partition (always present: user- and company-level notes need maintenance
    even before any agent exists)."""
    keys = sorted({a for a in agent_ids if a and a != SHARED_PARTITION and is_valid_key(a)})
    return [*keys, SHARED_PARTITION]


def check_agent_id(agent_id: str) -> None:
    """Refuse the reserved shared-partition key as an agent id."""
    if agent_id == SHARED_PARTITION:
        raise ValidationError(
            f"agent_id {SHARED_PARTITION!r} is reserved for the partition of notes without an agent"
        )


def note_filter(partition: str | None) -> Cond | None:
    """The note/example table filter of a partition (``None``: no filter, the whole pool)."""
    if partition is None:
        return None
    if partition == SHARED_PARTITION:
        return is_null("agent_id")
    return eq("agent_id", partition)


def agents_in(partition: str | None, agent_ids: Sequence[str]) -> list[str]:
    """The agents of ``agent_ids`` a phase of ``partition`` works on (``None``: all of
    them; the shared partition has no agent, so it mines no conversation)."""
    if partition is None:
        return list(agent_ids)
    return [a for a in agent_ids if a == partition]


def in_partition(agent_id: str | None, partition: str | None) -> bool:
    """Whether an item with this ``agent_id`` belongs to ``partition`` (``None``: yes)."""
    return partition is None or partition_of(agent_id) == partition


def state_key(key: str, partition: str | None) -> str:
    """The ``manager_state`` key of a cursor or record for ``partition`` (the whole-pool
    key itself for ``None``)."""
    return key if partition is None else f"{key}@partition:{partition}"
