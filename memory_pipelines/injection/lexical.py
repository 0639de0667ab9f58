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
The long documents' positional postings are built once per index and threshold
(:meth:`LexicalIndex.positions`); a query's passages are then scored in a few array
operations over its terms' occurrences in them.

Pseudo-relevance feedback (:func:`prf_scores`, RM3-style): the query is scored, the top
``docs`` documents' terms are weighed by their share of each document times the
document's normalised score (RM1), the ``terms`` heaviest new terms are added to the
query with weight ``weight`` (the heaviest; the others in proportion; an original term
weighs 1), and the expanded query is scored again.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from memory_pipelines.text import terms

K1 = 1.2
B = 0.75

#: documents longer than this many terms keep their term sequence from the index's one
#: tokenisation (the passages of long documents; a shorter threshold tokenises again)
SEQUENCE_MIN = 8

_NO_DOCS = np.zeros(0, np.int64)
_NO_TFS = np.zeros(0)


class LexicalIndex:
    """Postings of a fixed list of texts: term -> (document positions, term counts), all
    terms stemmed by ``stemmer``; a document's own term counts (for feedback) are
    recounted from its text when asked (:meth:`doc_terms`), not kept; the term sequences
    of documents longer than :data:`SEQUENCE_MIN` terms are kept, as term ids, for the
    passages of long documents (:meth:`positions`)."""

    def __init__(self, texts: Sequence[str], stemmer: str = "light"):
        self.stemmer = stemmer
        self.size = len(texts)
        self.texts = texts
        self._positions: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        self._positions_lock = threading.Lock()
        self.lengths = np.zeros(self.size, dtype=np.float64)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        long_terms: list[str] = []
        long_docs: list[int] = []
        for pos in range(self.size):
            seq = terms(self.texts[pos] or "", stemmer)
            self.lengths[pos] = len(seq)
            for term, n in Counter(seq).items():
                docs, tfs = postings.setdefault(term, ([], []))
                docs.append(pos)
                tfs.append(n)
            if len(seq) > SEQUENCE_MIN:
                long_terms.extend(seq)
                long_docs.append(pos)
        self.postings = {
            t: (np.asarray(d, dtype=np.int64), np.asarray(f, dtype=np.float64))
            for t, (d, f) in postings.items()
        }
        #: the term sequences of the documents longer than SEQUENCE_MIN terms, as term ids
        #: (positions in ``postings``) one after another, kept from this one tokenisation
        #: for the passages of long documents
        self._names = list(postings)
        ids = {t: i for i, t in enumerate(self._names)}
        self._long_docs = np.asarray(long_docs, dtype=np.int64)
        self._long_terms = np.fromiter((ids[t] for t in long_terms), np.int32, len(long_terms))

    def doc_terms(self, pos: int) -> Counter[str]:
        """The term counts of the document at ``pos``."""
        return Counter(terms(self.texts[pos] or "", self.stemmer))

    def positions(self, longer: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Positional postings of the documents longer than ``longer`` terms: term ->
        (document positions, term positions in the document), built once per threshold
        (the word statistics of the long documents' passages)."""
        with self._positions_lock:
            found = self._positions.get(longer)
            if found is None:
                found = self._positions[longer] = self._build_positions(longer)
            return found

    def _build_positions(self, longer: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        if longer >= SEQUENCE_MIN:
            docs, seq = self._long_docs, self._long_terms
        else:  # shorter than the sequences kept: tokenise again
            docs, seq = self._sequences(longer)
        sizes = self.lengths[docs].astype(np.int64)
        doc = np.repeat(docs, sizes)
        at = np.arange(len(doc), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        keep = self.lengths[doc] > longer
        term, doc, at = seq[keep], doc[keep], at[keep]
        if not len(term):
            return {}
        order = np.argsort(term, kind="stable")
        term, doc, at = term[order], doc[order], at[order]
        cuts = np.flatnonzero(np.diff(term)) + 1
        starts = np.concatenate([[0], cuts]).tolist()
        ends = np.concatenate([cuts, [len(term)]]).tolist()
        return {
            self._names[int(term[a])]: (doc[a:b], at[a:b])
            for a, b in zip(starts, ends, strict=True)
        }

    def _sequences(self, longer: int) -> tuple[np.ndarray, np.ndarray]:
        """The documents longer than ``longer`` terms and their term ids, one after
        another (tokenised again)."""
        ids = {t: i for i, t in enumerate(self._names)}
        docs = np.flatnonzero(self.lengths > longer)
        found = [
            ids[t] for pos in docs.tolist() for t in terms(self.texts[pos] or "", self.stemmer)
        ]
        return docs.astype(np.int64), np.asarray(found, dtype=np.int32)

    def best_passages(
        self,
        idfs: Mapping[str, float],
        candidates: np.ndarray,
        *,
        window: int,
        longer: int,
        avg: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best passage score of each long document among ``candidates`` (a mask over
        the documents) that holds a term of ``idfs`` (term -> weighted idf): windows of
        ``window`` terms starting every ``window // 2``, the last one reaching the end,
        scored by BM25 with their own length against ``avg``. Returns (documents,
        scores)."""
        table = self.positions(longer)
        found = [(table[t], w) for t, w in idfs.items() if t in table]
        if not found:
            return _NO_DOCS, _NO_TFS
        d_parts, p_parts, t_parts = [], [], []
        weights = np.zeros(len(found))
        for q, ((docs, where), weight) in enumerate(found):
            keep = candidates[docs]
            d_parts.append(docs[keep])
            p_parts.append(where[keep])
            t_parts.append(np.full(int(keep.sum()), q, dtype=np.int64))
            weights[q] = weight
        doc, at, term = (np.concatenate(a) for a in (d_parts, p_parts, t_parts))
        if not len(doc):
            return _NO_DOCS, _NO_TFS
        stride = max(1, window // 2)
        n = self.lengths[doc].astype(np.int64)
        last = np.maximum(0, -(-(n - window) // stride))  # the last window's index
        wins, terms_, docs_ = [], [], []
        for back in range(-(-window // stride) + 1):
            j = at // stride - back
            ok = (j >= 0) & (j <= last) & (at < j * stride + window)
            wins.append(j[ok])
            terms_.append(term[ok])
            docs_.append(doc[ok])
        j, term, doc = (np.concatenate(a) for a in (wins, terms_, docs_))
        span = int(j.max()) + 1 if len(j) else 1
        cell = doc * span + j  # one passage of one document
        keys = cell * len(found) + term
        unique, tf = np.unique(keys, return_counts=True)
        cell_u, term_u = unique // len(found), unique % len(found)
        doc_u, j_u = cell_u // span, cell_u % span
        length = np.minimum(window, self.lengths[doc_u] - j_u * stride)
        norm = K1 * (1.0 - B + B * length / avg)
        part = weights[term_u] * tf * (K1 + 1.0) / (tf + norm)
        cells, inverse = np.unique(cell_u, return_inverse=True)
        per_cell = np.bincount(inverse, weights=part)
        cell_doc = cells // span
        docs_out = np.unique(cell_doc)
        best = np.full(len(docs_out), -np.inf)
        np.maximum.at(best, np.searchsorted(docs_out, cell_doc), per_cell)
        return docs_out, best


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
        for (ix, _), m, scores in zip(parts, masks, out, strict=True):
            docs, best = ix.best_passages(idfs, m, window=passage_words, longer=longer, avg=avg)
            scores[docs] = np.maximum(scores[docs], best)
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
