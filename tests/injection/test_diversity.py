"""Coverage instead of near-duplicates: maximal marginal relevance and the
per-conversation cap over a fused ranking, and their settings."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from memory_pipelines.config import InjectConfig
from memory_pipelines.errors import ConfigError, MemoryPipelineError
from memory_pipelines.injection.diversity import diversify


@dataclass(frozen=True)
class C:
    id: str
    text: str
    score: float
    group: str | None


def _run(ranked, k, lam=1.0, cap=0, pool=50):
    out = diversify(
        ranked,
        k,
        mmr_lambda=lam,
        session_cap=cap,
        score_of=lambda c: c.score,
        text_of=lambda c: c.text,
        group_of=lambda c: c.group,
        pool=pool,
    )
    return [c.id for c in out]


RANKED = [
    C("a", "Caroline went to the LGBTQ support group on Tuesday", 1.0, "s1"),
    C("a2", "Caroline went to the LGBTQ support group on Tuesday again", 0.95, "s1"),
    C("a3", "Caroline went to the support group on Tuesday", 0.9, "s1"),
    C("b", "Melanie painted a sunrise over the lake", 0.8, "s2"),
    C("c", "Caroline is researching adoption agencies", 0.7, "s3"),
]


def test_off_leaves_the_ranking_as_it_is():
    assert _run(RANKED, 3) == ["a", "a2", "a3", "b", "c"]
    cfg = InjectConfig()
    assert cfg.mmr_lambda == 0.4 and cfg.session_cap == 0  # chosen by nested CV


def test_mmr_replaces_near_copies_by_other_evidence_and_keeps_everything():
    out = _run(RANKED, 3, lam=0.5)
    assert out[:3] == ["a", "b", "c"]
    assert sorted(out) == sorted(c.id for c in RANKED)  # nothing lost, only reordered
    assert out[3:] == ["a2", "a3"]  # the rest keep their order


def test_mmr_with_lambda_near_one_only_breaks_near_ties():
    assert _run(RANKED, 3, lam=0.99)[:3] == ["a", "a2", "a3"]


def test_session_cap_fills_the_first_k_from_other_conversations():
    assert _run(RANKED, 3, cap=1) == ["a", "b", "c", "a2", "a3"]
    assert _run(RANKED, 4, cap=2) == ["a", "a2", "b", "c", "a3"]


def test_cap_with_too_few_conversations_returns_all_candidates():
    only_one = [c for c in RANKED if c.group == "s1"]
    assert _run(only_one, 3, cap=1) == ["a", "a2", "a3"]


def test_candidates_without_a_conversation_are_never_capped():
    loose = [C(str(i), f"note {i}", 1.0 - i / 10, None) for i in range(4)]
    assert _run(loose, 3, cap=1) == ["0", "1", "2", "3"]


def test_items_beyond_the_pool_follow_untouched():
    out = _run(RANKED, 2, lam=0.3, pool=3)
    assert out[0] == "a" and out[3:] == ["b", "c"]


def _service_notes(tmp_path, cfg):
    from memory_pipelines.embeddings import HashEmbedder
    from memory_pipelines.notes import AuthorType, Note, NoteStatus, NoteType, RunContext
    from memory_pipelines.service import MemoryService

    svc = MemoryService.open(tmp_path / "home", embedder=HashEmbedder(64), inject_config=cfg)
    svc.configure_agent("a", max_notes_to_inject=3, note_injection_strategy="Relevant")
    texts = [
        ("s1", "D1:1", "Ann adopted a tabby cat named Pixel from the shelter"),
        ("s1", "D1:5", "Ann adopted a tabby cat named Pixel from the shelter last spring"),
        ("s1", "D1:9", "Ann says the tabby cat Pixel came from the shelter"),
        ("s2", "D2:1", "Ann bought a scratching post for the cat"),
        ("s3", "D3:1", "Ann's cat Pixel is afraid of the vacuum"),
    ]
    svc.save_notes(
        [
            Note(
                id=f"n{i}",
                agent_id="a",
                user_id="u",
                note=t,
                type=NoteType.CONTEXT,
                status=NoteStatus.ACTIVE,
                author_type=AuthorType.USER,
                source_conversation_id=conv,
                source_conversation_detail_id=turn,
            )
            for i, (conv, turn, t) in enumerate(texts)
        ]
    )
    try:
        got = svc.inject(RunContext(agent_id="a", user_id="u"), "Ann tabby cat Pixel shelter")
        return [n.source_conversation_id for n in got.notes]
    finally:
        svc.close()


def test_session_cap_reaches_inject_through_the_config(tmp_path):
    plain = _service_notes(tmp_path / "plain", InjectConfig(mmr_lambda=1.0))
    capped = _service_notes(tmp_path / "capped", InjectConfig(mmr_lambda=1.0, session_cap=1))
    assert plain.count("s1") >= 2  # near-copies of one session crowd the top 3 by default
    assert sorted(capped) == ["s1", "s2", "s3"]


def test_empty_and_hostile_texts():
    odd = [C("x", "\ud800 ' % *", 0.0, "s"), C("y", "", 0.0, "s"), C("z", "é" * 10_000, 0.0, None)]
    assert sorted(_run(odd, 2, lam=0.2, cap=1)) == ["x", "y", "z"]
    assert _run([], 5, lam=0.2, cap=1) == []


@pytest.mark.parametrize("bad", [{"mmr_lambda": -0.1}, {"mmr_lambda": 1.5}, {"session_cap": -1}])
def test_bad_settings_are_config_errors_naming_the_field(bad):
    with pytest.raises(ConfigError) as err:
        InjectConfig(**bad)
    assert isinstance(err.value, MemoryPipelineError)
    assert next(iter(bad)) in str(err.value)


def test_inject_benchmark_prices_an_option(capsys):
    from memory_pipelines.bench import inject as bench

    args = ["--sizes", "600", "--queries", "4", "--index", "none", "--embedder", "hash"]
    assert bench.main([*args, "--set", "mmr_lambda=0.7"]) == 0
    out = capsys.readouterr().out
    assert "InjectConfig mmr_lambda=0.7" in out and "flat (exact)" in out
    with pytest.raises(SystemExit):
        bench.main([*args, "--set", "no_such_field=1"])


def test_the_newest_statement_of_a_changed_fact_wins():
    @dataclass(frozen=True)
    class D:
        id: str
        text: str
        score: float
        created: float

    ranked = [
        D("old", "User's favourite colour is blue", 1.0, 1.0),
        D("other", "User lives in Lisbon", 0.9, 5.0),
        D("new", "User's favourite colour is green now", 0.5, 9.0),
    ]

    def run(sim):
        out = diversify(
            ranked,
            2,
            mmr_lambda=1.0,
            session_cap=0,
            score_of=lambda c: c.score,
            text_of=lambda c: c.text,
            group_of=lambda c: None,
            update_similarity=sim,
            created_of=lambda c: c.created,
        )
        return [c.id for c in out]

    assert run(0.0) == ["old", "other", "new"]  # off: as ranked
    assert run(0.5) == ["new", "other", "old"]  # the newer near-copy takes the older's place
    assert run(0.9) == ["old", "other", "new"]  # not similar enough to be the same fact
    with pytest.raises(ConfigError, match="update_similarity"):
        InjectConfig(update_similarity=2.0)


def test_session_penalty_spreads_the_first_k_over_conversations_softly():
    def run(penalty, ranked=RANKED):
        out = diversify(
            ranked,
            3,
            mmr_lambda=1.0,
            session_cap=0,
            score_of=lambda c: c.score,
            text_of=lambda c: c.text,
            group_of=lambda c: c.group,
            session_penalty=penalty,
        )
        return [c.id for c in out]

    assert run(0.0) == ["a", "a2", "a3", "b", "c"]  # off: as ranked
    assert run(0.3)[:3] == ["a", "b", "c"]  # a second note of s1 now loses to other sessions
    assert sorted(run(0.3)) == sorted(c.id for c in RANKED)
    far = [*RANKED[:3], C("b", "unrelated", 0.1, "s2")]
    assert run(0.3, far)[:3] == ["a", "a2", "a3"]  # a soft cap: much better notes still win
    with pytest.raises(ConfigError, match="session_penalty"):
        InjectConfig(session_penalty=-0.1)
