"""PhaseReport: what a Memory Manager phase returns (a dict of counts plus what changed)."""

from __future__ import annotations

from typing import Any


class PhaseReport(dict):
    """A dict of counts (CONTRACT §2.6) that also carries the rows a phase changed.

    ``changed`` holds one plain dict per created/archived/revoked/promoted note
    (``id``, ``agent_id``, ``user_id``, ``company_id``, ``type``, ``status``, ``note``,
    ``action``) for the analyst preview; ``extra`` holds distributions and other
    non-count metadata.
    """

    def __init__(self, counts: dict[str, Any] | None = None, *, changed=None, extra=None):
        super().__init__(counts or {})
        self.changed: list[dict[str, Any]] = list(changed or [])
        self.extra: dict[str, Any] = dict(extra or {})

    def note_changed(self, note: Any, action: str) -> None:
        """Record a changed note (a ``Note``) with the action taken on it."""
        self.changed.append(
            {
                "id": note.id,
                "agent_id": note.agent_id,
                "user_id": note.user_id,
                "company_id": note.company_id,
                "type": note.type,
                "status": note.status,
                "protection_tier": note.protection_tier,
                "action": action,
                "note": note.note,
            }
        )
