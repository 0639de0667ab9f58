"""BM25 in numpy over an in-memory set of texts: the lexical side of ranking the scope's
cached rows (the present path, :mod:`.cache`) and a candidate set that is not the note
table's present rows (time travel, ``as_of``).

Terms are :func:`memory_pipelines.text.terms` (lower case, no stop words, stemmed by the
index's stemmer: ``none``, ``light`` or ``strong``); scores are Okapi BM25 (``k1`` 1.2,
``b`` 0.75, the Lucene/tantivy defaults) with the corpus statistics of the texts scored
together. Only a document holding a query term scores above 0.

Passages of long notes: with ``passage_words`` > 0, a document longer than
``passage_min_words`` terms (0: longer than one window) that holds a query term also
scores as its best passage, windows of ``passage_words`` terms (stop words are not terms)
with a stride of half that, each scored with the same term weights and the corpus's
average length; the document keeps the larger of its whole and its best passage's score.
Length normalisation otherwise buries a long turn that holds the answer in one sentence.
A document's term sequence is kept once computed (:meth:`LexicalIndex.sequence`).

Pseudo-relevance feedback (:func:`prf_scores`, RM3-style): the query is scored, the top
``docs`` documents' terms are weighed by their share of each document times the
document's normalised score (RM1), the ``terms`` heaviest new terms are added to the
query with weight ``weight`` (the heaviest; the others in proportion; an original term
weighs 1), and the expanded query is scored again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from memory_pipelines.text import terms

K1 = 1.2
B = 0.75

_NO_DOCS = np.zeros(0, np.int64)
_NO_TFS = np.zeros(0)


class LexicalIndex:
    """Postings of a fixed list of texts: term -> (document positions, term counts), all
    terms stemmed by ``stemmer``; a document's own term counts (for feedback) are
    recounted from its text when asked (:meth:`doc_terms`), not kept."""

    def __init__(self, texts: Sequence[str], stemmer: str = "light"):
        self.stemmer = stemmer
        self.size = len(texts)
        self.texts = texts
        self._sequences: dict[int, np.ndarray] = {}
        self._ids: dict[str, int] | None = None
        self.lengths = np.zeros(self.size, dtype=np.float64)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for pos in range(self.size):
            counts = self.doc_terms(pos)
            self.lengths[pos] = sum(counts.values())
            for term, n in counts.items():
                docs, tfs = postings.setdefault(term, ([], []))
                docs.append(pos)
                tfs.append(n)
        self.postings = {
            t: (np.asarray(d, dtype=np.int64), np.asarray(f, dtype=np.float64))
            for t, (d, f) in postings.items()
        }

    def doc_terms(self, pos: int) -> Counter[str]:
        """The term counts of the document at ``pos``."""
        return Counter(terms(self.texts[pos] or "", self.stemmer))

    def sequence(self, pos: int) -> np.ndarray:
        """The terms of the document at ``pos`` in order, as ids (computed once per
        document: the word statistics of its passages)."""
        found = self._sequences.get(pos)
        if found is None:
            ids = self._term_ids()
            found = np.fromiter(
                (ids[t] for t in terms(self.texts[pos] or "", self.stemmer)), dtype=np.int32
            )
            self._sequences[pos] = found
        return found

    def _term_ids(self) -> dict[str, int]:
        if self._ids is None:
            self._ids = {t: i for i, t in enumerate(self.postings)}
        return self._ids

    def best_passage(
        self, pos: int, weights: Mapping[str, float], window: int, avg: float
    ) -> float:
        """The best BM25 score of the document's passages (``window`` terms, stride half
        that) for the terms' idf-weights ``weights``, lengths normalised by ``avg``."""
        seq = self.sequence(pos)
        ids = self._term_ids()
        wanted = [(ids[t], w) for t, w in weights.items() if t in ids]
        if not wanted or len(seq) == 0:
            return 0.0
        n = len(seq)
        stride = max(1, window // 2)
        starts = list(range(0, max(1, n - window + 1), stride))
        if starts[-1] + window < n:
            starts.append(n - window)
        begin = np.asarray(starts, dtype=np.int64)
        end = np.minimum(begin + window, n)
        qids = np.asarray([i for i, _ in wanted], dtype=np.int32)
        idf = np.asarray([w for _, w in wanted], dtype=np.float64)
        hits = np.zeros((len(qids), n + 1), dtype=np.float64)
        np.cumsum(seq[None, :] == qids[:, None], axis=1, out=hits[:, 1:])
        tfs = hits[:, end] - hits[:, begin]
        norm = K1 * (1.0 - B + B * (end - begin) / avg)
        per = (idf[:, None] * tfs * (K1 + 1.0) / (tfs + norm[None, :])).sum(axis=0)
        return float(per.max())


Parts = Sequence[tuple[LexicalIndex, np.ndarray | None]]


def bm25_scores(
    query: str | Mapping[str, float],
    parts: Parts,
    *,
    passage_words: int = 0,
    passage_min_words: int = 0,
) -> list[np.ndarray]:
    """BM25 of ``query`` (a text, or terms with their weights) over the union of the
    indexes' kept documents (``mask`` None: all), one score array per index (0 for a dropped
    document or one without a query term). The indexes share one stemmer. With
    ``passage_words`` > 0 a long document scores at least as its best passage (see the
    module docstring)."""
    weights = _weights(query, parts)
    masks = [np.ones(ix.size, dtype=bool) if m is None else m for ix, m in parts]
    n_docs = sum(int(m.sum()) for m in masks)
    total_len = sum(float(ix.lengths[m].sum()) for (ix, _), m in zip(parts, masks, strict=True))
    out = [np.zeros(ix.size, dtype=np.float64) for ix, _ in parts]
    if not weights or n_docs == 0:
        return out
    avg = total_len / n_docs or 1.0
    idfs: dict[str, float] = {}
    for term, weight in weights.items():
        kept = []
        for (ix, _), m in zip(parts, masks, strict=True):
            docs, tfs = ix.postings.get(term, (_NO_DOCS, _NO_TFS))
            keep = m[docs]
            kept.append((docs[keep], tfs[keep]))
        df = sum(len(d) for d, _ in kept)
        if not df:
            continue
        idf = weight * np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
        idfs[term] = float(idf)
        for (ix, _), (docs, tfs), scores in zip(parts, kept, out, strict=True):
            norm = K1 * (1.0 - B + B * ix.lengths[docs] / avg)
            scores[docs] += idf * tfs * (K1 + 1.0) / (tfs + norm)
    if passage_words > 0 and idfs:
        longer = max(passage_min_words, passage_words)
        for (ix, _), scores in zip(parts, out, strict=True):
            for pos in np.flatnonzero((scores > 0) & (ix.lengths > longer)).tolist():
                best = ix.best_passage(pos, idfs, passage_words, avg)
                if best > scores[pos]:
                    scores[pos] = best
    return out


def _weights(query: str | Mapping[str, float], parts: Parts) -> dict[str, float]:
    if not isinstance(query, str):
        return dict(query)
    stemmer = parts[0][0].stemmer if parts else "light"
    return dict.fromkeys(terms(query, stemmer), 1.0)


def prf_scores(
    query: str,
    parts: Parts,
    *,
    n_docs: int,
    n_terms: int,
    weight: float,
    passage_words: int = 0,
    passage_min_words: int = 0,
) -> list[np.ndarray]:
    """:func:`bm25_scores` of ``query`` expanded by pseudo-relevance feedback from the top
    ``n_docs`` documents with ``n_terms`` terms (see the module docstring); plain BM25 when
    ``weight``, ``n_docs`` or ``n_terms`` is 0 or no document matches. ``passage_words`` and
    ``passage_min_words``: passages of long documents, as :func:`bm25_scores`."""
    passages = {"passage_words": passage_words, "passage_min_words": passage_min_words}
    first = bm25_scores(query, parts, **passages)
    if weight <= 0 or n_docs <= 0 or n_terms <= 0 or not parts:
        return first
    top = _top_documents(first, n_docs)
    if not top:
        return first
    original = _weights(query, parts)
    best = max(score for _, _, score in top)
    model: Counter[str] = Counter()
    for i, pos, score in top:
        counts = parts[i][0].doc_terms(pos)
        length = sum(counts.values()) or 1
        for term, n in counts.items():
            if term not in original:
                model[term] += (n / length) * (score / best)
    expansion = model.most_common(n_terms)
    if not expansion:
        return first
    heaviest = expansion[0][1]
    expanded = dict(original)
    expanded.update((t, weight * w / heaviest) for t, w in expansion)
    return bm25_scores(expanded, parts, **passages)


def _top_documents(scores: Sequence[np.ndarray], n: int) -> list[tuple[int, int, float]]:
    """The ``n`` best scoring documents above 0 as (part, position, score), best first
    (ties: earlier part and position first)."""
    flat = np.concatenate(scores)
    found = np.flatnonzero(flat > 0)
    best = found[np.argsort(-flat[found], kind="stable")][:n]
    offsets = np.cumsum([0] + [len(s) for s in scores])
    out = []
    for g in best.tolist():
        i = int(np.searchsorted(offsets, g, side="right")) - 1
        out.append((i, g - int(offsets[i]), float(flat[g])))
    return out
