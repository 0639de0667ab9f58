"""Compare MiniLMEmbedder (numpy or ONNX Runtime) with sentence-transformers on ~50 sentences.

Needs an environment with torch and sentence-transformers (not project dependencies), e.g.::

    python3 -m venv /tmp/stvenv
    /tmp/stvenv/bin/pip install torch==2.13.0
    /tmp/stvenv/bin/pip install sentence-transformers numpy tokenizers safetensors
    /tmp/stvenv/bin/pip install onnxruntime onnx  # for --backend onnxruntime
    /tmp/stvenv/bin/python scripts/check_minilm_parity.py [--model-dir DIR] [--backend B]

Both sides load the same local model folder (see ``memory_pipelines.embeddings.model_dir``);
nothing is downloaded. Prints the min / mean cosine and the max absolute difference, and
exits 1 when the min cosine is below ``--threshold`` (default 0.9999).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))
# Import memory_pipelines.embeddings without running the package __init__, which pulls in
# project dependencies (pandas, lancedb, ...) that this reference environment lacks.
_pkg = types.ModuleType("memory_pipelines")
_pkg.__path__ = [str(_ROOT / "memory_pipelines")]
sys.modules.setdefault("memory_pipelines", _pkg)

import numpy as np  # noqa: E402

from memory_pipelines.embeddings import fetch, minilm  # noqa: E402

SENTENCES = [
    "User prefers tea over coffee.",
    "The user prefers tea over coffee",
    "Always run the test suite before merging a pull request.",
    "Deployments to production happen on Tuesdays and Thursdays only.",
    "The staging database is reset every night at 02:00 UTC.",
    "Alice is the owner of the billing service.",
    "Use ruff for linting and formatting Python code.",
    "The API rate limit is 600 requests per minute per key.",
    "Customer complaints about latency spiked after the 3.2 release.",
    "Never store secrets in the git repository; use the vault.",
    "The quarterly report is due on the first Monday of April.",
    "Bob likes his meetings short and with a written agenda.",
    "Our on-call rotation changes every Wednesday at noon.",
    "The cat sat on the mat.",
    "Quantum computers use qubits that can be in superposition.",
    "The recipe needs two eggs, flour, sugar and a pinch of salt.",
    "Paris is the capital of France.",
    "She finished the marathon in under four hours.",
    "The migration to Postgres 16 is blocked on the extension upgrade.",
    "Prefer small, focused commits with descriptive messages.",
    "Logs older than 30 days are archived to cold storage.",
    "The frontend is written in TypeScript with React.",
    "He asked me to remind him about the dentist appointment.",
    "Use UTC timestamps everywhere in the backend.",
    "The model was fine-tuned on 10k labelled support tickets.",
    "Memory notes must be scoped to one agent unless marked global.",
    "Don't call the payments API from the browser.",
    "Weekly sync moved from Monday to Friday afternoon.",
    "The build cache lives in an S3 bucket in eu-west-1.",
    "Translate error messages into German and French as well.",
    "¿Dónde está la biblioteca?",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都です。",
    "emoji test 🚀🔥 with symbols #42 @user $100 & 50% off!",
    "URLs like https://example.com/path?q=1 should be tokenised.",
    "snake_case_identifiers and CamelCaseNames and kebab-case-words",
    "x",
    "",
    "   ",
    "A",
    "OK.",
    "The the the the the the the the the the",
    "def embed(texts: list[str]) -> np.ndarray: return model(texts)",
    "SELECT id, name FROM users WHERE created_at > now() - interval '7 days';",
    "Numbers: 3.14159, 2.71828, 1.41421, 1e-12, 0xFF, 1,000,000.",
    "She said, \"I'll be there at 5 o'clock,\" but arrived at six.",
    "Meeting notes: discussed roadmap; agreed on Q3 priorities; follow up next week.",
    "Long note: " + " ".join(f"item {i} is important because reason {i % 7}" for i in range(80)),
    "Medium note: " + " ".join(["the agent should remember user preferences"] * 12),
    "Very long: " + "lorem ipsum dolor sit amet " * 200,
]


def main() -> int:
    """Run the comparison and print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--threshold", type=float, default=0.9999)
    parser.add_argument("--backend", choices=["numpy", "onnxruntime"], default="numpy")
    args = parser.parse_args()
    folder = args.model_dir or fetch.model_dir()

    ours = minilm.MiniLMEmbedder(folder, backend=args.backend)
    if ours.backend != args.backend:
        parser.error(f"backend {args.backend} is not installed here")
    t0 = time.perf_counter()
    a = ours.embed(SENTENCES)
    t_ours = time.perf_counter() - t0
    st = minilm._load_sentence_transformer(folder, 256)
    t0 = time.perf_counter()
    b = st.encode(SENTENCES, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
    t_st = time.perf_counter() - t0
    b = b.astype(np.float32)

    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    worst = int(np.argmin(cos))
    tok = st.tokenizer
    print(f"model dir        : {folder}")
    print(f"sentences        : {len(SENTENCES)}")
    print(
        f"longest (tokens) : {max(len(tok(s)['input_ids']) for s in SENTENCES)} (truncated to 256)"
    )
    print(f"min cosine       : {cos.min():.9f}  (sentence {worst}: {SENTENCES[worst][:50]!r})")
    print(f"mean cosine      : {cos.mean():.9f}")
    print(f"max |diff|       : {np.abs(a - b).max():.3e}")
    print(f"time {args.backend} / st : {t_ours:.3f}s / {t_st:.3f}s")
    return 0 if cos.min() >= args.threshold else 1


if __name__ == "__main__":
    raise SystemExit(main())
