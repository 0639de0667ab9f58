"""MemoryManager: the facade over the Memory Manager phases (``svc.manager``).

Each method delegates to one module of :mod:`memory_pipelines.phases` with this
manager's context: the cycle (fold, note and example extraction, hardening, the cycle
record, the sensor's signal) and the maintenance phases (importance, consolidation,
contradictions, pruning, decay). No logic lives here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from memory_pipelines import phases
from memory_pipelines.config import ManagerConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.phases.cycle import CycleSignal
from memory_pipelines.phases.reports import PhaseReport

DEFAULT_CONFIG = ManagerConfig()


class MemoryManager:
    """The Memory Manager phases over one memory context (no Dagster here)."""

    def __init__(self, mem: MemoryContext, config: ManagerConfig | None = None):
        self.mem = mem if config is None else replace(mem, manager_config=config)
        self.config = self.mem.manager_config

    # -- the cycle phases -----------------------------------------------------------------

    def fold_injection_events(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Fold injection events into access statistics (:mod:`~memory_pipelines.phases.fold`)."""
        return phases.fold.run(self.mem, run_id, partition)

    def extract_notes(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Note extraction (:mod:`~memory_pipelines.phases.extraction`)."""
        return phases.extraction.run(self.mem, run_id, partition)

    def extract_examples(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Example extraction (:mod:`~memory_pipelines.phases.examples`)."""
        return phases.examples.run(self.mem, run_id, partition)

    def extract(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Notes, then examples; counts merged (:func:`~memory_pipelines.phases.cycle.extract`)."""
        return phases.cycle.extract(self.mem, run_id, partition)

    def harden(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Hardening of provisional notes (:mod:`~memory_pipelines.phases.hardening`)."""
        return phases.hardening.run(self.mem, run_id, partition)

    # -- the maintenance phases -----------------------------------------------------------

    def score_importance(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Importance scoring (reference §4.7)."""
        return phases.importance.run(self.mem, run_id, partition)

    def consolidate(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Consolidation of similar clusters (reference §4.8)."""
        return phases.consolidation.run(self.mem, run_id, partition)

    def resolve_contradictions(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Contradiction detection and resolution (reference §4.9)."""
        return phases.contradictions.run(self.mem, run_id, partition)

    def prune_stale(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """Stale-reference pruning (reference §4.10)."""
        return phases.pruning.run(self.mem, run_id, partition)

    def expire_and_decay(self, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
        """TTL expiry and Ebbinghaus decay (reference §4.11)."""
        return phases.decay.run(self.mem, run_id, partition)

    # -- the cycle ------------------------------------------------------------------------

    def finish_cycle(
        self,
        run_id: str,
        status: str = "Completed",
        extra_counts: Mapping[str, Any] | None = None,
        partition: str | None = None,
    ) -> dict[str, Any]:
        """Record the cycle ``run_id`` (:func:`~memory_pipelines.phases.cycle.finish_cycle`)."""
        return phases.cycle.finish_cycle(self.mem, run_id, status, extra_counts, partition)

    def run_cycle(
        self,
        force_maintenance: bool = False,
        run_id: str | None = None,
        partition: str | None = None,
    ) -> PhaseReport:
        """One cycle with gated maintenance (:func:`~memory_pipelines.phases.cycle.run_cycle`)."""
        return phases.cycle.run_cycle(self.mem, force_maintenance, run_id, partition)

    def cycle_signal(self, cursor: Mapping[str, Any] | None = None) -> CycleSignal:
        """Whether a cycle should start now (:func:`~memory_pipelines.phases.cycle.cycle_signal`)."""
        return phases.cycle.cycle_signal(self.mem, cursor)


__all__ = ["DEFAULT_CONFIG", "MemoryManager"]
