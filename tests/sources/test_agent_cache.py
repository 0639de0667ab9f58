"""The per-process agent cache: an inject reads no agent row while the SQLite database is
unchanged, and sees every change of an agent (this process's, another connection's,
another process's) on the next call: ``PRAGMA data_version`` moves with any commit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from sqlalchemy import update

from memory_pipelines.errors import UnknownAgentError
from memory_pipelines.sources import agents

A = "agent-cache"


def _other_process(home, body: str) -> None:
    script = textwrap.dedent(
        f"""
        from memory_pipelines import MemoryService
        from memory_pipelines.embeddings import HashEmbedder
        with MemoryService.open({str(home)!r}, embedder=HashEmbedder(dim=64)) as s:
        """
    ) + textwrap.indent(textwrap.dedent(body), "    ")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def _seed(svc, notes: int = 4) -> None:
    svc.configure_agent(A, note_injection_strategy="All", max_notes_to_inject=2)
    for k in range(notes):
        svc.add_note(f"fact number {k}", agent_id=A, user_id="u1")


def test_an_unchanged_database_serves_the_cached_copy(svc):
    _seed(svc)
    first = svc.get_agent(A)
    cache = svc.sources._agent_cache()
    assert cache.configs == {A: first}
    first.max_notes_to_inject = 9  # a caller's copy: the cache is untouched
    assert svc.get_agent(A).max_notes_to_inject == 2


def test_another_processs_configure_agent_is_seen_on_the_next_inject(svc, home):
    _seed(svc)
    ctx = {"agent_id": A, "user_id": "u1"}
    assert len(svc.inject(ctx).notes) == 2
    _other_process(home, f"s.configure_agent({A!r}, max_notes_to_inject=3)")
    assert len(svc.inject(ctx).notes) == 3
    _other_process(home, f"s.configure_agent({A!r}, inject_notes=False)")
    assert svc.inject(ctx).notes == []


def test_an_agent_another_process_creates_is_no_longer_unknown(svc, home):
    with pytest.raises(UnknownAgentError):
        svc.inject({"agent_id": "late"})
    _other_process(home, 's.configure_agent("late", note_injection_strategy="All")')
    assert svc.inject({"agent_id": "late"}).notes == []


def test_a_raw_sql_change_on_another_connection_is_seen(svc):
    _seed(svc)
    svc.get_agent(A)
    with svc.sources.engine.begin() as c:  # a pool connection, not the one that watches
        c.execute(update(agents).where(agents.c.agent_id == A).values(max_notes_to_inject=4))
    assert svc.get_agent(A).max_notes_to_inject == 4
    with svc.sources.engine.begin() as c:
        c.execute(agents.delete().where(agents.c.agent_id == A))
    with pytest.raises(UnknownAgentError):
        svc.get_agent(A)
