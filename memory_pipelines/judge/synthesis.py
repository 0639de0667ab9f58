"""The offline judge's consolidation: one note replacing a cluster, clauses merged
newer-wins, every entity kept (:func:`synthesize`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from memory_pipelines.judge.clauses import _CLAUSE_SPLIT, _Clause, _clause_conflict, _parse_clause
from memory_pipelines.judge.decisions import (
    COVERED_SIMILARITY,
    MAX_CONSOLIDATED_CHARS,
    ConsolidationDecision,
    _cluster_problem,
    _recency_key,
    _scope_level,
)
from memory_pipelines.judge.lexicon import (
    _bag,
    _information_diff,
    _missing_entities,
    entities,
)
from memory_pipelines.notes import Note
from memory_pipelines.text import normalize_text

#: the judge's similarity of a text to others (cosines of their embeddings)
Similarity = Callable[[str, Sequence[str]], list[float]]

#: (clause text, parsed, owner note)
_Item = tuple[str, "_Clause | None", Note]


def synthesize(
    notes: Sequence[Note], *, anchored: bool, similarity: Similarity
) -> ConsolidationDecision:
    """One note replacing a valid cluster; never skips a valid cluster.

    Base: the highest consolidation_count note when ``anchored``, else the newest (tie:
    higher importance). Clauses of the other notes are appended after "; also: " unless
    already covered; a clause that conflicts with a clause of a newer note is dropped
    (kept as "; previously: ..." only when it carries an entity the rest lacks). Every
    entity of every source survives, even past 300 characters. Type: the most common
    (tie: the base's); scope: user/company/global by what all notes share.
    """
    problem = _cluster_problem(notes)
    if problem is not None:
        return ConsolidationDecision(False, reason=problem)
    if anchored:
        base = max(notes, key=lambda n: (n.consolidation_count, *_recency_key(n)))
    else:
        base = max(notes, key=_recency_key)
    items, history = _clauses_in_order(base, notes)
    superseded = _superseded(items)
    kept, old, dropped = _fold(items, superseded, base, similarity)
    all_entities = entities(" ".join(n.note for n in notes))
    old = [
        o
        for o in dict.fromkeys([*old, *history])
        if o and _missing_entities(entities(o), "; ".join(kept))
    ]
    reason = (
        f"Merged {len(notes)} related notes around note {base.id}"
        f" ({'anchored on the most consolidated note' if anchored else 'newest note as base'});"
        f" {dropped} repeated clause(s) folded, {len(superseded)} superseded clause(s) resolved"
        " newer-wins."
    )
    return ConsolidationDecision(
        should_consolidate=True,
        content=_render(kept, old, all_entities),
        type=_majority_type(notes, base),
        scope_level=_scope_level(notes),
        confidence=85.0,
        source_note_ids=tuple(n.id for n in notes),
        reason=reason,
    )


def _clauses_in_order(base: Note, notes: Sequence[Note]) -> tuple[list[_Item], list[str]]:
    """The clauses of the notes in priority order (the base first, then newest first),
    and the "previously: ..." parts of earlier consolidations (history, not claims)."""
    others = sorted((n for n in notes if n.id != base.id), key=_recency_key, reverse=True)
    items: list[_Item] = []
    history: list[str] = []
    for n in (base, *others):
        for part in _CLAUSE_SPLIT.split(n.note):
            part = part.strip().rstrip(".").strip()
            if part.lower().startswith("previously:"):
                history.append(part.split(":", 1)[1].strip())
            elif part:
                items.append((part, _parse_clause(part), n))
    return items, history


def _superseded(items: list[_Item]) -> set[int]:
    """The clauses a conflicting clause of another note overrides: the newer note's wins
    (tie: importance, then priority order)."""
    superseded: set[int] = set()
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            ci, cj = items[i][1], items[j][1]
            if i in superseded or j in superseded or ci is None or cj is None:
                continue
            if items[i][2].id == items[j][2].id or _clause_conflict(ci, cj) is None:
                continue
            loser = j if _recency_key(items[i][2]) >= _recency_key(items[j][2]) else i
            superseded.add(loser)
    return superseded


def _fold(
    items: list[_Item], superseded: set[int], base: Note, similarity: Similarity
) -> tuple[list[str], list[str], int]:
    """The clauses kept (a clause of another note already covered is folded; a kept
    clause that a later one states in full, and more, is replaced in place), the
    superseded ones, and how many were folded."""
    kept: list[str] = []
    old: list[str] = []
    dropped = 0
    for idx, (text, _parsed, owner) in enumerate(items):
        if idx in superseded:
            old.append(text)
            continue
        if owner.id != base.id and _covered(text, kept, similarity):
            dropped += 1
            continue
        refined = next(
            (
                i
                for i, k in enumerate(kept)
                if _information_diff(k, text) is None and not _missing_entities(entities(k), text)
            ),
            None,
        )
        if refined is not None:
            kept[refined] = text
            dropped += 1
        else:
            kept.append(text)
    return kept, old, dropped


def _covered(clause: str, kept: Sequence[str], similarity: Similarity) -> bool:
    """True when ``clause`` adds nothing to the kept clauses (and loses no entity)."""
    if not kept:
        return False
    if _missing_entities(entities(clause), " ".join(kept)):
        return False
    norm = normalize_text(clause)
    if any(normalize_text(k) == norm or _information_diff(clause, k) is None for k in kept):
        return True
    sims = similarity(clause, list(kept))
    return any(
        s >= COVERED_SIMILARITY and _bag(clause).negated == _bag(k).negated
        for s, k in zip(sims, kept, strict=True)
    )


def _render(kept: list[str], old: list[str], all_entities: list[str]) -> str:
    def text(k: list[str], o: list[str]) -> str:
        out = k[0] if k else ""
        if len(k) > 1:
            out += "; also: " + "; ".join(k[1:])
        for item in o:
            out += f"; previously: {item}" if out else f"Previously: {item}"
        return out + "."

    # Over 300 chars: drop appended clauses whose entities the rest still carries.
    kept = list(kept)
    i = len(kept) - 1
    while len(text(kept, old)) > MAX_CONSOLIDATED_CHARS and i >= 1:
        trial = kept[:i] + kept[i + 1 :]
        if not _missing_entities(all_entities, text(trial, old)):
            kept = trial
        i -= 1
    return text(kept, old)


def _majority_type(notes: Sequence[Note], base: Note) -> str:
    counts = Counter(str(n.type) for n in notes)
    top = max(counts.values())
    winners = {t for t, c in counts.items() if c == top}
    return str(base.type) if str(base.type) in winners else sorted(winners)[0]
