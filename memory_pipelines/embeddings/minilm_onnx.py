"""all-MiniLM-L6-v2 run by ONNX Runtime: the same float32 encoder as the numpy pass, faster.

The graph is built in memory from the same ``model.safetensors`` at load (about 1 s; no
file is written, nothing is downloaded). It uses ONNX Runtime's fused CPU kernels for a
BERT encoder (``com.microsoft`` ops): ``EmbedLayerNormalization``, ``Attention``,
``SkipLayerNormalization`` and ``FastGelu``, the tanh approximation of GELU that the numpy
pass also uses, so both give the same vectors to float32 rounding (max |Δ| ~1e-7 on unit
vectors). It stays float32: int8 weights were 2x faster again but moved vectors to a
cosine of 0.96 from float32, which changes what injection retrieves.

On two cores this halves a one-text embedding (a query, one note: 17.7 -> 7.9 ms) and
takes a run's 5 texts from ~34 to ~26 ms (``README``, "The offline embedder").
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

#: LayerNorm epsilon of BERT, as the numpy pass's ``_layer_norm`` uses it.
_EPS = 1e-12
_MS = "com.microsoft"


def available() -> bool:
    """Whether ONNX Runtime and the ``onnx`` graph builder can be imported."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))


class _Graph:
    """An ONNX graph under construction: its initializers and nodes, in order."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self._helper, self._numpy_helper = helper, numpy_helper
        self.inits: list[Any] = []
        self.nodes: list[Any] = []

    def const(self, name: str, arr: np.ndarray) -> str:
        arr = np.ascontiguousarray(arr, dtype=arr.dtype if arr.dtype == np.int64 else np.float32)
        self.inits.append(self._numpy_helper.from_array(arr, name))
        return name

    def node(
        self, op: str, inputs: list[str], output: str, fused: bool = False, **attrs: Any
    ) -> str:
        self.nodes.append(
            self._helper.make_node(op, inputs, [output], domain=_MS if fused else "", **attrs)
        )
        return output

    def dense_add_norm(
        self, x: str, residual: str, lw: dict, key: str, norm: str, name: str
    ) -> str:
        """``LayerNorm(x @ W + b + residual)``: a MatMul and one fused
        ``SkipLayerNormalization`` (W, b = ``lw[key + "_w"]``, ``lw[key + "_b"]``)."""
        out = self.node("MatMul", [x, self.const(name + "_w", lw[key + "_w"])], name)
        return self.node(
            "SkipLayerNormalization",
            [
                out,
                residual,
                self.const(name + "_ln_g", lw[norm + "_g"]),
                self.const(name + "_ln_b", lw[norm + "_b"]),
                self.const(name + "_b", lw[key + "_b"]),
            ],
            name + "_norm",
            fused=True,
            epsilon=_EPS,
        )

    def embeddings(self, weights: Any) -> str:
        """Token and position embeddings with their LayerNorm, and the attention mask
        index (one fused ``EmbedLayerNormalization``)."""
        from onnx import TensorProto

        ids = self.node("Cast", ["input_ids"], "ids32", to=TensorProto.INT32)
        mask = self.node("Cast", ["attention_mask"], "mask32", to=TensorProto.INT32)
        self.nodes.append(
            self._helper.make_node(
                "EmbedLayerNormalization",
                [
                    ids,
                    "",  # segment ids: none, so token type 0 for every token
                    self.const("word", weights.word),
                    self.const("position", weights.pos),
                    self.const("segment", weights.type0[None, :]),
                    self.const("emb_ln_g", weights.emb_ln[0]),
                    self.const("emb_ln_b", weights.emb_ln[1]),
                    mask,
                ],
                ["x0", "mask_index"],
                domain=_MS,
                epsilon=_EPS,
            )
        )
        return "x0"

    def layer(self, i: int, x: str, lw: dict, heads: int) -> str:
        """One encoder layer: fused attention, add & norm, FastGelu feed-forward, add & norm."""
        ctx = self.node(
            "Attention",
            [
                x,
                self.const(f"qkv_w{i}", lw["qkv_w"]),
                self.const(f"qkv_b{i}", lw["qkv_b"]),
                "mask_index",
            ],
            f"ctx{i}",
            fused=True,
            num_heads=heads,
        )
        h1 = self.dense_add_norm(ctx, x, lw, "o", "ln1", f"attn{i}")
        inter = self.node("MatMul", [h1, self.const(f"i_w{i}", lw["i_w"])], f"inter{i}")
        gelu = self.node(
            "FastGelu", [inter, self.const(f"i_b{i}", lw["i_b"])], f"gelu{i}", fused=True
        )
        return self.dense_add_norm(gelu, h1, lw, "out", "ln2", f"out{i}")

    def mean_pool(self, x: str) -> str:
        """The mean of ``x`` over the real tokens (output ``pooled``)."""
        from onnx import TensorProto

        maskf = self.node("Cast", ["attention_mask"], "maskf", to=TensorProto.FLOAT)
        mask3 = self.node(
            "Unsqueeze", [maskf, self.const("axis2", np.array([2], np.int64))], "mask3"
        )
        masked = self.node("Mul", [x, mask3], "masked")
        sums = self.node(
            "ReduceSum", [masked, self.const("axis1", np.array([1], np.int64))], "sums", keepdims=0
        )
        counts = self.node("ReduceSum", [maskf, "axis1"], "counts", keepdims=1)
        floor = self.node(
            "Max", [counts, self.const("floor", np.array(1e-9, np.float32))], "floor_counts"
        )
        return self.node("Div", [sums, floor], "pooled")


def build_model(weights: Any) -> bytes:
    """The serialized ONNX model of the encoder: (ids, mask) -> mean-pooled.

    ``weights`` is the numpy pass's ``_BertWeights`` (:mod:`memory_pipelines.embeddings.minilm`:
    the checkpoint read, q/k/v fused and the projections pre-transposed), so one place
    knows the checkpoint's layout. Inputs ``input_ids`` and ``attention_mask`` (int64,
    (B, L), right-padded); output ``pooled`` (float32, (B, hidden)), the mean of the last
    layer over the real tokens, not yet L2-normalised."""
    from onnx import TensorProto, helper

    g = _Graph()
    x = g.embeddings(weights)
    for i, lw in enumerate(weights.layers):
        x = g.layer(i, x, lw, weights.heads)
    g.mean_pool(x)
    graph = helper.make_graph(
        g.nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", weights.hidden])],
        initializer=g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(_MS, 1)]
    )
    model.ir_version = 8
    return bytes(model.SerializeToString())


class OnnxEncoder:
    """An ONNX Runtime session of :func:`build_model`, on ``threads`` intra-op threads.

    ``session.run`` releases the GIL and is safe from several threads at once. The session
    belongs to the process that made it (``pid``): ONNX Runtime is not fork-safe, and a
    forked child hangs in ``run`` and even in making a new session, so a child must not
    use it (:class:`~memory_pipelines.embeddings.minilm.MiniLMEmbedder` runs the numpy
    pass there)."""

    def __init__(self, weights: Any, threads: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3  # errors only: no notices on stderr
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle intra-op threads sleep instead of spinning: on a small machine a spinning
        # pool takes the cores the store's and the server's threads need between calls.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.pid = os.getpid()
        self.session = ort.InferenceSession(
            build_model(weights), opts, providers=["CPUExecutionProvider"]
        )

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Mean-pooled (B, hidden) float32 for right-padded ``ids`` and ``mask`` (B, L)."""
        feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}
        return np.asarray(self.session.run(["pooled"], feeds)[0], dtype=np.float32)
