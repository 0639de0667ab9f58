"""The proxy's token counter: a real tokenizer found offline, never a download."""

from __future__ import annotations

import pytest

from memory_pipelines.apps.proxy import tokens


def test_tiktoken_o200k_is_read_from_a_local_copy():
    if tokens._tiktoken_file() is None:
        pytest.skip("no local copy of o200k_base (litellm ships one)")
    counter = tokens._tiktoken()
    assert counter is not None and counter.name == "tiktoken o200k_base"
    # o200k_base's own counts: "Hello" " world" "," " User" " prefers" " metric" " units" "."
    assert counter.count("Hello world, User prefers metric units.") == 8
    assert counter.count("<|endoftext|>") > 1  # special tokens are counted as text


def test_fallbacks_when_no_encoding_file_is_here(monkeypatch):
    monkeypatch.setattr(tokens, "_tiktoken_file", lambda: None)
    assert tokens._tiktoken() is None
    minilm = tokens._minilm()
    if minilm is not None:
        assert minilm.name == "MiniLM WordPiece" and minilm.count("metric units") >= 2
    assert tokens.estimate("") == 0 and tokens.estimate("abcde") == 2
