"""Neighbour search, greedy clustering and consolidation verification: pure functions.

Everything here works on notes already in memory and their vectors (rows L2-normalised,
so a dot product is the cosine similarity). Neighbours are found per scope group with
blocked matrix products (bounded memory, BLAS speed), never by one query per note, and
nothing is embedded.

- :func:`scope_group_key` / :func:`group_indices`: the exact scope a note lives in
  (agent, user, company, primary and secondary scope). Maintenance never compares notes
  across scopes (reference §6.2 items 5 and 7).
- :func:`top_neighbours`: the k most similar base rows of each query row, optionally
  excluding the query itself (reference §6.2 item 2).
- :func:`greedy_clusters` / :func:`chunk_cluster`: the reference single-pass clustering
  (§4.8): a seed takes its not-yet-processed neighbours, everything seen is processed,
  oversized clusters are cut into consecutive chunks.
- :func:`resolve_originals`: the drift guard's breadth-first walk back to generation 0.
- :func:`extract_entities` / :func:`missing_entities`: the non-blocking verification that
  a consolidated note kept the numbers, dates and names of its sources.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from memory_pipelines.notes import Note
from memory_pipelines.text import ENTITY_STOPWORDS

#: target number of float32 similarities held at once by one block (64 MiB)
DEFAULT_BLOCK_ELEMENTS = 1 << 24



# --------------------------------------------------------------------------- scope groups


def scope_group_key(note: Note) -> tuple[str, ...]:
    """The exact scope of a note: agent, user, company, primary and secondary scope."""
    secondary = json.dumps(note.secondary_scopes, sort_keys=True) if note.secondary_scopes else ""
    return (
        note.agent_id or "",
        note.user_id or "",
        note.company_id or "",
        note.primary_scope_entity_id or "",
        note.primary_scope_record_id or "",
        secondary,
    )


def group_indices(keys: Iterable[Hashable]) -> dict[Hashable, np.ndarray]:
    """Row indices per key, in first-seen key order and ascending row order."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return {k: np.asarray(v, dtype=np.int64) for k, v in groups.items()}


# --------------------------------------------------------------------------- neighbours


def top_neighbours(
    queries: np.ndarray,
    base: np.ndarray,
    k: int,
    *,
    min_similarity: float | None = None,
    self_index: np.ndarray | None = None,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most similar ``base`` rows of every ``queries`` row, best first.

    Returns ``(indices, similarities)``, both ``(len(queries), k)``; missing slots (fewer
    than ``k`` rows, or below ``min_similarity``) hold index -1 and similarity -inf.
    ``self_index[i]`` is a base row that query ``i`` must never match (its own row), or -1.
    Work is done in row blocks of about ``block_elements`` similarities.
    """
    m = int(queries.shape[0])
    n = int(base.shape[0])
    idx_out = np.full((m, max(k, 0)), -1, dtype=np.int64)
    sim_out = np.full((m, max(k, 0)), -np.inf, dtype=np.float32)
    if m == 0 or n == 0 or k <= 0:
        return idx_out, sim_out
    kk = min(k, n)
    q = np.ascontiguousarray(queries, dtype=np.float32)
    b = np.ascontiguousarray(base, dtype=np.float32)
    step = max(1, min(m, block_elements // max(n, 1)))
    for start in range(0, m, step):
        stop = min(m, start + step)
        sims = q[start:stop] @ b.T
        if self_index is not None:
            own = np.asarray(self_index[start:stop], dtype=np.int64)
            rows = np.nonzero(own >= 0)[0]
            sims[rows, own[rows]] = -np.inf
        if kk == 1:
            part = np.argmax(sims, axis=1)[:, None]
        elif kk < n:
            part = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
        else:
            part = np.broadcast_to(np.arange(n), (stop - start, n)).copy()
        vals = np.take_along_axis(sims, part, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        part = np.take_along_axis(part, order, axis=1)
        vals = np.take_along_axis(vals, order, axis=1)
        bad = ~np.isfinite(vals)
        if min_similarity is not None:
            bad |= vals < min_similarity
        part[bad] = -1
        vals[bad] = -np.inf
        idx_out[start:stop, :kk] = part
        sim_out[start:stop, :kk] = vals
    return idx_out, sim_out


# --------------------------------------------------------------------------- clustering


def greedy_clusters(
    order: Sequence[int],
    neighbours: np.ndarray,
    min_size_for: Callable[[int], int],
) -> list[list[int]]:
    """The reference greedy single pass over one candidate set.

    ``order``: candidate rows in processing order; ``neighbours[i]``: candidate rows most
    similar to ``i`` (-1 padded, already thresholded). A seed not yet processed takes
    every neighbour not yet processed; all of them become processed whether or not the
    cluster is kept; a cluster is kept when it has at least ``min_size_for(seed)`` rows.
    """
    processed = np.zeros(neighbours.shape[0], dtype=bool)
    clusters: list[list[int]] = []
    for seed in order:
        if processed[seed]:
            continue
        processed[seed] = True
        members = [int(seed)]
        for j in neighbours[seed]:
            if j >= 0 and not processed[j]:
                processed[j] = True
                members.append(int(j))
        if len(members) >= min_size_for(int(seed)):
            clusters.append(members)
    return clusters


def chunk_cluster(members: Sequence[int], max_size: int, min_chunk: int) -> list[list[int]]:
    """A cluster of at most ``max_size`` stays whole; a bigger one is cut into consecutive
    chunks of ``max_size``, keeping only chunks of at least ``min_chunk``."""
    members = list(members)
    if len(members) <= max_size:
        return [members]
    chunks = [members[i : i + max_size] for i in range(0, len(members), max_size)]
    return [c for c in chunks if len(c) >= min_chunk]


def resolve_originals(
    notes: Sequence[Note],
    lookup: Callable[[list[str]], Mapping[str, Note]],
    max_depth: int = 10,
) -> list[Note]:
    """Generation-0 ancestors of ``notes``: a breadth-first walk over
    ``derived_from_note_ids`` (at most ``max_depth`` levels, each id visited once).

    A note with no parents (or whose parents no longer exist, or at the depth limit) is
    terminal and counts as an original. ``lookup(ids)`` returns the notes that exist.
    """
    originals: dict[str, Note] = {}
    visited: set[str] = {n.id for n in notes}
    frontier: list[Note] = list(notes)
    depth = 0
    while frontier:
        pending: list[tuple[Note, list[str], bool]] = []
        wanted: list[str] = []
        for note in frontier:
            parents = [p for p in (note.derived_from_note_ids or []) if isinstance(p, str) and p]
            if not parents or depth >= max_depth:
                originals.setdefault(note.id, note)
                continue
            fresh = [p for p in dict.fromkeys(parents) if p not in visited]
            visited.update(fresh)
            wanted.extend(fresh)
            pending.append((note, fresh, len(fresh) < len(set(parents))))
        found = lookup(wanted) if wanted else {}
        frontier = []
        for note, fresh, reached_elsewhere in pending:
            existing = [found[p] for p in fresh if p in found]
            if not existing and not reached_elsewhere:
                originals.setdefault(note.id, note)  # its lineage is gone: it is the original
            frontier.extend(existing)
        depth += 1
    return list(originals.values())


# --------------------------------------------------------------------------- verification

_MONTHS = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_DATE = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b" + r"|\b" + _MONTHS + r" \d{1,2}\b" + r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?%?")
_CAMEL = re.compile(r"\b(?:[a-z]+(?:[A-Z][a-z0-9]*)+|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)\b")
_SENTENCE_START = re.compile(r"(?:^|[.!?]\s+)([A-Z][A-Za-z'-]*)")


def extract_entities(texts: Iterable[str]) -> list[str]:
    """Entities a faithful summary must keep: dates (YYYY-MM-DD, "Mon dd", m/d/yy),
    numbers (decimals, %), capitalised sentence-initial words (minus a stop list and
    words of 2 letters or fewer) and camelCase/PascalCase terms; in order of appearance."""
    seen: dict[str, str] = {}

    def add(entity: str) -> None:
        entity = entity.strip()
        if entity and entity.lower() not in seen:
            seen[entity.lower()] = entity

    for text in texts:
        text = text or ""
        found: list[tuple[int, str]] = []
        date_spans = []
        for m in _DATE.finditer(text):
            found.append((m.start(), m.group(0)))
            date_spans.append(m.span())
        for m in _NUMBER.finditer(text):
            if not any(s <= m.start() < e for s, e in date_spans):
                found.append((m.start(), m.group(0)))
        for m in _SENTENCE_START.finditer(text):
            word = m.group(1).strip("'-")
            if len(word) > 2 and word.lower() not in ENTITY_STOPWORDS:
                found.append((m.start(1), word))
        for m in _CAMEL.finditer(text):
            found.append((m.start(), m.group(0)))
        for _, entity in sorted(found, key=lambda item: item[0]):
            add(entity)
    return list(seen.values())


@dataclass(frozen=True)
class Verification:
    """Result of checking a consolidated note against its sources' entities."""

    checked: int
    missing: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.missing

    def comment(self, limit: int = 10) -> str:
        """The audit marker appended when entities are missing (first ``limit``)."""
        return f" [Verification: potentially missing entities: {', '.join(self.missing[:limit])}]"


def verify_consolidation(sources: Iterable[str], output: str) -> Verification:
    """Which source entities do not appear (case-insensitively) in ``output``."""
    entities = extract_entities(sources)
    low = (output or "").lower()
    missing = tuple(e for e in entities if e.lower() not in low)
    return Verification(len(entities), missing)
