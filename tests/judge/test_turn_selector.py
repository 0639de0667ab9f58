"""The offline judge's learned turn selector: shipped weights for the real MiniLM, the
rules alone for any other embedder, and the rules still rewriting and withholding."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import pytest

from memory_pipelines.embeddings import CachedEmbedder, HashEmbedder
from memory_pipelines.errors import ConfigError, MemoryPipelineError
from memory_pipelines.judge import OfflineJudge
from memory_pipelines.judge import selector as sel
from memory_pipelines.judge.decisions import ConversationMessage

WHEN = datetime(2023, 5, 8, 14, 0, tzinfo=UTC)
DURABLE = "I've been volunteering at the animal shelter every Saturday since college."
SMALL_TALK = "Haha, that's awesome, thanks!"


def _msgs(*texts: str) -> list[ConversationMessage]:
    return [
        ConversationMessage("user", t, message_id=f"m{i}", sent_at=WHEN)
        for i, t in enumerate(texts)
    ]


def test_the_shipped_weights_load_and_name_their_embedder():
    s = sel.shipped()
    assert s.model_id == "all-MiniLM-L6-v2" and s.dim == 384
    assert s.weights.shape == (386,) and 0.0 < s.threshold < 1.0
    assert s.meta["target_precision"] >= 0.7
    assert set(s.meta["fitted_on"]) >= {"conv-26", "conv-30"}


def test_weights_round_trip_and_bad_files_are_config_errors(tmp_path):
    s = sel.TurnSelector(np.arange(5.0), 0.6, "m", 3, {"c": 1.0})
    back = sel.TurnSelector.from_json(s.to_json())
    assert back.threshold == 0.6 and back.weights.tolist() == [0, 1, 2, 3, 4]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_id": "m", "dim": 3, "threshold": 0.5, "weights": [1, 2]}))
    with pytest.raises(ConfigError) as e:
        sel.load(bad)
    assert isinstance(e.value, MemoryPipelineError)


def test_a_hashing_embedder_falls_back_to_the_rules():
    j = OfflineJudge(HashEmbedder(64))
    assert j.selector is None and sel.selector_for(None) is None
    got = j.extract_notes(_msgs(DURABLE), [], rating_context="positive")
    assert [c.rule for c in got] == ["habit"]  # the life-fact rule chose it


def test_the_real_minilm_selects_a_durable_fact_and_rejects_small_talk(minilm):
    s = sel.selector_for(minilm)
    assert s is not None and sel.selector_for(CachedEmbedder(minilm)) is s
    texts = [DURABLE, SMALL_TALK, "Sounds great, see you later!"]
    assert s.select(texts, minilm.embed(texts)) == [True, False, False]


def test_the_judge_uses_the_selector_and_the_rules_rewrite_and_withhold(minilm):
    j = OfflineJudge(minilm)
    assert j.selector is sel.shipped()
    texts = (
        DURABLE,
        SMALL_TALK,
        "Always answer me in French.",  # an instruction: its rule reads it
        "I've been going to my therapist every Saturday since college for my depression.",
    )
    got = {
        c.source_message_id: c
        for c in j.extract_notes(_msgs(*texts), [], rating_context="positive")
    }
    assert set(got) == {"m0", "m2"}
    assert got["m0"].content.startswith("User has been volunteering at the animal shelter")
    assert got["m2"].rule == "instruction"
    # a selector that takes everything: still no small talk note, no sensitive fact
    keen = sel.TurnSelector(np.zeros(386), 0.0, minilm.model_id, 384)
    got = OfflineJudge(minilm, selector=keen).extract_notes(
        _msgs(*texts), [], rating_context="positive"
    )
    assert {c.source_message_id for c in got} == {"m0", "m2"}
    # the rules alone, asked for: the life-fact rule reads the same turn
    rules = OfflineJudge(minilm, selector=None).extract_notes(
        _msgs(DURABLE), [], rating_context="positive"
    )
    assert [c.rule for c in rules] == ["habit"]


def test_rewrite_a_turn_no_rule_reads():
    got = sel.rewrite("Wow! I really like the quiet mornings by the lake with my sister.", WHEN)
    assert got is not None and got[1] == sel.SELECTOR_RULE
    assert got[0] == "User really likes the quiet mornings by the lake with their sister."
    assert sel.rewrite("I am a nurse at the city hospital.", WHEN)[0].startswith("User is a nurse")
    assert sel.rewrite("Haha, thanks! How about you?", WHEN) is None
