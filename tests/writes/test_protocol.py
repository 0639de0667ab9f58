"""The memory protocol parser, public as ``memory_pipelines.split_memory_writes``: the
answer's text for the user and the ``memoryWrites`` for ``svc.write``."""

from __future__ import annotations

import json

import pytest

import memory_pipelines
from memory_pipelines import split_memory_writes

W = {"note": "User prefers metric units.", "type": "Preference"}


def test_public_name():
    assert "split_memory_writes" in memory_pipelines.__all__
    assert memory_pipelines.split_memory_writes is split_memory_writes


def test_the_answer_envelope_gives_the_answer_text():
    content = json.dumps({"answer": "Got it, I'll keep deploy windows in mind.", "memoryWrites": [W]})
    assert split_memory_writes(content) == ("Got it, I'll keep deploy windows in mind.", [W])
    fenced = f"```json\n{content}\n```"
    assert split_memory_writes(fenced) == ("Got it, I'll keep deploy windows in mind.", [W])
    # a client that asked for JSON keeps JSON
    text, writes = split_memory_writes(content, keep_json=True)
    assert json.loads(text) == {"answer": "Got it, I'll keep deploy windows in mind."} and writes == [W]


def test_other_json_stays_json_without_the_field():
    text, writes = split_memory_writes(json.dumps({"reply": "Noted.", "n": 2, "memoryWrites": [W]}))
    assert json.loads(text) == {"reply": "Noted.", "n": 2} and writes == [W]
    assert split_memory_writes('{"memoryWrites": "bad"}') == ("", ["bad"])
    assert split_memory_writes('{"memoryWrites": "bad"}', keep_json=True) == ("{}", ["bad"])
    assert split_memory_writes('{"answer": "x", "memoryWrites": null}') == ("x", [])


def test_a_trailing_block_gives_the_text_around_it():
    content = f"Noted, metric it is.\n\n```memoryWrites\n{json.dumps([W])}\n```\n"
    assert split_memory_writes(content) == ("Noted, metric it is.", [W])
    # an unclosed block (a stream cut short) still yields its writes
    assert split_memory_writes(f"Sure.\n```memoryWrites\n{json.dumps([W])}") == ("Sure.", [W])
    # text after the block is kept; the tag is matched case-insensitively
    got = split_memory_writes(f"Before.\n```MemoryWrites\n{json.dumps(W)}\n```\nAfter.")
    assert got == ("Before.\n\nAfter.", [W])


def test_a_malformed_block_is_one_malformed_write_not_nothing():
    text, writes = split_memory_writes("Ok.\n```memoryWrites\n[{note: oops\n```")
    assert text == "Ok." and writes == ["[{note: oops"]


def test_content_without_the_protocol_is_unchanged():
    for content in ("plain {text}", '{"broken": ', '{"a": 1}', "```python\nprint(1)\n```", "",
                    'He said "```json" once', '["memoryWrites"]'):
        assert split_memory_writes(content) == (content, None)
    with pytest.raises(TypeError):
        split_memory_writes(None)  # type: ignore[arg-type]


def test_the_envelope_without_writes_gives_the_answer_text_unless_json_was_asked():
    content = json.dumps({"answer": "A marathon is 42.2 km."})
    assert split_memory_writes(content) == ("A marathon is 42.2 km.", None)
    assert split_memory_writes(f"```json\n{content}\n```") == ("A marathon is 42.2 km.", None)
    assert split_memory_writes('{"answer": "bad \\ud800"}') == ("bad \ufffd", None)
    # a client that asked for JSON keeps it; other JSON is the model's own
    assert split_memory_writes(content, keep_json=True) == (content, None)
    for other in ('{"answer": 3}', '{"answer": "x", "n": 1}', '{"answer": null}'):
        assert split_memory_writes(other) == (other, None)
