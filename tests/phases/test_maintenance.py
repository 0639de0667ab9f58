"""The maintenance phases against a real store (LanceDB + SQLite), with fake judges.

Vectors are given explicitly (random unit directions and small perturbations of them),
so similarities are exactly what each test needs; the hashing embedder only embeds the
text of new consolidated notes.
"""

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
from factories import DIM, RecordingJudge, direction, near
from sqlalchemy import insert, select

from memory_pipelines import phases
from memory_pipelines.config import MaintenanceConfig, PruningConfig
from memory_pipelines.errors import JudgeError, StoreError
from memory_pipelines.inventory import dangling_lineage
from memory_pipelines.judge import ConsolidationDecision, ContradictionDecision
from memory_pipelines.notes import Example, Note
from memory_pipelines.sources import injection_events, manager_runs

# --------------------------------------------------------------------------- helpers



def put(svc, text: str, vec: np.ndarray, **fields) -> Note:
    fields.setdefault("agent_id", "agent")
    fields.setdefault("user_id", "u1")
    fields.setdefault("is_auto_generated", True)
    fields.setdefault("access_count", 1)
    return svc.save_notes([Note(note=text, **fields)], vectors=np.asarray([vec]))[0]


def get(svc, note_id: str) -> Note:
    note = svc.get_note(note_id)
    assert note is not None
    return note


def snapshot(svc) -> pd.DataFrame:
    cols = ["id", "status", "protection_tier", "comments", "consolidated_into_note_id"]
    return svc.notes()[cols].sort_values("id").reset_index(drop=True)


def assert_lineage_ok(svc) -> None:
    assert dangling_lineage(svc).empty



class FailingJudge:
    name = "failing"

    def synthesize_cluster(self, notes, *, anchored):
        raise JudgeError("model timed out")

    def detect_contradiction(self, a, b):
        raise JudgeError("malformed output")


@pytest.fixture
def world(svc):
    svc.configure_agent("agent")
    svc.configure_agent("other")
    for user in ("u1", "u2"):
        svc.add_user(user)
    return svc


def use(svc, judge):
    svc.judge = judge
    return judge


def add_cycle(svc, when) -> None:
    with svc.sources.begin() as conn:
        conn.execute(
            insert(manager_runs).values(
                kind="cycle", status="Completed", started_at=when, finished_at=when, counts={}
            )
        )


# --------------------------------------------------------------------------- importance


def test_importance_scores_and_self_exclusion(world, clock):
    alone = put(world, "the deploy window is Friday", direction(1))
    human = put(world, "call me Sam", direction(2), is_auto_generated=False, agent_id="solo")
    # the same text for two users of one agent: uniqueness is searched agent-wide (reference)
    dup_a = put(world, "dark mode everywhere", direction(3), user_id="u1", agent_id="dups")
    dup_b = put(world, "dark mode everywhere", direction(3), user_id="u2", agent_id="dups")
    # the same vector in ANOTHER agent does not lower uniqueness
    twin = put(world, "the deploy window is Friday", direction(1), agent_id="other")
    report = phases.importance.run(world.context)
    assert report["notesScored"] == 5
    assert get(world, alone.id).importance_score == 7.0  # not ~4.0: no self-match
    assert get(world, twin.id).importance_score == 7.0
    assert get(world, dup_a.id).importance_score == 4.0  # uniqueness 0: a true duplicate
    assert get(world, dup_b.id).importance_score == 4.0
    h = get(world, human.id)
    assert h.importance_score == 8.0
    assert h.protection_tier == "Protected"
    assert h.comments == "[Auto-promoted to Protected: ImportanceScore 8 >= 8]"
    assert report["tierPromotions"] == 1
    assert report["scoreDistribution"] == {"min": 4.0, "max": 8.0, "mean": 6.0, "median": 7.0}
    step = world.sources.steps(step_name="Compute Importance Scores")[-1]
    assert step["input_json"] == {"activeNoteCount": 5}
    assert step["output_json"]["notesScored"] == 5


def test_importance_relevance_from_injection_events(world, clock):
    used = put(world, "prefers short answers", direction(4))
    unused = put(world, "works from Berlin", direction(5), agent_id="other")
    with world.sources.begin() as conn:
        for k in range(20):
            conn.execute(
                insert(injection_events).values(
                    run_id=f"r{k}",
                    agent_id="agent",
                    user_id="u1",
                    item_kind="note",
                    item_id=used.id,
                    rank=0,
                    injected_at=clock(),
                )
            )
    report = phases.importance.run(world.context)
    assert get(world, unused.id).importance_score == 7.0  # never injected: the reference score
    assert get(world, used.id).importance_score > 7.0
    assert report.extra["notesWithInjections"] == 1


def test_importance_promotion_tiers_and_uniqueness_percentile(world, clock):
    # 25 notes of one scope on random directions: the most unique ones reach p95
    for i in range(25):
        put(world, f"fact number {i}", direction(100 + i), created_at=clock() - timedelta(days=5))
    prot = put(
        world,
        "old protected",
        direction(200),
        protection_tier="Protected",
        created_at=clock() - timedelta(days=90),
    )
    imm = put(
        world,
        "immutable policy",
        direction(201),
        protection_tier="Immutable",
        is_auto_generated=False,
    )
    report = phases.importance.run(world.context)
    by_uniq = [
        n for n in world.store.notes.all() if (n.comments or "").startswith("[Auto-protected")
    ]
    assert report.extra["promotionsByUniqueness"] == len(by_uniq) >= 1
    assert all(n.protection_tier == "Protected" for n in by_uniq)
    assert all(
        pd.Series([n.comments]).str.fullmatch(
            r"\[Auto-protected: uniqueness 0\.\d{3} at/above 95th percentile 0\.\d{3}\]"
        )[0]
        for n in by_uniq
    )
    # never demoted, and nothing becomes Immutable automatically
    assert get(world, prot.id).protection_tier == "Protected"
    assert get(world, prot.id).importance_score < 8.0
    assert get(world, imm.id).protection_tier == "Immutable"
    assert sum(n.protection_tier == "Immutable" for n in world.store.notes.all()) == 1


def test_no_uniqueness_promotion_below_a_cohort_of_twenty(world, clock):
    for i in range(19):
        put(world, f"fact number {i}", direction(100 + i), created_at=clock() - timedelta(days=5))
    report = phases.importance.run(world.context)
    assert report["tierPromotions"] == 0
    assert report.extra["uniquenessP95"] is None


# --------------------------------------------------------------------------- consolidation


def test_consolidation_merges_a_cluster_and_revokes_its_sources(world, clock):
    judge = use(world, RecordingJudge())
    base = direction(7)
    a = put(
        world,
        "User drinks tea",
        near(base, 1),
        comments="extracted from conversation c1",
        created_at=clock() - timedelta(days=3),
    )
    b = put(
        world,
        "The user likes tea",
        near(base, 2),
        access_count=2,
        created_at=clock() - timedelta(days=2),
    )
    c = put(
        world,
        "Tea is the user's drink",
        near(base, 3),
        access_count=4,
        created_at=clock() - timedelta(days=1),
    )
    unrelated = put(world, "Deploys happen on Friday", direction(8))
    report = phases.consolidation.run(world.context)
    assert report["consolidatedClusterCount"] == 1
    assert report["sourceNotesArchived"] == 3
    [new_id] = report["newConsolidatedNoteIds"]
    assert new_id == phases.consolidation.consolidation_note_id([a.id, b.id, c.id])
    new = get(world, new_id)
    assert new.status == "Active" and new.is_auto_generated and new.protection_tier == "Standard"
    assert new.type == "Context"
    assert (new.agent_id, new.user_id, new.company_id) == ("agent", "u1", None)
    assert new.derived_from_note_ids[0] == a.id  # the seed (oldest) first
    assert set(new.derived_from_note_ids) == {a.id, b.id, c.id}
    assert new.consolidation_count == 1
    assert new.access_count == 7
    assert new.comments == "Consolidated from 3 notes: same topic"
    for src in (a, b, c):
        s = get(world, src.id)
        assert s.status == "Revoked"
        assert s.consolidated_into_note_id == new_id
        assert s.comments.endswith(f"Consolidated into note {new_id}: same topic")
    assert get(world, a.id).comments.startswith("extracted from conversation c1 ")  # appended
    assert get(world, unrelated.id).status == "Active"
    assert [(set(ids), anchored) for ids, anchored in judge.clusters] == [
        ({a.id, b.id, c.id}, False)
    ]
    names = [s["step_name"] for s in world.sources.steps()]
    assert names.count("Process Consolidation Cluster") == 1
    assert "Verify Consolidation Output" in names and names[-1] == "Consolidate Related Notes"
    assert_lineage_ok(world)


def test_consolidation_never_crosses_scopes(world, clock):
    judge = use(world, RecordingJudge())
    base = direction(9)
    # two notes per user: each scope is below the minimum cluster size of 3
    for user, seed in (("u1", 1), ("u2", 3)):
        put(world, "User drinks tea", near(base, seed), user_id=user)
        put(world, "User drinks tea", near(base, seed + 1), user_id=user)
    before = snapshot(world)
    assert phases.consolidation.run(world.context)["consolidatedClusterCount"] == 0
    pd.testing.assert_frame_equal(before, snapshot(world))
    # three per user: one consolidated note per scope, each keeping its own scope
    for user, seed in (("u1", 5), ("u2", 6)):
        put(world, "User drinks tea", near(base, seed), user_id=user)
    report = phases.consolidation.run(world.context)
    assert report["consolidatedClusterCount"] == 2
    for new_id in report["newConsolidatedNoteIds"]:
        new = get(world, new_id)
        sources = world.store.notes.get_many(new.derived_from_note_ids)
        assert {s.user_id for s in sources} == {new.user_id}
    assert len(judge.clusters) == 2
    assert_lineage_ok(world)


@pytest.mark.parametrize(
    ("tiers", "merged"),
    [
        (("Standard", "Standard", "Standard"), True),
        (("Standard", "Standard", "Protected"), False),
        (("Standard", "Standard", "Immutable"), False),
        (("Ephemeral", "Standard"), True),  # an Ephemeral seed needs only 2
        (("Standard", "Ephemeral"), False),  # a Standard seed still needs 3
    ],
)
def test_consolidation_tiers(world, clock, tiers, merged):
    use(world, RecordingJudge())
    base = direction(11)
    notes = [
        put(
            world,
            f"note {i}",
            near(base, i),
            protection_tier=tier,
            created_at=clock() - timedelta(hours=10 - i),
        )
        for i, tier in enumerate(tiers)
    ]
    put(world, "an unrelated note", direction(99))  # the phase needs 3 candidates at all
    report = phases.consolidation.run(world.context)
    assert (report["consolidatedClusterCount"] == 1) is merged
    for n in notes:
        status = get(world, n.id).status
        if n.protection_tier in ("Protected", "Immutable") or not merged:
            assert status == "Active"
        else:
            assert status == "Revoked"


def test_consolidation_needs_three_candidates(world, clock):
    judge = use(world, RecordingJudge())
    base = direction(19)
    put(
        world,
        "ephemeral seed",
        near(base, 1),
        protection_tier="Ephemeral",
        created_at=clock() - timedelta(hours=2),
    )
    put(world, "its twin", near(base, 2))
    assert phases.consolidation.run(world.context)["consolidatedClusterCount"] == 0  # 2 candidates: nothing happens
    assert judge.clusters == []


def test_consolidation_membership_is_rechecked(world, clock):
    judge = use(world, RecordingJudge())
    base = direction(12)
    put(world, "auto one", near(base, 1))
    put(world, "auto two", near(base, 2))
    put(world, "human note", near(base, 3), is_auto_generated=False)
    put(world, "provisional note", near(base, 4), status="Provisional", author_type="Agent")
    assert phases.consolidation.run(world.context)["consolidatedClusterCount"] == 0
    assert judge.clusters == []


def test_oversized_clusters_are_cut_into_chunks_of_seven(world, clock):
    judge = use(world, RecordingJudge())
    base = direction(13)
    notes = [
        put(
            world, f"tea note {i}", near(base, i, 0.2), created_at=clock() - timedelta(hours=20 - i)
        )
        for i in range(9)
    ]
    report = phases.consolidation.run(world.context)
    assert report["consolidatedClusterCount"] == 1  # chunks 7 + 2: the 2 are dropped
    [(ids, _)] = judge.clusters
    assert len(ids) == 7
    statuses = [get(world, n.id).status for n in notes]
    assert statuses.count("Revoked") == 7 and statuses.count("Active") == 2


def test_drift_guard_resolves_to_originals_and_anchors(world, clock):
    judge = use(world, RecordingJudge())
    base = direction(14)
    originals = [
        put(world, f"original {i}", near(base, 20 + i), status="Revoked") for i in range(2)
    ]
    gen3 = put(
        world,
        "third generation summary",
        near(base, 1),
        consolidation_count=3,
        derived_from_note_ids=[o.id for o in originals],
    )
    put(world, "fresh a", near(base, 2))
    put(world, "fresh b", near(base, 3))
    phases.consolidation.run(world.context)
    [(ids, anchored)] = judge.clusters
    assert anchored is False
    assert set(ids) >= {o.id for o in originals}  # the judge saw the generation-0 notes
    assert gen3.id not in ids
    fresh_ids = [n.id for n in world.store.notes.all() if n.note.startswith("fresh")]
    new = get(world, phases.consolidation.consolidation_note_id([gen3.id, *fresh_ids]))
    assert new.consolidation_count == 4
    assert get(world, gen3.id).status == "Revoked"
    assert_lineage_ok(world)

    judge.clusters.clear()
    base2 = direction(15)
    put(world, "gen one", near(base2, 1), consolidation_count=1)
    put(world, "plain a", near(base2, 2))
    put(world, "plain b", near(base2, 3))
    phases.consolidation.run(world.context)
    [(_, anchored)] = judge.clusters
    assert anchored is True


def test_consolidation_verification_marker(world, clock):
    class Lossy(RecordingJudge):
        def synthesize_cluster(self, notes, *, anchored):
            return ConsolidationDecision(True, content="The user has a database.", reason="merged")

    use(world, Lossy())
    base = direction(16)
    put(world, "Postgres 15.2 was upgraded on 2026-05-01.", near(base, 1))
    put(world, "The user runs Postgres with replicaCount 3.", near(base, 2))
    put(world, "Database upgrades happen on Mar 3.", near(base, 3))
    [new_id] = phases.consolidation.run(world.context)["newConsolidatedNoteIds"]
    comments = get(world, new_id).comments
    assert comments.startswith(
        "Consolidated from 3 notes: merged [Verification: potentially missing entities: "
    )
    for entity in ("2026-05-01", "15.2", "Postgres", "replicaCount", "Mar 3"):
        assert entity in comments
    verify = world.sources.steps(step_name="Verify Consolidation Output")[-1]["output_json"]
    assert verify["verificationsFlagged"] == 1 and verify["entitiesMissing"] >= 5


def test_consolidation_judge_failure_and_refusal_change_nothing(world, clock):
    base = direction(17)
    for i in range(3):
        put(world, f"tea {i}", near(base, i))
    before = snapshot(world)
    use(world, FailingJudge())
    report = phases.consolidation.run(world.context)
    assert report["consolidatedClusterCount"] == 0
    assert report.extra["clustersSkipped"] == {"prompt-failed": 1}
    pd.testing.assert_frame_equal(before, snapshot(world))
    step = world.sources.steps(step_name="Process Consolidation Cluster")[-1]
    assert step["output_json"] == {"skipReason": "prompt-failed"}
    assert "timed out" in step["error_message"]

    class Refusing(RecordingJudge):
        def synthesize_cluster(self, notes, *, anchored):
            return ConsolidationDecision(False, reason="decision loss")

    use(world, Refusing())
    assert phases.consolidation.run(world.context).extra["clustersSkipped"] == {"decision loss": 1}
    pd.testing.assert_frame_equal(before, snapshot(world))


def test_crash_between_save_and_revoke_is_completed_by_the_next_run(world, clock, monkeypatch):
    judge = use(world, RecordingJudge())
    base = direction(18)
    sources = [
        put(world, f"tea {i}", near(base, i), created_at=clock() - timedelta(hours=5 - i))
        for i in range(3)
    ]
    real_revoke = phases.consolidation.revoke_sources

    def crash(svc, notes, vectors, revocations, report, *args, **kwargs):
        if revocations:
            raise StoreError("process killed")
        return real_revoke(svc, notes, vectors, revocations, report, *args, **kwargs)

    monkeypatch.setattr(phases.consolidation, "revoke_sources", crash)
    with pytest.raises(StoreError):
        phases.consolidation.run(world.context)
    new_id = phases.consolidation.consolidation_note_id([s.id for s in sources])
    assert get(world, new_id).status == "Active"  # saved first ...
    assert all(get(world, s.id).status == "Active" for s in sources)  # ... nothing revoked
    assert_lineage_ok(world)

    monkeypatch.setattr(phases.consolidation, "revoke_sources", real_revoke)
    report = phases.consolidation.run(world.context)
    assert report.extra["interruptedRevocationsCompleted"] == 3
    assert report["consolidatedClusterCount"] == 0
    for s in sources:
        after = get(world, s.id)
        assert after.status == "Revoked" and after.consolidated_into_note_id == new_id
        assert after.comments == f"Consolidated into note {new_id}: same topic"
    assert len(judge.clusters) == 1  # the judge was not asked again
    assert (world.notes()["consolidation_count"] > 0).sum() == 1  # no duplicate note
    assert_lineage_ok(world)


def test_batches_are_saved_one_after_another(world, clock, monkeypatch):
    from memory_pipelines.config import ConsolidationConfig

    world.maintenance_config = MaintenanceConfig(
        consolidation=ConsolidationConfig(batch_clusters=1)
    )
    use(world, RecordingJudge())
    for user in ("u1", "u2"):
        base = direction(40 if user == "u1" else 41)
        for i in range(3):
            put(
                world,
                f"{user} {i}",
                near(base, i),
                user_id=user,
                created_at=clock() - timedelta(hours=9 - i),
            )
    real_revoke = phases.consolidation.revoke_sources
    calls = []

    def crash_second(svc, notes, vectors, revocations, report, *args, **kwargs):
        if revocations:
            calls.append(len(revocations))
            if len(calls) == 2:
                raise StoreError("killed during the second batch")
        return real_revoke(svc, notes, vectors, revocations, report, *args, **kwargs)

    monkeypatch.setattr(phases.consolidation, "revoke_sources", crash_second)
    with pytest.raises(StoreError):
        phases.consolidation.run(world.context)
    statuses = world.notes()[["user_id", "status", "consolidation_count"]]
    sources = statuses[statuses["consolidation_count"] == 0]
    # the first batch is complete, the second saved its note but revoked nothing yet
    assert sorted(sources.groupby("user_id")["status"].first()) == ["Active", "Revoked"]
    assert (statuses["consolidation_count"] == 1).sum() == 2
    assert_lineage_ok(world)
    monkeypatch.setattr(phases.consolidation, "revoke_sources", real_revoke)
    assert phases.consolidation.run(world.context).extra["interruptedRevocationsCompleted"] == 3
    assert (world.notes().query("consolidation_count == 0")["status"] == "Revoked").all()


# --------------------------------------------------------------------------- contradictions


def test_contradiction_revokes_the_loser_and_appends(world, clock):
    judge = use(world, RecordingJudge())
    base = direction(20)
    old = put(
        world,
        "User drinks tea",
        near(base, 1, 0.5),
        comments="first seen in c1",
        created_at=clock() - timedelta(days=10),
    )
    new = put(world, "User drinks coffee now", near(base, 2, 0.5))
    report = phases.contradictions.run(world.context)
    assert report["pairsAnalyzed"] == 1
    assert report["contradictionsFound"] == report["contradictionsResolved"] == 1
    assert report["entityTriplesExtracted"] == 2
    loser = get(world, old.id)
    assert loser.status == "Revoked" and loser.consolidated_into_note_id == new.id
    assert loser.comments == (
        f"first seen in c1 [Contradiction resolved: superseded by note {new.id}. the newer note wins]"
    )
    assert get(world, new.id).status == "Active"
    assert len(judge.pairs) == 1 and set(judge.pairs[0]) == {old.id, new.id}
    step = world.sources.steps(step_name="Detect Note Contradictions")[-1]
    assert step["output_json"]["contradictionsResolved"] == 1
    assert_lineage_ok(world)


def test_contradictions_never_cross_scopes_or_pair_a_note_with_itself(world, clock):
    judge = use(world, RecordingJudge())
    base = direction(21)
    put(world, "User drinks tea", near(base, 1, 0.5), user_id="u1")
    put(world, "User drinks coffee", near(base, 2, 0.5), user_id="u2")
    put(world, "User drinks water", near(base, 3, 0.5), user_id=None)  # agent-wide scope
    before = snapshot(world)
    assert phases.contradictions.run(world.context)["pairsAnalyzed"] == 0
    assert judge.pairs == []
    pd.testing.assert_frame_equal(before, snapshot(world))


@pytest.mark.parametrize(
    ("fields_a", "fields_b", "expected"),
    [
        ({"importance_score": 7.5}, {"importance_score": 7.0}, "flag"),
        ({"importance_score": 9.0}, {"importance_score": 3.0}, "revoke"),
        ({"protection_tier": "Protected"}, {}, "flag"),
        ({}, {"protection_tier": "Protected", "is_auto_generated": False}, "flag"),
        ({}, {"protection_tier": "Immutable"}, "unpaired"),
        ({}, {"protection_tier": "Ephemeral"}, "revoke"),
        ({}, {"status": "Provisional", "author_type": "Agent"}, "revoke"),
    ],
)
def test_contradiction_tiers(world, clock, fields_a, fields_b, expected):
    judge = use(world, RecordingJudge())
    base = direction(22)
    a = put(
        world,
        "Deploys happen on Friday",
        near(base, 1, 0.5),
        created_at=clock() - timedelta(days=9),
        **fields_a,
    )
    b = put(world, "Deploys happen on Monday", near(base, 2, 0.5), **fields_b)
    report = phases.contradictions.run(world.context)
    na, nb = get(world, a.id), get(world, b.id)
    if expected == "unpaired":
        assert judge.pairs == [] and report["pairsAnalyzed"] == 0
        assert na.status == "Active" and nb.status == fields_b.get("status", "Active")
    elif expected == "flag":
        assert report["contradictionsFlagged"] == 1
        assert na.status == "Active" and nb.status == fields_b.get("status", "Active")
        assert (
            na.comments
            == f"[Contradiction flagged: conflicts with note {b.id}. the newer note wins]"
        )
        assert (
            nb.comments
            == f"[Contradiction flagged: conflicts with note {a.id}. the newer note wins]"
        )
    else:  # the older note (a) loses
        assert report["contradictionsResolved"] == 1
        assert na.status == "Revoked" and na.consolidated_into_note_id == b.id


def test_contradiction_judge_failure_changes_nothing_and_is_retried(world, clock):
    base = direction(23)
    put(world, "User drinks tea", near(base, 1, 0.5), created_at=clock() - timedelta(days=9))
    put(world, "User drinks coffee", near(base, 2, 0.5))
    before = snapshot(world)
    use(world, FailingJudge())
    report = phases.contradictions.run(world.context)
    assert report["pairsAnalyzed"] == 0 and report.extra["judgeErrors"] == 1
    pd.testing.assert_frame_equal(before, snapshot(world))
    judge = use(world, RecordingJudge())
    assert phases.contradictions.run(world.context)["contradictionsResolved"] == 1
    assert len(judge.pairs) == 1


def test_judged_pairs_are_not_asked_again_nor_reflagged(world, clock):
    judge = use(world, RecordingJudge(contradiction=False))
    base = direction(24)
    put(world, "User drinks tea", near(base, 1, 0.5))
    put(world, "User drinks tea in the morning", near(base, 2, 0.5))
    assert phases.contradictions.run(world.context)["pairsAnalyzed"] == 1
    assert phases.contradictions.run(world.context)["pairsAnalyzed"] == 0
    assert len(judge.pairs) == 1
    # a flagged pair keeps a single flag
    judge = use(world, RecordingJudge())
    base = direction(25)
    a = put(world, "Deploys on Friday", near(base, 1, 0.5), importance_score=8.0)
    put(world, "Deploys on Monday", near(base, 2, 0.5), importance_score=8.0)
    phases.contradictions.run(world.context)
    phases.contradictions.run(world.context)
    assert get(world, a.id).comments.count("Contradiction flagged") == 1


def test_pairs_from_this_cycles_consolidation_are_skipped(world, clock):
    judge = use(world, RecordingJudge())
    base = direction(26)
    a = put(world, "Merged: tea in the morning", near(base, 1, 0.5))
    b = put(world, "Merged: coffee in the morning", near(base, 2, 0.5))
    world.sources.set_state(
        phases.consolidation.STATE_CONSOLIDATED, {"run_id": "run-1", "ids": [a.id, b.id], "consumed": False}
    )
    report = phases.contradictions.run(world.context, "run-1")
    assert report["pairsAnalyzed"] == 0 and judge.pairs == []
    step = world.sources.steps("run-1", "Detect Note Contradictions")[-1]
    assert step["input_json"] == {"consolidatedNoteIdsCount": 2}
    # in a later run the pair is an ordinary pair
    assert phases.contradictions.run(world.context, "run-2")["pairsAnalyzed"] == 1


# --------------------------------------------------------------------------- stale pruning


def test_stale_references_are_archived_with_reasons(world, clock):
    world.add_company("acme")
    world.add_user("u3", "acme")
    world.add_conversation("conv-1", "agent", "u3", "acme")
    keep = put(
        world,
        "still valid",
        direction(30),
        user_id="u3",
        company_id="acme",
        source_conversation_id="conv-1",
    )
    gone_user = put(
        world,
        "user gone",
        direction(31),
        user_id="u2",
        comments="from c9",
        created_at=clock() - timedelta(days=3),
    )
    gone_conv = put(
        world, "conversation gone", direction(32), user_id="u3", source_conversation_id="conv-x"
    )
    gone_agent = put(world, "agent inactive", direction(33), agent_id="other")
    gone_company = put(world, "company gone", direction(34), user_id=None, company_id="globex")
    human = put(world, "human note", direction(35), user_id="u2", is_auto_generated=False)
    immutable = put(world, "immutable", direction(36), user_id="u2", protection_tier="Immutable")
    protected = put(world, "protected", direction(37), user_id="u2", protection_tier="Protected")
    # only what was registered and later deleted is stale (CONTRACT §2.9)
    world.add_user("u2")
    world.add_conversation("conv-x", "agent", "u3", "acme")
    world.add_company("globex")
    never = put(world, "never registered", direction(38), user_id="u7", company_id="initech")
    world.delete_user("u2")
    world.delete_conversation("conv-x")
    world.delete_company("globex")
    world.deactivate_agent("other")
    report = phases.pruning.run(world.context)
    assert report["notesArchived"] == 5
    assert (report["orphanedUsers"], report["orphanedAgents"]) == (2, 1)
    assert (report["orphanedCompanies"], report["orphanedConversations"]) == (1, 1)
    stamp = "2026-06-01T12:00:00.000Z"
    assert get(world, gone_user.id).comments == (
        f"from c9 [Archived by Memory Manager: stale reference pruning - referenced user no longer exists on {stamp}]"
    )
    assert "source conversation no longer exists" in get(world, gone_conv.id).comments
    assert "referenced agent is inactive or deleted" in get(world, gone_agent.id).comments
    assert "referenced company no longer exists" in get(world, gone_company.id).comments
    for n in (gone_user, gone_conv, gone_agent, gone_company, protected):
        assert get(world, n.id).status == "Archived"
    for n in (keep, human, immutable, never):
        assert get(world, n.id).status == "Active"


def test_stale_pruning_caps_and_takes_the_oldest(svc, clock):
    svc.maintenance_config = MaintenanceConfig(pruning=PruningConfig(max_notes_per_run=2))
    svc.configure_agent("agent")
    notes = [
        put(svc, f"n{i}", direction(40 + i), created_at=clock() - timedelta(days=i))
        for i in range(4)
    ]
    svc.add_user("u1")
    svc.delete_user("u1")
    report = phases.pruning.run(svc.context)  # user u1 was deleted: all four are stale
    assert report["notesArchived"] == 2
    assert [get(svc, n.id).status for n in notes] == ["Active", "Active", "Archived", "Archived"]


# --------------------------------------------------------------------------- TTL and decay


@pytest.mark.parametrize("tier", ["Immutable", "Protected", "Standard", "Ephemeral"])
def test_ttl_archives_expired_notes_except_immutable(world, clock, tier):
    expires = clock() - timedelta(hours=1)
    n = put(
        world,
        "provisional",
        direction(50),
        status="Provisional",
        author_type="Agent",
        protection_tier=tier,
        expires_at=expires,
        comments="written in flight",
    )
    live = put(world, "not yet", direction(51), expires_at=clock() + timedelta(days=1))
    report = phases.decay.run(world.context)
    after = get(world, n.id)
    if tier == "Immutable":
        assert after.status == "Provisional" and report["notesExpired"] == 0
    else:
        assert after.status == "Archived" and report["notesExpired"] == 1
        assert after.comments == (
            "written in flight [Archived by Memory Manager: expired on 2026-06-01T11:00:00.000Z]"
        )
    assert get(world, live.id).status == "Active"


def test_ttl_archives_expired_examples(world, clock):
    ex = world.add_example(
        "agent", "in", "out", success_score=90, expires_at=clock() - timedelta(days=1)
    )
    report = phases.decay.run(world.context)
    assert report["examplesExpired"] == 1
    after = world.get_example(ex.id)
    assert after.status == "Archived" and "expired on 2026-05-31T12:00:00.000Z" in after.comments


@pytest.mark.parametrize(
    ("tier", "days", "outcome"),
    [
        ("Standard", 30, "Archived"),
        ("Ephemeral", 30, "Archived"),
        ("Protected", 120, "Active"),
        ("Protected", 400, "Archived"),
        ("Immutable", 400, "Active"),
    ],
)
def test_decay_tiers(world, clock, tier, days, outcome):
    n = put(
        world,
        "old note",
        direction(60),
        importance_score=2.0 if tier != "Protected" else 9.0,
        protection_tier=tier,
        created_at=clock() - timedelta(days=days),
    )
    report = phases.decay.run(world.context)
    after = get(world, n.id)
    assert after.status == outcome
    if outcome == "Archived":
        assert report["notesArchived"] == 1
        assert after.comments.startswith(
            "[Archived by Memory Manager: ImportanceScore decayed to 0."
        )
        assert after.comments.endswith(", below floor 0.5]")
    if tier == "Protected" and days < 365:
        assert report["protectedPreserved"] == 1
    assert report["ephemeralAccelerated"] == (1 if tier == "Ephemeral" else 0)


def test_decay_respects_auto_archive_and_authorship(world, clock):
    world.configure_agent("other", auto_archive_enabled=False)
    opted_out = put(
        world,
        "old",
        direction(61),
        agent_id="other",
        importance_score=1.0,
        created_at=clock() - timedelta(days=60),
    )
    human = put(
        world,
        "old human",
        direction(62),
        is_auto_generated=False,
        importance_score=1.0,
        created_at=clock() - timedelta(days=60),
    )
    fading = put(
        world,
        "fading",
        direction(63),
        importance_score=6.0,
        access_count=0,
        created_at=clock() - timedelta(days=2),
    )
    report = phases.decay.run(world.context)
    assert get(world, opted_out.id).status == "Active"
    assert get(world, human.id).status == "Active"
    after = get(world, fading.id)
    assert after.status == "Active" and after.importance_score < 6.0
    assert report["notesArchived"] == 0
    assert report["decayScoreDistribution"]["max"] < 1


def test_decay_archives_low_scored_examples(world, clock):
    old = world.add_example(
        "agent",
        "in",
        "out",
        success_score=20,
        is_auto_generated=True,
        created_at=clock() - timedelta(days=60),
    )
    good = world.add_example(
        "agent",
        "in2",
        "out2",
        success_score=80,
        is_auto_generated=True,
        created_at=clock() - timedelta(days=60),
    )
    report = phases.decay.run(world.context)
    assert report["examplesArchived"] == 1
    assert world.get_example(old.id).status == "Archived"
    assert world.get_example(old.id).comments.startswith(
        "[Archived by Memory Manager: effective score 0."
    )
    assert world.get_example(good.id).status == "Active"


def test_sample_table_through_the_phases(world, clock):
    """Importance recomputed each maintenance, then decayed once (reference §4.11)."""
    start = clock()
    n = put(world, "The deploy window is Friday", direction(70))
    for day, expected in ((0, 7.0), (3, 5.37), (7, 2.82), (14, 0.93)):
        clock.set(start + timedelta(days=day))
        phases.importance.run(world.context)
        phases.decay.run(world.context)
        after = get(world, n.id)
        assert (after.status, after.importance_score) == ("Active", expected), day
    clock.set(start + timedelta(days=21))
    phases.importance.run(world.context)
    report = phases.decay.run(world.context)
    after = get(world, n.id)
    assert after.status == "Archived" and after.importance_score == 0.34
    assert report["notesArchived"] == 1


# --------------------------------------------------------------------------- trigger and run


def test_trigger_time_is_measured_from_the_last_maintenance(world, clock):
    assert phases.triggers.maintenance_trigger(world.context) == (True, "time")  # never maintained
    assert phases.triggers.maintenance_trigger(world.context, force=True) == (True, "forced")
    use(world, RecordingJudge())
    phases.maintenance_run.run_maintenance(world.context, "time")
    assert phases.triggers.maintenance_trigger(world.context) == (False, "not-triggered")
    # cycles every 15 minutes do not reset the window (reference §6.2 item 1)
    for _ in range(95):
        clock.advance(minutes=15)
        add_cycle(world, clock())
    assert phases.triggers.maintenance_trigger(world.context) == (False, "not-triggered")  # 23h45m
    clock.advance(minutes=15)
    add_cycle(world, clock())
    assert phases.triggers.maintenance_trigger(world.context) == (True, "time")


@pytest.mark.parametrize(
    ("frequency", "expected"),
    [
        ("disabled", (False, "disabled")),
        ("every-run", (True, "every-run")),
        ("weekly?", (True, "every-run")),
    ],
)
def test_trigger_simple_frequencies(world, frequency, expected):
    world.maintenance_config = MaintenanceConfig(frequency=frequency)
    assert phases.triggers.maintenance_trigger(world.context) == expected
    assert phases.triggers.maintenance_trigger(world.context, force=True) == (True, "forced")


def test_trigger_hourly_and_every_n_cycles(world, clock):
    world.maintenance_config = MaintenanceConfig(frequency="hourly")
    phases.maintenance_run.record_maintenance(world.context, "m0", "forced", clock(), {})
    clock.advance(minutes=59)
    assert phases.triggers.maintenance_trigger(world.context) == (False, "not-triggered")
    clock.advance(minutes=1)
    assert phases.triggers.maintenance_trigger(world.context) == (True, "time")

    world.maintenance_config = MaintenanceConfig(frequency=3)
    phases.maintenance_run.record_maintenance(world.context, "m1", "time", clock(), {})
    for _ in range(2):
        clock.advance(minutes=15)
        add_cycle(world, clock())
    assert phases.triggers.maintenance_trigger(world.context) == (False, "not-triggered")
    clock.advance(minutes=15)
    add_cycle(world, clock())
    assert phases.triggers.maintenance_trigger(world.context) == (True, "count")
    world.maintenance_config = MaintenanceConfig(frequency="3")
    assert phases.triggers.maintenance_trigger(world.context) == (True, "count")


def test_trigger_event_counts_new_notes_per_agent(world, clock):
    phases.maintenance_run.record_maintenance(world.context, "m0", "forced", clock(), {})
    clock.advance(hours=1)
    rng = np.random.default_rng(0)

    def add(agent: str, n: int) -> None:
        vecs = rng.normal(size=(n, DIM))
        notes = [
            Note(note=f"{agent} {i}", agent_id=agent, is_auto_generated=True) for i in range(n)
        ]
        world.save_notes(notes, vectors=vecs / np.linalg.norm(vecs, axis=1, keepdims=True))

    add("agent", 99)
    add("other", 99)
    # 198 new notes system-wide would fire the reference; no single agent has 100
    assert phases.triggers.maintenance_trigger(world.context) == (False, "not-triggered")
    world.save_notes([Note(note="human", agent_id="agent")], vectors=np.asarray([direction(1)]))
    assert phases.triggers.maintenance_trigger(world.context) == (False, "not-triggered")  # not auto-generated
    add("agent", 1)
    assert phases.triggers.maintenance_trigger(world.context) == (True, "event")


def test_run_maintenance_runs_all_phases_and_records_the_run(world, clock):
    use(world, RecordingJudge())
    base = direction(80)
    for i in range(3):
        put(world, f"tea {i}", near(base, i), created_at=clock() - timedelta(days=1))
    put(world, "Deploys on Friday", direction(81), created_at=clock() - timedelta(days=20))
    put(
        world,
        "expired",
        direction(82),
        status="Provisional",
        author_type="Agent",
        expires_at=clock() - timedelta(days=1),
    )
    put(world, "orphan", direction(83), user_id="ghost")
    world.add_user("ghost")
    world.delete_user("ghost")
    report = phases.maintenance_run.run_maintenance(world.context, "forced", "run-42")
    assert report["status"] == "Completed" and report["runId"] == "run-42"
    assert report["consolidatedClusters"] == 1 and report["sourceNotesRevoked"] == 3
    assert report["staleNotesPruned"] == 1 and report["notesExpired"] == 1
    assert report["decayArchivedNotes"] == 1  # 20 days old: importance ~3.3, decayed below 0.5
    assert set(report["phases"]) == set(phases.maintenance_run.PHASES)
    assert report.extra["summary"] == (
        " Maintenance: consolidated 1 clusters, resolved 0 contradictions, flagged 0"
        " high-importance contradictions, pruned 1 stale notes, decay-archived 1 notes + 0 examples."
    )
    assert {row["phase"] for row in report.changed} >= {"consolidation", "pruning", "decay"}
    steps = [s["step_name"] for s in world.sources.steps("run-42")]
    for name in phases.maintenance_run.PHASE_STEPS.values():
        assert name in steps
    assert steps.index("Compute Importance Scores") < steps.index("Consolidate Related Notes")
    assert steps.index("Detect Note Contradictions") < steps.index("Prune Stale References")
    with world.sources.begin() as conn:
        rows = (
            conn.execute(select(manager_runs).where(manager_runs.c.kind == "maintenance"))
            .mappings()
            .all()
        )
    assert len(rows) == 1 and rows[0]["status"] == "Completed"
    assert rows[0]["counts"]["run_id"] == "run-42" and rows[0]["counts"]["triggerType"] == "forced"
    assert phases.triggers.last_maintenance_at(world.context) == clock()
    frames = phases.maintenance_run.maintenance_inventory(world.context)
    assert list(frames["last_maintenance"]["phase"]) == list(phases.maintenance_run.PHASES)
    assert_lineage_ok(world)


def test_a_failing_phase_does_not_stop_the_others(world, clock, monkeypatch):
    use(world, RecordingJudge())

    def broken(svc, run_id=None, partition=None):
        raise StoreError("table locked")

    monkeypatch.setattr(phases.pruning, "run", broken)
    with pytest.raises(phases.maintenance_run.MaintenanceError) as info:
        phases.maintenance_run.run_maintenance(world.context, "forced", "run-7")
    report = info.value.report
    assert report["status"] == "Failed" and "pruning" in report["errors"]
    assert "decay" in report["phases"]  # the later phase still ran
    failed = world.sources.steps("run-7", "Prune Stale References")
    assert failed[-1]["status"] == "Failed" and "table locked" in failed[-1]["error_message"]
    assert phases.triggers.last_maintenance_at(world.context) is None  # a failed run does not move the window
    assert phases.triggers.maintenance_trigger(world.context) == (True, "time")


def test_lineage_holds_after_every_phase(world, clock):
    use(world, RecordingJudge())
    base = direction(90)
    for user in ("u1", "u2"):
        for i in range(4):
            put(
                world,
                f"{user} tea {i}",
                near(base, i + (10 if user == "u2" else 0), 0.25),
                user_id=user,
                created_at=clock() - timedelta(days=i + 1),
            )
    base2 = direction(91)
    put(world, "User drinks coffee", near(base2, 1, 0.5), created_at=clock() - timedelta(days=9))
    put(world, "User drinks tea", near(base2, 2, 0.5))
    for phase in (
        phases.importance.run,
        phases.consolidation.run,
        phases.contradictions.run,
        phases.pruning.run,
        phases.decay.run,
    ):
        phase(world)
        assert_lineage_ok(world)
    ids = set(world.notes()["id"])
    for n in world.store.notes.all():
        assert n.consolidated_into_note_id is None or n.consolidated_into_note_id in ids
        assert all(p in ids for p in n.derived_from_note_ids or [])


def test_examples_untouched_by_note_phases(world, clock):
    ex = world.add_example("agent", "in", "out", success_score=90)
    phases.importance.run(world.context)
    phases.pruning.run(world.context)
    assert isinstance(world.get_example(ex.id), Example)
    assert world.get_example(ex.id).status == "Active"


# --------------------------------------------------------------------------- pure helpers


def test_top_neighbours_matches_brute_force_across_blocks():
    from memory_pipelines.phases.clustering import top_neighbours

    rng = np.random.default_rng(3)
    base = rng.normal(size=(57, 16)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:20]
    idx, sims = top_neighbours(
        queries, base, 4, min_similarity=0.1, self_index=np.arange(20), block_elements=100
    )
    full = queries @ base.T
    full[np.arange(20), np.arange(20)] = -np.inf
    for q in range(20):
        want = [j for j in np.argsort(-full[q], kind="stable")[:4] if full[q, j] >= 0.1]
        got = [j for j in idx[q] if j >= 0]
        assert got == want
        assert np.allclose(sims[q, : len(got)], full[q, got])
    empty_idx, _ = top_neighbours(queries[:0], base, 3)
    assert empty_idx.shape == (0, 3)


def test_greedy_clusters_and_chunks():
    from memory_pipelines.phases.clustering import chunk_cluster, greedy_clusters

    nbrs = np.array([[1, 2, -1], [0, 2, -1], [0, 1, 3], [2, -1, -1], [-1, -1, -1]])
    # seed 0 takes 1 and 2; 3 (a neighbour of 2 only) is left alone; 4 has no neighbours
    assert greedy_clusters([0, 1, 2, 3, 4], nbrs, lambda seed: 3) == [[0, 1, 2]]
    # processed notes never seed again, even when their cluster was too small
    assert greedy_clusters([3, 2, 0], nbrs, lambda seed: 3) == []
    assert greedy_clusters([3, 2, 0], nbrs, lambda seed: 2) == [[3, 2], [0, 1]]
    assert chunk_cluster(list(range(6)), 7, 3) == [list(range(6))]
    assert chunk_cluster(list(range(9)), 7, 3) == [list(range(7))]
    assert chunk_cluster(list(range(11)), 7, 3) == [list(range(7)), [7, 8, 9, 10]]


def test_resolve_originals_walks_lineage_once():
    from memory_pipelines.phases.clustering import resolve_originals

    o1, o2, o3 = (Note(id=f"o{i}", note=f"original {i}") for i in range(1, 4))
    g1 = Note(id="g1", note="gen 1", consolidation_count=1, derived_from_note_ids=["o1", "o2"])
    g2 = Note(
        id="g2", note="gen 2", consolidation_count=2, derived_from_note_ids=["g1", "o3", "gone"]
    )
    g3 = Note(id="g3", note="gen 3", consolidation_count=3, derived_from_note_ids=["g2", "g1"])
    lost = Note(
        id="lost", note="parents deleted", consolidation_count=1, derived_from_note_ids=["x"]
    )
    store = {n.id: n for n in (o1, o2, o3, g1, g2)}
    calls: list[list[str]] = []

    def lookup(ids):
        calls.append(list(ids))
        return {i: store[i] for i in ids if i in store}

    found = resolve_originals([g3, lost], lookup)
    assert {n.id for n in found} == {"o1", "o2", "o3", "lost"}
    seen = [i for batch in calls for i in batch]
    assert len(seen) == len(set(seen))  # every id looked up at most once
    shallow = resolve_originals([g3], lookup, max_depth=1)
    assert {n.id for n in shallow} == {"g2", "g1"}


def test_extract_entities():
    from memory_pipelines.phases.clustering import extract_entities, verify_consolidation

    text = "Postgres 15.2 runs on db-01. It was patched on 2026-05-01 and on 3/4/26. Use maxConnections 40%."
    ents = extract_entities([text, "Billing closes Mar 3. We use GraphQL. An API note."])
    for e in (
        "Postgres",
        "15.2",
        "2026-05-01",
        "3/4/26",
        "Use",
        "maxConnections",
        "40%",
        "Mar 3",
        "Billing",
        "GraphQL",
    ):
        assert e in ents, e
    assert "It" not in ents and "We" not in ents and "An" not in ents  # stop words, short words
    assert "2026" not in ents  # part of a date
    check = verify_consolidation([text], "postgres 15.2 on db-01, patched 2026-05-01 and 3/4/26")
    assert set(check.missing) == {"Use", "maxConnections", "40%"}
    assert (
        check.comment() == " [Verification: potentially missing entities: Use, maxConnections, 40%]"
    )


def test_pair_selection_and_resolution_rules():
    from memory_pipelines.phases.contradiction_rules import pair_key, resolve, select_pairs

    seeds = [("a", ["a", "b", "c"]), ("b", ["a", "c"]), ("c", ["d"])]
    assert select_pairs(seeds, 10) == [("a", "b"), ("a", "c"), ("b", "c"), ("c", "d")]
    assert select_pairs(seeds, 2) == [("a", "b"), ("a", "c")]
    assert select_pairs(seeds, 10, skip=lambda key: key == pair_key("c", "b")) == [
        ("a", "b"),
        ("a", "c"),
        ("c", "d"),
    ]
    a = Note(id="a", note="x", importance_score=5.0)
    b = Note(id="b", note="y", importance_score=5.0)
    yes = ContradictionDecision(True, keep_note_id="b", revoke_note_id="a", reason="newer")
    assert resolve(a, b, yes).action == "revoke"
    assert resolve(a, b, ContradictionDecision(False)).action == "none"
    assert (
        resolve(a, b, ContradictionDecision(True, keep_note_id="b", revoke_note_id="z")).action
        == "skip"
    )
    assert resolve(a, b, ContradictionDecision(True, keep_note_id="b")).action == "skip"
    important = (
        a.model_copy(update={"importance_score": 7.0}),
        b.model_copy(update={"importance_score": 7.0}),
    )
    assert resolve(*important, yes).action == "flag"
    assert resolve(a, b.model_copy(update={"protection_tier": "Protected"}), yes).action == "flag"


def test_single_blas_thread_restores_the_thread_count():
    from memory_pipelines.blas import blas_controls, single_blas_thread

    before = [get() for get, _ in blas_controls()]
    with single_blas_thread():
        inside = [get() for get, _ in blas_controls()]
    after = [get() for get, _ in blas_controls()]
    assert all(n == 1 for n in inside)
    assert after == before


def test_single_blas_thread_restores_the_count_once_every_thread_has_left():
    """Blocks of two threads that overlap: the count stays one until the last leaves,
    then comes back (a block restoring on its own exit left the process on one thread
    when it had entered while the other was inside)."""
    import threading

    from memory_pipelines.blas import blas_controls, single_blas_thread

    controls = blas_controls()
    if not controls:
        pytest.skip("no OpenBLAS found in this process")
    before = [get() for get, _ in controls]
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with single_blas_thread():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with single_blas_thread():
        t.start()
        assert entered.wait(10)
    assert [get() for get, _ in controls] == [1] * len(controls)  # the other is inside
    release.set()
    t.join(10)
    assert [get() for get, _ in controls] == before
