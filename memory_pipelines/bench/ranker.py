"""The learned ranker of ``inject``, fitted and measured by nested leave-one-conversation-out
on the LoCoMo format and the chat view of a LoCoMo-format file.

``memory-pipelines bench ranker --data FILE [--k 5 10] [--embedding-cache PATH]
[--embedder minilm|hash] [--fit PATH]``

Both views are loaded as ``bench locomo`` loads them and every question is asked of
``inject``; each question's fused candidates (before the learned ranker and the coverage
step) are recorded with their :data:`~memory_pipelines.injection.learned.FEATURES`, a
candidate being positive when it is one of the question's evidence turns. Nested
protocol: each conversation is held out once (outer fold, in both views); a ranker is
fitted on the other conversations' questions of both views for every setting of the grid
(strength x the coverage step's ``mmr_lambda``), each setting is scored by inner
leave-one-out folds over them (mean recall_any at the first k of the two views), the best
is fitted on all of them and only then scored on the held-out conversation. Beside it, the
fused order with the default coverage step on the same candidates: the ranking without
the learned ranker. ``--fit PATH`` writes a ranker fitted on every conversation, with the
setting chosen by leave-one-out over them all (the shipped ``ranker.json`` is this).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from memory_pipelines.bench.locomo import record_questions
from memory_pipelines.bench.locomo_data import add_data_arguments
from memory_pipelines.bench.ranker_cv import (
    MMR_GRID,
    STRENGTHS,
    VIEWS,
    Pool,
    by_sample,
    choose,
    fit_ranker,
    nested_ranker,
    pools_of,
    ranker_table,
)
from memory_pipelines.config import InjectConfig
from memory_pipelines.embeddings.cache import CachedEmbedder
from memory_pipelines.embeddings.hashing import HashEmbedder
from memory_pipelines.embeddings.minilm import MiniLMEmbedder
from memory_pipelines.embeddings.protocol import Embedder


def record_views(
    data: Path | str,
    embedder: Embedder,
    limit_conversations: int | None = None,
    progress_bar: bool | None = False,
) -> dict[str, list[Pool]]:
    """Each view's recorded questions as pools (:func:`record_questions`)."""
    return {
        view: pools_of(
            record_questions(data, view, embedder, limit_conversations, None, progress_bar)
        )
        for view in VIEWS
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench ranker", description=__doc__.split("\n")[0]
    )
    add_data_arguments(parser)
    parser.add_argument(
        "--fit",
        default=None,
        metavar="PATH",
        help="also write a ranker fitted on every conversation (the setting chosen by "
        "leave-one-out over them all) to PATH",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    ks = sorted(set(args.k))
    if ks[0] < 1:
        parser.error("--k takes positive numbers")
    if args.fit and not Path(args.fit).resolve().parent.is_dir():
        parser.error(f"--fit: no folder {str(Path(args.fit).resolve().parent)!r} to write into")
    if not Path(args.data).is_file():
        parser.error(f"--data: no file {args.data!r}")
    t0 = time.perf_counter()
    inner: Embedder = HashEmbedder(64) if args.embedder == "hash" else MiniLMEmbedder()
    embedder = CachedEmbedder(inner, args.embedding_cache) if args.embedding_cache else inner
    views = record_views(args.data, embedder, args.limit_conversations)
    n = {name: len(p) for name, p in views.items()}
    print(f"learned ranker, nested leave-one-conversation-out; questions per view: {n}")
    print(
        f"grid: strength {', '.join(map(str, STRENGTHS))} x mmr_lambda "
        f"{', '.join(map(str, MMR_GRID))}; fused order with mmr_lambda "
        f"{InjectConfig().mmr_lambda}"
    )
    folds = nested_ranker(views, embedder.model_id, ks)
    print(ranker_table(folds, ks))
    if args.fit:
        split = {name: by_sample(p) for name, p in views.items()}
        samples = sorted({s for v in split.values() for s in v})
        (strength, mmr), mean = choose(split, samples, embedder.model_id, ks[0])
        meta = {
            "fitted_on": samples,
            "views": list(VIEWS),
            "strength": strength,
            "leave_one_out_recall_any": round(mean, 4),
            "k": ks[0],
        }
        pools = [p for v in views.values() for p in v]
        fitted = replace(fit_ranker(pools, strength, embedder.model_id, mmr), meta=meta)
        Path(args.fit).write_text(fitted.to_json() + "\n", encoding="utf-8")
        print(f"fitted: {json.dumps(meta)}, mmr_lambda {mmr} -> {args.fit}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
