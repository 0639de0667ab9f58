"""The Memory Manager phases, one module per phase, each with one entry
``run(mem, run_id=None, partition=None, ...) -> PhaseReport``.

The cycle (:mod:`.cycle`): :mod:`.fold` -> :mod:`.extraction` (notes) -> :mod:`.examples`
-> :mod:`.hardening`, then the gated maintenance (:mod:`.maintenance_run`, gate in
:mod:`.triggers`): :mod:`.importance` -> :mod:`.consolidation` -> :mod:`.contradictions`
-> :mod:`.pruning` -> :mod:`.decay`, and :mod:`.compaction`. Every phase writes its audit
steps and remembered report through :mod:`.audit`; the pure rules live beside them
(:mod:`.scoring`, :mod:`.clustering`, :mod:`.contradiction_rules`, :mod:`.ebbinghaus`).
"""

from memory_pipelines.phases import (
    compaction,
    consolidation,
    contradictions,
    cycle,
    decay,
    examples,
    extraction,
    fold,
    hardening,
    importance,
    maintenance_run,
    pruning,
    triggers,
)

__all__ = [
    "compaction",
    "consolidation",
    "contradictions",
    "cycle",
    "decay",
    "examples",
    "extraction",
    "fold",
    "hardening",
    "importance",
    "maintenance_run",
    "pruning",
    "triggers",
]
