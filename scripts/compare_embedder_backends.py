"""Check that two MiniLM backends inject the same LoCoMo notes, in the same order.

Loads the LoCoMo file into one fresh memory home per backend (each embedding every note
itself: no embedding cache is shared), runs every question with evidence through
``svc.inject`` and compares the injected note ids question by question::

    .venv/bin/python scripts/compare_embedder_backends.py \\
        --data ../shared/data/locomo/locomo_dev.json [--backends numpy onnxruntime] [--k 10]

Prints how many questions got the same ids in the same order, the same set in another
order, or other notes, the largest difference between the two backends' note vectors,
and the inject p50 / p95 of each; exits 1 when any question differs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

from memory_pipelines.bench.locomo_data import (  # noqa: E402
    AGENT_ID,
    load_conversations,
    turn_notes,
)
from memory_pipelines.embeddings import MiniLMEmbedder  # noqa: E402
from memory_pipelines.notes import RunContext  # noqa: E402
from memory_pipelines.service import MemoryService  # noqa: E402


def run(data: Path, backend: str, k: int, home: Path) -> tuple[dict, np.ndarray, list[float]]:
    """Inject every question with ``backend``: ({(sample, question): ids}, vectors, ms)."""
    embedder = MiniLMEmbedder(backend=backend)
    if embedder.backend != backend:
        raise SystemExit(f"backend {backend} is not installed here")
    convs = load_conversations(data)
    svc = MemoryService.open(home, embedder=embedder)
    answers: dict[tuple[str, int], list[str]] = {}
    latencies: list[float] = []
    vectors = []
    try:
        svc.configure_agent(
            AGENT_ID,
            max_notes_to_inject=k,
            note_injection_strategy="Relevant",
            inject_notes=True,
            inject_examples=False,
        )
        for conv in convs:
            notes = turn_notes(conv)
            vectors.append(embedder.embed([n.note for n in notes]))
            for start in range(0, len(notes), 512):
                svc.save_notes(notes[start : start + 512])
        svc.store.notes.ensure_fts()
        for conv in convs:
            ctx = RunContext(agent_id=AGENT_ID, user_id=conv.sample_id)
            for i, q in enumerate(conv.questions):
                if not q.evidence:
                    continue
                t0 = time.perf_counter()
                got = svc.inject(ctx, q.text)
                latencies.append((time.perf_counter() - t0) * 1000)
                answers[(conv.sample_id, i)] = [n.id for n in got.notes]
    finally:
        svc.close()
    return answers, np.concatenate(vectors), latencies


def main() -> int:
    """Compare the backends and print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--backends", nargs=2, default=["numpy", "onnxruntime"])
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="backends-") as tmp:
        for name in args.backends:
            t0 = time.perf_counter()
            results[name] = run(args.data, name, args.k, Path(tmp) / name)
            print(f"{name}: loaded and queried in {time.perf_counter() - t0:.0f} s")
    (a, va, la), (b, vb, lb) = (results[n] for n in args.backends)
    same = sum(a[q] == b[q] for q in a)
    same_set = sum(a[q] != b[q] and set(a[q]) == set(b[q]) for q in a)
    print(f"questions                 : {len(a)}")
    print(f"same ids, same order      : {same}")
    print(f"same ids, another order   : {same_set}")
    print(f"other ids                 : {len(a) - same - same_set}")
    print(f"note vectors max |diff|   : {float(np.abs(va - vb).max()):.2e}")
    for name, lat in zip(args.backends, (la, lb), strict=True):
        p95 = sorted(lat)[int(0.95 * (len(lat) - 1))]
        print(f"inject p50 / p95 {name:<9}: {statistics.median(lat):.1f} / {p95:.1f} ms")
    return 0 if same == len(a) else 1


if __name__ == "__main__":
    raise SystemExit(main())
