"""all-MiniLM-L6-v2, torch-free: the default, offline embedder.

WordPiece via ``tokenizers``, weights via ``safetensors``, a 6-layer BERT in float32, mean
pooling and L2 norm. The encoder runs on ONNX Runtime when it is installed
(:mod:`memory_pipelines.embeddings.minilm_onnx`), else as the numpy forward pass below.
The model files come from :mod:`memory_pipelines.embeddings.fetch`.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from memory_pipelines.embeddings import minilm_onnx
from memory_pipelines.embeddings.fetch import (
    MINILM_MODEL_ID,
    MODEL_FILES,
    SETUP_HINT,
    _has_model_files,
    model_dir,
)
from memory_pipelines.embeddings.protocol import l2_normalize
from memory_pipelines.errors import (
    ConfigError,
    EmbeddingError,
    EmbeddingModelMissingError,
    ValidationError,
)

#: Who can run the encoder (:attr:`MiniLMEmbedder.backend`).
BACKENDS = ("onnxruntime", "numpy", "sentence-transformers")

#: Inputs of at most this many tokens in total are embedded on one BLAS thread.
SMALL_INPUT_TOKENS = 2048

_CONTROLLER: ThreadpoolController | None = None
_CONTROLLER_LOCK = threading.Lock()
_HELPERS: ThreadPoolExecutor | None = None
_HELPERS_SIZE = 0


def _cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _default_threads() -> int:
    """``$MEMORY_EMBEDDER_THREADS`` when set (several embedding processes on a small
    machine: 1 each avoids oversubscribing the cores), else the process's cores, at most 4."""
    raw = os.environ.get("MEMORY_EMBEDDER_THREADS", "").strip()
    if not raw:
        return min(_cores(), 4)
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 256:
        raise ConfigError(
            f"MEMORY_EMBEDDER_THREADS must be a whole number from 1 to 256, got {raw!r}"
        )
    return value


def _helpers(n: int) -> ThreadPoolExecutor:
    """The process's pool of ``n`` (or more) threads that run parts of a small input."""
    global _HELPERS, _HELPERS_SIZE
    if _HELPERS is None or _HELPERS_SIZE < n:
        with _CONTROLLER_LOCK:
            if _HELPERS is None or _HELPERS_SIZE < n:
                if _HELPERS is not None:
                    _HELPERS.shutdown(wait=False)  # its submitted parts still run
                _HELPERS = ThreadPoolExecutor(max_workers=n, thread_name_prefix="minilm-part")
                _HELPERS_SIZE = n
    return _HELPERS


def _one_blas_thread() -> Any:
    """A context limiting BLAS to one thread. The loaded libraries are looked up once per
    process (``threadpool_limits`` scans them on every call: ~2 ms in a process that has
    LanceDB and pyarrow loaded, a sixth of a one-text embedding)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        with _CONTROLLER_LOCK:
            if _CONTROLLER is None:
                _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


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
        """Run the encoder on padded ``ids`` (B, L) and return mean-pooled (B, hidden).

        Only attention needs the padded (B, L) layout; every row-wise step (the
        projections, the feed-forward block, the layer norms: most of the arithmetic) runs
        on the real tokens alone, packed, so padding costs nothing there."""
        b, seq = ids.shape
        h, d = self.heads, self.hidden // self.heads
        real = np.flatnonzero(mask.reshape(-1) > 0)  # row-major: each text's tokens in order
        n = len(real)
        x = self.word[ids.reshape(-1)[real]] + self.pos[real % seq] + self.type0
        x = _layer_norm(x, *self.emb_ln)
        bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(np.float32)
        scale = np.float32(1.0 / np.sqrt(d))
        padded = np.zeros((b * seq, 3 * self.hidden), dtype=np.float32)
        for lw in self.layers:
            qkv = x @ lw["qkv_w"]
            qkv += lw["qkv_b"]
            padded[real] = qkv
            full = padded.reshape(b, seq, 3, h, d).transpose(2, 0, 3, 1, 4)  # (3, B, H, L, d)
            scores = np.matmul(full[0], full[1].transpose(0, 1, 3, 2))
            scores *= scale
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            ctx = np.matmul(scores, full[2]).transpose(0, 2, 1, 3).reshape(b * seq, self.hidden)
            ctx = ctx[real]
            # The rest is row-wise: run it in row chunks that stay in the CPU cache.
            for r in range(0, n, _ROW_CHUNK):
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
        counts = mask.sum(axis=1).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        sums = np.add.reduceat(x, starts, axis=0) if n else np.zeros((b, self.hidden), np.float32)
        return sums / np.maximum(counts[:, None].astype(np.float32), np.float32(1e-9))


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) run offline; the default embedder.

    WordPiece via ``tokenizers`` (``tokenizer.json``), weights via ``safetensors``, a
    6-layer BERT in float32, mean pooling over the attention mask, L2 norm, max sequence
    length 256 (as sentence-transformers). Texts are sorted by token length and run in
    padded batches of at most ``batch_size`` rows and ``max_batch_tokens`` padded tokens.
    Weights load lazily (thread-safe) on the first ``embed``; construction is cheap.

    ``backend`` (default ``$MEMORY_EMBEDDER_BACKEND``, else ``onnxruntime`` when ONNX
    Runtime is installed, else ``numpy``) picks who runs the encoder, with the same
    float32 vectors to rounding:

    * ``onnxruntime``: ONNX Runtime's fused kernels
      (:mod:`memory_pipelines.embeddings.minilm_onnx`) on ``threads`` intra-op threads
      (default: ``$MEMORY_EMBEDDER_THREADS``, else the process's cores, at most 4);
    * ``numpy``: the forward pass of this module. An input small enough for one BLAS
      thread (a run's writes, a few queries) is split by text into up to ``threads``
      parts that run at once, each on one BLAS thread; a part whose helper thread is busy
      with another call runs in the calling thread instead. Larger inputs use BLAS's own
      threads;
    * ``sentence-transformers`` (when importable): the same local files through
      sentence-transformers.
    """

    model_id: str = MINILM_MODEL_ID
    dim: int = 384

    def __init__(
        self,
        path: Path | str | None = None,
        batch_size: int = 64,
        max_seq_length: int = 256,
        max_batch_tokens: int = 4096,
        threads: int | None = None,
        backend: str | None = None,
    ) -> None:
        """Remember where the model lives (default :func:`model_dir`); load nothing yet."""
        if threads is not None and int(threads) < 1:
            raise ValidationError(f"threads must be at least 1, got {threads!r}")
        if backend is not None and backend not in BACKENDS:
            raise ValidationError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
        self._backend = backend
        self._path = Path(path) if path is not None else None
        self.threads = int(threads) if threads is not None else _default_threads()
        self.batch_size = int(batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_seq_length = int(max_seq_length)
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._weights: _BertWeights | None = None
        self._onnx: Any = None
        self._st: Any = None

    @property
    def path(self) -> Path:
        """The model folder this embedder loads from."""
        return self._path if self._path is not None else model_dir()

    @property
    def configured_path(self) -> Path | None:
        """The folder given to the constructor; None for the default (:func:`model_dir`)."""
        return self._path

    @property
    def loaded(self) -> bool:
        """Whether the tokenizer and weights are in memory (the files are then not needed)."""
        return self._weights is not None or self._onnx is not None or self._st is not None

    @property
    def backend(self) -> str:
        """Who runs the encoder: the constructor's ``backend``, else
        ``$MEMORY_EMBEDDER_BACKEND``, else ``onnxruntime`` when installed, else ``numpy``.
        A requested backend that is not installed falls back to ``numpy``; an unknown name
        in the environment is a ``ConfigError``."""
        wanted = self._backend or os.environ.get("MEMORY_EMBEDDER_BACKEND", "").strip().lower()
        if wanted and wanted not in BACKENDS:
            raise ConfigError(
                f"MEMORY_EMBEDDER_BACKEND must be one of {list(BACKENDS)} or empty, got {wanted!r}"
            )
        if wanted == "sentence-transformers" and importlib.util.find_spec("sentence_transformers"):
            return "sentence-transformers"
        if wanted in ("", "onnxruntime") and minilm_onnx.available():
            return "onnxruntime"
        return "numpy"

    def load(self) -> None:
        """Load tokenizer and weights now (idempotent, thread-safe)."""
        if self._weights is not None or self._onnx is not None or self._st is not None:
            return
        with self._lock:
            if self._weights is not None or self._onnx is not None or self._st is not None:
                return
            folder, backend = self.path, self.backend
            if not _has_model_files(folder):
                raise EmbeddingModelMissingError(
                    f"MiniLM model files {list(MODEL_FILES)} not found in {folder}; {SETUP_HINT} "
                    "or point MEMORY_MODEL_DIR at a folder holding them."
                )
            try:
                if backend == "sentence-transformers":
                    self._st = _load_sentence_transformer(folder, self.max_seq_length)
                    return
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
                tok.no_padding()
                tok.enable_truncation(max_length=self.max_seq_length)
                if backend == "onnxruntime":
                    encoder: Any = minilm_onnx.OnnxEncoder(_BertWeights(folder), self.threads)
                else:
                    encoder = _BertWeights(folder)
            except EmbeddingError:
                raise
            except Exception as e:
                raise EmbeddingError(f"cannot load MiniLM from {folder}: {e}") from e
            self._tokenizer = tok
            if isinstance(encoder, _BertWeights):
                self._weights = encoder
            else:
                self._onnx = encoder

    def _load_numpy_after_fork(self) -> None:
        """In a process forked after the ONNX Runtime session was made, load the numpy
        pass (the same vectors): the parent's session hangs in a forked child."""
        if self._weights is None:
            with self._lock:
                if self._weights is None:
                    self._weights = _BertWeights(self.path)

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
        encodings = self._tokenizer.encode_batch(texts)
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if self._onnx is not None and self._onnx.pid == os.getpid():
            # ONNX Runtime spreads each batch over its own threads
            self._forward_batches(encodings, lengths, order, out, self._onnx)
            return l2_normalize(out)
        if self._onnx is not None:
            self._load_numpy_after_fork()
        # Small inputs (a query, one note) run faster on one BLAS thread: thread start-up
        # and contention cost more than the matmuls (66-166 ms -> 12-18 ms per query).
        # Several small texts run as parts on several threads instead (5 notes of ~20
        # tokens: 46 -> 38 ms on two idle cores; 40 of them: 275 -> 150 ms).
        if int(lengths.sum()) > SMALL_INPUT_TOKENS:
            self._forward_batches(encodings, lengths, order, out)
            return l2_normalize(out)
        parts = [order[k :: self.threads] for k in range(min(self.threads, len(order)))]
        with _one_blas_thread():
            helped: list[Future[None]] = [
                _helpers(self.threads - 1).submit(self._forward_batches, encodings, lengths, p, out)
                for p in parts[1:]
            ]
            self._forward_batches(encodings, lengths, parts[0], out)
            for part, job in zip(parts[1:], helped, strict=True):
                if job.cancel():  # its helper is busy with another call: run it here
                    self._forward_batches(encodings, lengths, part, out)
                else:
                    job.result()
        return l2_normalize(out)

    def _forward_batches(
        self,
        encodings: list[Any],
        lengths: np.ndarray,
        order: np.ndarray,
        out: np.ndarray,
        encoder: Any = None,
    ) -> None:
        """Embed the texts ``order`` names into ``out`` in batches, with ``encoder`` (the
        ONNX Runtime session), else the numpy pass."""
        encoder = encoder if encoder is not None else self._weights
        assert encoder is not None
        for idx in self._batches(order, lengths):
            seq = int(lengths[idx].max())
            ids = np.zeros((len(idx), seq), dtype=np.int64)
            mask = np.zeros((len(idx), seq), dtype=np.int64)
            for row, i in enumerate(idx):
                n = lengths[i]
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            out[idx] = encoder.forward(ids, mask)


def _load_sentence_transformer(folder: Path, max_seq_length: int) -> Any:
    """Build the reference sentence-transformers pipeline from local files only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(str(folder), max_seq_length=max_seq_length)
    pooling = models.Pooling(MiniLMEmbedder.dim, "mean")
    return SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
