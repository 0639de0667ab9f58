"""Counting the tokens the proxy adds to a turn, and fitting an injection to a budget.

:func:`token_counter` picks the best counter available offline, never downloading:
tiktoken's ``o200k_base`` (the GPT-4o family's) when tiktoken is installed and the
encoding's file is on this machine (tiktoken's cache, or the copy litellm ships); else
the WordPiece tokenizer of the offline MiniLM model; else an estimate of one token per
four characters. Its ``name`` says which one counted.

:func:`fit_injection` leaves out the lowest-ranked examples, then the memory policy
block, then the lowest-ranked notes of an injection, rendering the rest with the
service's own renderer, until the system message fits.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memory_pipelines.embeddings.fetch import model_dir
from memory_pipelines.injection import render_examples, render_message, render_notes

_TIKTOKEN_BLOB = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
_TIKTOKEN_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# o200k_base's split pattern and special tokens, as tiktoken_ext.openai_public defines them
# (that constructor would fetch the file by URL; the proxy reads a local copy instead)
_O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
_O200K_SPECIAL = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}


@dataclass(frozen=True)
class TokenCounter:
    """``count(text) -> tokens``, and the name of what counts."""

    name: str
    count: Callable[[str], int]


def estimate(text: str) -> int:
    """One token per four characters, rounded up (the usual rule of thumb for English)."""
    return math.ceil(len(text) / 4)


def _tiktoken_file() -> Path | None:
    """A local copy of o200k_base's file: tiktoken's cache, or the one litellm ships."""
    folders = [os.environ.get("TIKTOKEN_CACHE_DIR"), os.environ.get("DATA_GYM_CACHE_DIR"),
               str(Path(tempfile.gettempdir()) / "data-gym-cache")]
    spec = importlib.util.find_spec("litellm")  # located, not imported
    for root in (spec.submodule_search_locations or []) if spec else []:
        folders.append(str(Path(root) / "litellm_core_utils" / "tokenizers"))
    name = hashlib.sha1(_TIKTOKEN_BLOB.encode()).hexdigest()
    for folder in folders:
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def _tiktoken() -> TokenCounter | None:
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError:
        return None
    path = _tiktoken_file()
    if path is None:
        return None
    try:
        enc = tiktoken.Encoding(
            "o200k_base", pat_str=_O200K_PATTERN, special_tokens=_O200K_SPECIAL,
            mergeable_ranks=load_tiktoken_bpe(str(path), expected_hash=_TIKTOKEN_SHA256),
        )
    except Exception:  # noqa: BLE001 - a damaged file falls back to the next counter
        return None
    return TokenCounter("tiktoken o200k_base", lambda text: len(enc.encode(text, disallowed_special=())))


def _minilm() -> TokenCounter | None:
    try:
        from tokenizers import Tokenizer

        path = model_dir() / "tokenizer.json"
        if not path.is_file():
            return None
        tok = Tokenizer.from_file(str(path))
    except Exception:  # noqa: BLE001 - not installed or not fetched: the next counter
        return None
    tok.no_truncation()
    tok.no_padding()
    return TokenCounter("MiniLM WordPiece", lambda text: len(tok.encode(text, add_special_tokens=False).ids))


_COUNTER: TokenCounter | None = None
_LOCK = threading.Lock()


def token_counter() -> TokenCounter:
    """The best counter available offline (built once per process)."""
    global _COUNTER
    with _LOCK:
        if _COUNTER is None:
            _COUNTER = _tiktoken() or _minilm() or TokenCounter("estimate (4 characters per token)", estimate)
        return _COUNTER


def fit_injection(
    message: str,
    notes: Sequence[Any],
    examples: Sequence[Any],
    *,
    budget: int,
    others: int,
    count: Callable[[str], int],
    include_memory_policy: bool,
) -> tuple[str, int, int]:
    """``(message, notes kept, examples kept)``: the injection ``message`` of these ranked
    ``notes`` and ``examples``, cut until ``count(message) + others`` is within ``budget``
    (``others``: the tokens of what else the system message holds): the lowest-ranked
    examples go first, then the memory policy block (about 140 tokens, worth several
    notes), then the lowest-ranked notes. A message the renderer would not produce from
    the items is kept whole or dropped whole."""
    if count(message) + others <= budget:
        return message, len(notes), len(examples)

    def render(n: int, e: int, policy: bool) -> str:
        return render_message(
            render_notes(list(notes[:n]), include_memory_policy=policy),
            render_examples(list(examples[:e])),
        )

    n, e, policy = len(notes), len(examples), include_memory_policy
    if render(n, e, policy) != message:
        return "", 0, 0
    while n or e:
        if e:
            e -= 1
        elif policy:
            policy = False
        else:
            n -= 1
        text = render(n, e, policy)
        if count(text) + others <= budget:
            return text, n, e
    return "", 0, 0
