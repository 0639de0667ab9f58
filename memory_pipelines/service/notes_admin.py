"""``svc.notes_admin``: what an analyst or operator does to the notes (CONTRACT §2.6,
§2.7, §2.9): add them by hand, list, correct, change status, archive, restore, erase,
read their history, export and import, purge a user. Each method is also ``svc.<name>``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memory_pipelines import admin
from memory_pipelines.admin import bulk
from memory_pipelines.errors import NotFoundError, ValidationError
from memory_pipelines.history import restore, transfer
from memory_pipelines.limits import check_fields, check_ids
from memory_pipelines.note_events import EventKind, NoteEvent, status_event
from memory_pipelines.notes import (
    AuthorType,
    Example,
    ExampleStatus,
    Note,
    NoteStatus,
    NoteType,
    ProtectionTier,
    append_comment,
)
from memory_pipelines.purge import purge_user
from memory_pipelines.service.parts import Host


class NotesAdmin:
    """Manual notes and examples, their administration, history, export and import."""

    def __init__(self, service: Host):
        self._service = service

    # -- manual notes and examples ---------------------------------------------------------

    def add_note(
        self,
        note: str,
        *,
        type: str = NoteType.PREFERENCE,
        status: str = NoteStatus.ACTIVE,
        author_type: str = AuthorType.USER,
        protection_tier: str = ProtectionTier.STANDARD,
        agent_id: str | None = None,
        user_id: str | None = None,
        company_id: str | None = None,
        **other_fields: Any,
    ) -> Note:
        """Store a note manually (any type, any status)."""
        if not isinstance(note, str) or not note.strip():
            raise ValidationError("note must be a non-empty string")
        check_fields(
            {
                "note": note,
                "type": type,
                "status": status,
                "author_type": author_type,
                "protection_tier": protection_tier,
                **other_fields,
            }
        )
        check_ids({"agent_id": agent_id, "user_id": user_id, "company_id": company_id})
        try:
            obj = Note(
                note=note.strip(),
                type=type,
                status=status,
                author_type=author_type,
                protection_tier=protection_tier,
                agent_id=agent_id,
                user_id=user_id,
                company_id=company_id,
                **other_fields,
            )
        except Exception as e:
            raise ValidationError(f"invalid note: {e}") from e
        # a generated id is new: appended without a lookup; a caller's id may be saved by
        # two processes at once (or name a stored note), so it is merged on id
        fresh = "id" not in other_fields
        saved = self._service.notebook.create_notes([obj], phase="manual", fresh=fresh)[0]
        self._service.registry.register(user_id, company_id)
        return saved

    def add_notes(
        self, notes: Sequence[Mapping[str, Any]], *, key: Mapping[str, Any] | None = None
    ) -> list[Note]:
        """Store many notes: each item is a mapping of :meth:`add_note`'s arguments
        (``note`` required), saved as one ``add_note`` each would save it (a ``created``
        event each), but embedded in batches and committed in few table versions. The whole
        list is validated first: a bad item is a ``ValidationError`` naming its index and
        field (``notes[3].type: ...``) and nothing is saved. ``key`` (an API key row) must
        be an analyst or admin key and bind every item (see :mod:`memory_pipelines.admin.bulk`)."""
        saved = bulk.add_notes(self._service.context, notes, key=key)
        for scope in dict.fromkeys((n.user_id, n.company_id) for n in saved):
            self._service.registry.register(*scope)
        return saved

    def add_example(
        self,
        agent_id: str,
        example_input: str,
        example_output: str,
        *,
        success_score: float | None = None,
        user_id: str | None = None,
        company_id: str | None = None,
        status: str = ExampleStatus.ACTIVE,
        **other_fields: Any,
    ) -> Example:
        """Store a curated example for an agent."""
        for name, value in (("example_input", example_input), ("example_output", example_output)):
            if not isinstance(value, str) or not value.strip():
                raise ValidationError(f"{name} must be a non-empty string")
        check_fields(
            {
                "example_input": example_input,
                "example_output": example_output,
                "status": status,
                **other_fields,
            }
        )
        check_ids({"agent_id": agent_id, "user_id": user_id, "company_id": company_id})
        if success_score is not None and not (0 <= float(success_score) <= 100):
            raise ValidationError(f"success_score must be between 0 and 100, got {success_score!r}")
        try:
            obj = Example(
                agent_id=agent_id,
                example_input=example_input,
                example_output=example_output,
                success_score=success_score,
                user_id=user_id,
                company_id=company_id,
                status=status,
                **other_fields,
            )
        except Exception as e:
            raise ValidationError(f"invalid example: {e}") from e
        return self._service.save_examples([obj])[0]

    # -- reading and correcting notes (memory_pipelines.admin) -----------------------------

    def list_notes(
        self,
        *,
        agent_id: str | None = None,
        user_id: str | None = None,
        company_id: str | None = None,
        status: str | None = None,
        q: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        key: Mapping[str, Any] | None = None,
    ) -> admin.NotePage:
        """One page of notes, newest first, filtered and searched (every word of ``q``,
        ignoring case), with the cursor of the next page; ``key`` (an API key row) keeps
        the page inside its binding."""
        return admin.list_notes(
            self._service.context,
            agent_id=agent_id,
            user_id=user_id,
            company_id=company_id,
            status=status,
            q=q,
            limit=limit,
            cursor=cursor,
            key=key,
        )

    def note(self, note_id: str, *, key: Mapping[str, Any] | None = None) -> Note:
        """The note; ``NotFoundError`` for an unknown id or one outside ``key``'s binding."""
        return admin.get_note(self._service.context, note_id, key)

    def update_note(
        self,
        note_id: str,
        *,
        note: str | None = None,
        type: str | None = None,
        status: str | None = None,
        protection_tier: str | None = None,
        key: Mapping[str, Any] | None = None,
    ) -> Note:
        """Correct a note (a changed text is re-embedded): one event, one audit step."""
        return admin.update_note(
            self._service.context,
            note_id,
            note=note,
            type=type,
            status=status,
            protection_tier=protection_tier,
            key=key,
        )

    def update_notes(self, changes: Iterable[tuple[Note, Mapping[str, Any]]]) -> list[Note]:
        """Apply field changes to notes and save them in one upsert (an ``updated`` event
        per note, by the analyst)."""
        return self._service.notebook.update_notes(changes, event=EventKind.UPDATED, phase="manual")

    # -- status, history and undo -----------------------------------------------------------

    def set_note_status(self, note_id: str, status: str, comment: str | None = None) -> Note:
        """Change a note's status, appending ``comment`` to its audit trail."""
        try:
            status = NoteStatus(status).value
        except ValueError as e:
            raise ValidationError(f"unknown note status {status!r}") from e
        note = self._service.get_note(note_id)
        if note is None:
            raise NotFoundError(f"note {note_id!r} does not exist")
        update: dict[str, Any] = {"status": status}
        if comment:
            update["comments"] = append_comment(note.comments, comment)
        return self._service.notebook.update_notes(
            [(note, update)],
            event=status_event(note.status, status),
            phase="manual",
            **({"comment": comment} if comment else {}),
        )[0]

    def set_notes_status(
        self,
        note_ids: Sequence[str],
        status: str,
        comment: str | None = None,
        *,
        key: Mapping[str, Any] | None = None,
    ) -> list[Note]:
        """:meth:`set_note_status` for many notes in one upsert (e.g. archive a list):
        every id is checked before anything changes; one status event per changed note."""
        return bulk.set_notes_status(self._service.context, note_ids, status, comment, key=key)

    def archive_note(self, note_id: str, *, key: Mapping[str, Any] | None = None) -> Note:
        """Archive a note (an ``archived`` event and an audit step)."""
        return admin.archive_note(self._service.context, note_id, key)

    def history(self, note_id: str) -> list[NoteEvent]:
        """Every lifecycle event of a note, oldest first; ``[]`` for an unknown id."""
        if not isinstance(note_id, str) or not note_id:
            return []
        return self._service.sources.note_history(note_id)

    def restore_note(self, note_id: str) -> Note:
        """Undo the decision that revoked, archived or merged a note: back to the status it
        had before, with a ``restored`` event; the same rule leaves it alone afterwards
        until the analyst changes it again (:mod:`memory_pipelines.history.restore`)."""
        return restore.restore_note(self._service.context, note_id)

    # -- erasure ------------------------------------------------------------------------------

    def erase_note(
        self,
        note_id: str,
        *,
        key: Mapping[str, Any] | None = None,
        lease_wait_s: float | None = None,
    ) -> dict[str, Any]:
        """Erase a note for good (row, events, injection rows, old versions); records a
        ``purged`` event without text; returns counts. Admin keys only. While a Memory
        Manager run holds the home it waits up to ``lease_wait_s`` (default
        ``manager_config.lease_wait_s``), then raises ``ManagerBusyError`` having changed
        nothing."""
        return admin.erase_note(self._service.context, note_id, key, lease_wait_s=lease_wait_s)

    def purge_user(self, user_id: str, *, lease_wait_s: float | None = None) -> dict[str, Any]:
        """Erase every note, example, audit and history row of a user, old table versions
        included, and return counts (see :mod:`memory_pipelines.purge`). While a Memory
        Manager run holds the home it waits up to ``lease_wait_s`` (default
        ``manager_config.lease_wait_s``), then raises ``ManagerBusyError`` having changed
        nothing."""
        counts = purge_user(self._service.context, user_id, lease_wait_s=lease_wait_s)
        self._service.sources.forget_deletions("user", user_id)  # its id must not survive either
        self._service.registry.forget(user_id=user_id)
        return counts

    # -- export and import (memory_pipelines.history.transfer) -----------------------------

    def export_notes(
        self,
        path: str | os.PathLike[str],
        *,
        agent_id: str | None = None,
        user_id: str | None = None,
        company_id: str | None = None,
        include_vectors: bool = True,
    ) -> int:
        """Write every note and example of the selection (any status, every field, their
        history and, unless told not to, vectors) to a ``.jsonl`` or ``.parquet`` file
        outside the home; returns how many notes and examples it wrote."""
        return transfer.export_notes(
            self._service.context,
            path,
            agent_id=agent_id,
            user_id=user_id,
            company_id=company_id,
            include_vectors=include_vectors,
        )

    def import_notes(self, path: str | os.PathLike[str]) -> dict[str, int]:
        """Import an export file (validated whole first), keeping ids, fields and history;
        idempotent. Returns counts: ``imported``, ``skipped``, ``notes``, ``examples``,
        ``events``, ``reembedded``."""
        return transfer.import_notes(self._service.context, path)
