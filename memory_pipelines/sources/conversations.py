"""Conversations, messages and agent runs: what the Memory Manager mines. (SQL queries as named methods)"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from memory_pipelines.errors import NotFoundError, ValidationError
from memory_pipelines.sources.base import SourcesBase, chunks
from memory_pipelines.sources.tables import (
    agent_runs,
    conversations,
    messages,
)


class ConversationQueries(SourcesBase):
    """Conversations, messages and agent runs: what the Memory Manager mines."""

    # -- conversations and messages --------------------------------------------------

    def add_conversation(
        self, conversation_id: str, agent_id: str, user_id: str | None = None, company_id: str | None = None
    ) -> None:
        now = self.clock()
        with self.begin() as c:
            if c.execute(
                select(conversations.c.conversation_id).where(conversations.c.conversation_id == conversation_id)
            ).first():
                c.execute(
                    update(conversations)
                    .where(conversations.c.conversation_id == conversation_id)
                    .values(agent_id=agent_id, user_id=user_id, company_id=company_id)
                )
            else:
                c.execute(
                    insert(conversations).values(
                        conversation_id=conversation_id,
                        agent_id=agent_id,
                        user_id=user_id,
                        company_id=company_id,
                        created_at=now,
                        last_activity_at=now,
                    )
                )

    def get_conversation(self, conversation_id: str) -> dict[str, Any] | None:
        with self.begin() as c:
            r = c.execute(
                select(conversations).where(conversations.c.conversation_id == conversation_id)
            ).mappings().first()
        return dict(r) if r else None

    def add_message(
        self,
        conversation_id: str,
        message_id: str,
        role: str,
        text: str,
        rating: int | None = None,
        rating_comment: str | None = None,
        created_at: datetime | None = None,
    ) -> None:
        if rating is not None:
            try:
                whole = not isinstance(rating, bool) and int(rating) == rating
            except (TypeError, ValueError):
                whole = False
            if not whole or not (1 <= int(rating) <= 10):
                raise ValidationError(f"rating must be between 1 and 10, got {rating!r}")
            rating = int(rating)
        when = created_at or self.clock()
        with self.begin() as c:
            if not c.execute(
                select(conversations.c.conversation_id).where(conversations.c.conversation_id == conversation_id)
            ).first():
                raise NotFoundError(f"conversation {conversation_id!r} does not exist")
            seq = c.execute(
                select(func.coalesce(func.max(messages.c.seq), 0)).where(messages.c.conversation_id == conversation_id)
            ).scalar_one()
            values = dict(
                conversation_id=conversation_id, role=role, text=text, rating=rating,
                rating_comment=rating_comment, created_at=when,
            )
            if c.execute(select(messages.c.message_id).where(messages.c.message_id == message_id)).first():
                c.execute(update(messages).where(messages.c.message_id == message_id).values(**values))
            else:
                c.execute(insert(messages).values(message_id=message_id, seq=seq + 1, **values))
            c.execute(
                update(conversations)
                .where(conversations.c.conversation_id == conversation_id)
                .values(last_activity_at=self.clock())
            )

    def delete_conversation(self, conversation_id: str) -> int:
        with self.begin() as c:
            c.execute(delete(messages).where(messages.c.conversation_id == conversation_id))
            n = c.execute(
                delete(conversations).where(conversations.c.conversation_id == conversation_id)
            ).rowcount
            if n:
                self.record_deletion(c, "conversation", conversation_id)
            return n

    def conversations_with_activity(
        self, since: datetime | None, agent_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        q = select(conversations).order_by(conversations.c.last_activity_at, conversations.c.conversation_id)
        if since is not None:
            q = q.where(conversations.c.last_activity_at > since)
        if agent_ids is not None:
            q = q.where(conversations.c.agent_id.in_(list(agent_ids)))
        with self.begin() as c:
            return [dict(r) for r in c.execute(q.limit(limit)).mappings()]

    def messages_of(self, conversation_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        with self.begin() as c:
            return [
                dict(r)
                for r in c.execute(
                    select(messages)
                    .where(messages.c.conversation_id == conversation_id, messages.c.seq > after_seq)
                    .order_by(messages.c.seq)
                ).mappings()
            ]

    def conversations_by_id(self, conversation_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The conversation rows of ``conversation_ids`` that exist."""
        with self.begin() as c:
            return [
                dict(row)
                for row in c.execute(
                    select(conversations).where(
                        conversations.c.conversation_id.in_(list(conversation_ids))
                    )
                ).mappings()
            ]

    def rated_messages_since(self, after: datetime | None) -> tuple[int, datetime | None]:
        """How many rated messages were created after ``after`` (all when None), and the
        newest one's ``created_at``."""
        with self.begin() as c:
            q = select(func.count(), func.max(messages.c.created_at)).where(
                messages.c.rating.is_not(None)
            )
            if after is not None:
                q = q.where(messages.c.created_at > after)
            count, newest = c.execute(q).one()
        return count, newest

    def rated_conversation_summary(self) -> dict[str, Any]:
        """What the conversation source holds for the Memory Manager, in a few numbers:
        conversations, messages, rated messages, conversations with a rated message, and
        the newest rated message's ``created_at`` (None when nothing is rated)."""
        with self.begin() as c:
            n_conversations = c.execute(select(func.count()).select_from(conversations)).scalar_one()
            n_messages = c.execute(select(func.count()).select_from(messages)).scalar_one()
            rated, rated_conversations, newest = c.execute(
                select(
                    func.count(),
                    func.count(func.distinct(messages.c.conversation_id)),
                    func.max(messages.c.created_at),
                ).where(messages.c.rating.is_not(None))
            ).one()
        return {
            "conversations": int(n_conversations),
            "messages": int(n_messages),
            "rated_messages": int(rated),
            "rated_conversations": int(rated_conversations),
            "newest_rated_message_at": newest,
        }

    def agent_run_summary(self) -> dict[str, Any]:
        """What the agent-run source holds: runs, failed or cancelled runs, finished runs,
        and the newest run's ``created_at`` and ``finished_at`` (None when there are none)."""
        with self.begin() as c:
            runs, failed, finished, newest, newest_finished = c.execute(
                select(
                    func.count(),
                    func.count().filter(agent_runs.c.status.in_(["Failed", "Cancelled"])),
                    func.count(agent_runs.c.finished_at),
                    func.max(agent_runs.c.created_at),
                    func.max(agent_runs.c.finished_at),
                )
            ).one()
        return {
            "agent_runs": int(runs),
            "failed_runs": int(failed),
            "finished_runs": int(finished),
            "newest_run_at": newest,
            "newest_finished_at": newest_finished,
        }

    # -- agent runs -----------------------------------------------------------------------

    def add_agent_run(self, run_id: str, agent_id: str, **fields: Any) -> None:
        allowed = {c.name for c in agent_runs.columns} - {"run_id", "agent_id"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValidationError(f"unknown agent run field(s): {', '.join(sorted(unknown))}")
        fields.setdefault("created_at", self.clock())
        with self.begin() as c:
            owner = c.execute(select(agent_runs.c.agent_id).where(agent_runs.c.run_id == run_id)).first()
            if owner is not None and owner[0] != agent_id:
                raise ValidationError(f"run id {run_id!r} already belongs to another agent")
            if owner is not None:
                c.execute(update(agent_runs).where(agent_runs.c.run_id == run_id).values(agent_id=agent_id, **fields))
            else:
                c.execute(insert(agent_runs).values(run_id=run_id, agent_id=agent_id, **fields))

    def get_agent_run(self, run_id: str) -> dict[str, Any] | None:
        with self.begin() as c:
            r = c.execute(select(agent_runs).where(agent_runs.c.run_id == run_id)).mappings().first()
        return dict(r) if r else None

    def agent_runs_since(self, since: datetime | None, limit: int = 1000) -> list[dict[str, Any]]:
        q = select(agent_runs).order_by(agent_runs.c.created_at, agent_runs.c.run_id)
        if since is not None:
            q = q.where(agent_runs.c.created_at > since)
        with self.begin() as c:
            return [dict(r) for r in c.execute(q.limit(limit)).mappings()]

    def high_value_runs(
        self,
        agent_ids: Sequence[str],
        since: datetime | None,
        min_share_count: int,
        min_artifact_count: int,
        limit: int,
    ) -> list[dict[str, Any]]:
        """The newest runs of ``agent_ids`` (created after ``since``) whose artifacts were
        shared at least ``min_share_count`` times or that made ``min_artifact_count``."""
        with self.begin() as c:
            q = (
                select(agent_runs)
                .where(
                    agent_runs.c.agent_id.in_(list(agent_ids)),
                    or_(
                        agent_runs.c.artifact_share_count >= min_share_count,
                        agent_runs.c.artifact_count >= min_artifact_count,
                    ),
                )
                .order_by(agent_runs.c.created_at.desc())
                .limit(limit)
            )
            if since is not None:
                q = q.where(agent_runs.c.created_at > since)
            return [dict(r) for r in c.execute(q).mappings()]

    def latest_runs_of(self, conversation_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The most recent agent run of each conversation (source run id and scope)."""
        out: dict[str, dict[str, Any]] = {}
        with self.begin() as c:
            for chunk in chunks(conversation_ids):
                for r in c.execute(
                    select(agent_runs)
                    .where(agent_runs.c.conversation_id.in_(chunk))
                    .order_by(agent_runs.c.created_at, agent_runs.c.run_id)
                ).mappings():
                    out[r["conversation_id"]] = dict(r)
        return out

    def failed_runs(self, agent_ids: Sequence[str], since: datetime | None) -> list[dict[str, Any]]:
        """Runs of ``agent_ids`` (created after ``since``) that failed or were cancelled
        with an error message, or finished unsuccessfully; oldest first."""
        failed = or_(
            and_(
                agent_runs.c.status.in_(["Failed", "Cancelled"]),
                agent_runs.c.error_message.is_not(None),
                agent_runs.c.error_message != "",
            ),
            and_(
                agent_runs.c.success.is_(False), agent_runs.c.status.not_in(["Running", "Paused"])
            ),
        )
        with self.begin() as c:
            q = (
                select(agent_runs)
                .where(agent_runs.c.agent_id.in_(list(agent_ids)), failed)
                .order_by(agent_runs.c.created_at, agent_runs.c.run_id)
            )
            if since is not None:
                q = q.where(agent_runs.c.created_at > since)
            return [dict(r) for r in c.execute(q).mappings()]
