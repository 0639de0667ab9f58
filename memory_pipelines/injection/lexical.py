"""BM25 in numpy over an in-memory set of texts: the lexical side of ranking a candidate set
that is not the note table's present rows (time travel, ``as_of``), where LanceDB's full-text
index (which holds the present text) cannot answer.

Terms are :func:`memory_pipelines.text.terms` (lower case, no stop words, lightly
stemmed); scores are Okapi BM25 (``k1`` 1.2, ``b`` 0.75, the Lucene/tantivy defaults) with
the corpus statistics of the texts scored together. Only a document holding a query term
scores above 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from memory_pipelines.text import terms

K1 = 1.2
B = 0.75


class LexicalIndex:
    """Postings of a fixed list of texts: term -> (document positions, term counts)."""

    def __init__(self, texts: Sequence[str]):
        self.size = len(texts)
        self.lengths = np.zeros(self.size, dtype=np.float64)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for pos, text in enumerate(texts):
            counts = Counter(terms(text or ""))
            self.lengths[pos] = sum(counts.values())
            for term, n in counts.items():
                docs, tfs = postings.setdefault(term, ([], []))
                docs.append(pos)
                tfs.append(n)
        self.postings = {
            t: (np.asarray(d, dtype=np.int64), np.asarray(f, dtype=np.float64))
            for t, (d, f) in postings.items()
        }


def bm25_scores(
    query: str, parts: Sequence[tuple[LexicalIndex, np.ndarray | None]]
) -> list[np.ndarray]:
    """BM25 of ``query`` over the union of the indexes' kept documents (``mask`` None: all),
    one score array per index (0 for a dropped document or one without a query term)."""
    q = list(dict.fromkeys(terms(query)))
    masks = [np.ones(ix.size, dtype=bool) if m is None else m for ix, m in parts]
    n_docs = sum(int(m.sum()) for m in masks)
    total_len = sum(float(ix.lengths[m].sum()) for (ix, _), m in zip(parts, masks, strict=True))
    out = [np.zeros(ix.size, dtype=np.float64) for ix, _ in parts]
    if not q or n_docs == 0:
        return out
    avg = total_len / n_docs or 1.0
    for term in q:
        kept = []
        for (ix, _), m in zip(parts, masks, strict=True):
            docs, tfs = ix.postings.get(term, (np.zeros(0, np.int64), np.zeros(0)))
            keep = m[docs]
            kept.append((docs[keep], tfs[keep]))
        df = sum(len(d) for d, _ in kept)
        if not df:
            continue
        idf = np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
        for (ix, _), (docs, tfs), scores in zip(parts, kept, out, strict=True):
            norm = K1 * (1.0 - B + B * ix.lengths[docs] / avg)
            scores[docs] += idf * tfs * (K1 + 1.0) / (tfs + norm)
    return out
