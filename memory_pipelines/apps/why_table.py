"""The explanation as terminal text (``memory-pipelines why``): a summary line, a table
with one row per note, then each note's five steps."""

from __future__ import annotations

from memory_pipelines.apps.terminal import printable
from memory_pipelines.explain.models import Explanation


def _short(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(explanation: Explanation) -> str:
    """The explanation as terminal text: a summary line, one table row per note, then the
    details of each note (scope rule, rank, origin, lifecycle, lineage, TTL/decay).
    Control characters of note text are escaped (see :mod:`memory_pipelines.apps.terminal`)."""
    return printable(_render_table(explanation), keep="\n")


def _render_table(explanation: Explanation) -> str:
    from tabulate import tabulate

    a = explanation.agent
    head = (
        f'Why does agent {a.agent_id} (not) remember "{explanation.topic}"?\n'
        f"strategy {a.note_injection_strategy}, max {a.max_notes_to_inject} notes, "
        f"inject_notes {'on' if a.inject_notes else 'off'}; "
        f"input: {_short(explanation.current_input or explanation.topic, 60)!r}; "
        f"{len(explanation.injected_note_ids)} note(s) injected for this context"
    )
    if explanation.context_problem:
        head += f"\ncontext problem: {explanation.context_problem}"
    if not explanation.notes:
        where = "" if explanation.all_scopes else " in this context's scope"
        return head + f"\n\nNo note about this topic was found{where} (any status)."
    rows = [
        [
            i,
            n.note_id[:8],
            n.status,
            f"{n.scope.level} {n.scope.label}",
            n.rank.rank if n.rank.rank is not None else "-",
            n.verdict,
            _short(n.note, 48),
        ]
        for i, n in enumerate(explanation.notes, 1)
    ]
    table = tabulate(
        rows, headers=["#", "note", "status", "scope", "rank", "verdict", "text"], tablefmt="simple"
    )
    details = []
    for i, n in enumerate(explanation.notes, 1):
        lines = [
            f"[{i}] {n.note_id}  {n.type}  author {n.provenance.author_type}",
            f"    verdict: {n.verdict}",
        ]
        lines.append(
            f"    1 status: {n.status} ({'injectable' if n.injectable else 'not injectable'})"
        )
        lines.append(f"    2 scope: {n.scope.detail}")
        lines.append(f"    3 rank: {n.rank.detail}")
        lines.append(f"    4 origin: {n.provenance.origin}")
        for w in n.provenance.writes:
            lines.append(f"      write in run {w.run_id}: {w.disposition} ({_short(w.reason, 70)})")
        for e in n.provenance.events:
            when = f" at {e.at.isoformat()}" if e.at else ""
            related = f" [related {', '.join(e.related_note_ids)}]" if e.related_note_ids else ""
            lines.append(f"      {e.kind}{when}: {_short(e.detail, 80)}{related}")
        if n.lineage.merged_into:
            lines.append(
                f"      merged into: {' -> '.join(n.lineage.merged_into)} ({n.lineage.survivor_status})"
            )
        if n.lineage.all_sources:
            lines.append(f"      sources: {', '.join(n.lineage.all_sources)}")
        lines.append(f"    5 ttl: {n.retirement.ttl}")
        lines.append(f"      decay: {n.retirement.decay}")
        details.append("\n".join(lines))
    return f"{head}\n\n{table}\n\n" + "\n\n".join(details)
