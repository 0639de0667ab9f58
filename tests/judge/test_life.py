"""The offline judge's life-fact rules: each family keeps durable first-person facts and
leaves small talk, reactions and talk addressed to the other speaker alone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.judge import ConversationMessage, OfflineJudge
from memory_pipelines.judge.life import LIFE_FAMILIES, resolve_dates

SENT = datetime(2024, 3, 14, 16, 0, tzinfo=UTC)  # a Thursday


def said(judge: OfflineJudge, text: str, sent_at: datetime | None = SENT):
    msg = ConversationMessage("user", text, message_id="m1", sent_at=sent_at)
    return [(c.content, c.rule) for c in judge.extract_notes([msg], [], rating_context="positive")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "I ran my first half marathon yesterday!",
            ("User ran their first half marathon on 13 March 2024.", "dated_event"),
        ),
        (
            "Sold my old bike last week.",
            ("User sold their old bike in the week before 14 March 2024.", "dated_event"),
        ),
        (
            "I visited my grandparents in Lisbon last month.",
            ("User visited their grandparents in Lisbon in February 2024.", "dated_event"),
        ),
        (
            "We had fun. I adopted a kitten last Saturday",
            ("User adopted a kitten on 9 March 2024.", "pet"),
        ),
        (
            "I'm training for a triathlon this summer.",
            ("User is training for a triathlon this summer.", "ongoing"),
        ),
        (
            "I'm planning to open a bakery downtown.",
            ("User is planning to open a bakery downtown.", "plan"),
        ),
        ("I plan to study nursing in Ohio.", ("User plans to study nursing in Ohio.", "plan")),
        (
            "I've been playing the cello since high school.",
            ("User has been playing the cello since high school.", "habit"),
        ),
        (
            "I volunteer at the animal shelter on weekends.",
            ("User volunteers at the animal shelter on weekends.", "habit"),
        ),
        (
            "My daughter just started kindergarten.",
            ("User's daughter just started kindergarten.", "family"),
        ),
        (
            "My brother works as a firefighter.",
            ("User's brother works as a firefighter.", "family"),
        ),
        ("My cat loves sleeping on the piano.", ("User's cat loves sleeping on the piano.", "pet")),
        ("I'm allergic to shellfish.", ("User is allergic to shellfish.", "health")),
    ],
)
def test_life_facts_become_third_person_context_notes(judge, text, expected):
    assert said(judge, text) == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "I'm doing great, thanks for asking!",
        "I'm so excited for you!",
        "I will send you the photos soon.",
        "I'm going to keep pushing, no matter what.",
        "I hope to see you soon.",
        "I got it, that makes sense.",
        "My mom says hi.",
        "I'm learning a ton.",
        "I went there too!",
        "Wow, I never thought of that.",
        "My friends and I laughed so much.",
    ],
)
def test_small_talk_and_reactions_are_not_life_facts(judge, text):
    assert said(judge, text) == []


def test_a_relative_date_without_a_message_time_is_not_kept(judge):
    assert said(judge, "I ran my first half marathon yesterday!", sent_at=None) == []


def test_ephemeral_requests_stay_ignored_even_with_a_message_time(judge):
    assert said(judge, "For this report, use a line chart today.") == []
    assert said(judge, "Right now I prefer a quick summary.") == []


def test_preference_rules_come_before_life_rules(judge):
    assert said(judge, "I love Python but I hate Java.") == [
        ("User loves Python.", "preference"),
        ("User dislikes Java.", "preference"),
    ]


def test_families_can_be_switched_off():
    only = OfflineJudge(HashEmbedder(dim=64), life_rules={"pet"})
    assert said(only, "I ran my first half marathon yesterday!") == []
    assert said(only, "My cat loves sleeping on the piano.") == [
        ("User's cat loves sleeping on the piano.", "pet")
    ]
    assert set(LIFE_FAMILIES) >= {
        "dated_event",
        "ongoing",
        "plan",
        "habit",
        "family",
        "pet",
        "health",
    }


@pytest.mark.parametrize(
    ("phrase", "expected"),
    [
        ("yesterday", "on 13 March 2024"),
        ("today", "on 14 March 2024"),
        ("last night", "on 13 March 2024"),
        ("tomorrow", "on 15 March 2024"),
        ("last week", "in the week before 14 March 2024"),
        ("last weekend", "on the weekend before 14 March 2024"),
        ("last month", "in February 2024"),
        ("next month", "in April 2024"),
        ("last year", "in 2023"),
        ("last Monday", "on 11 March 2024"),
        ("last Thursday", "on 7 March 2024"),
        ("two weeks ago", "around 29 February 2024"),
    ],
)
def test_relative_dates_resolve_from_the_message_time(phrase, expected):
    assert resolve_dates(f"it happened {phrase}", SENT) == f"it happened {expected}"
    assert resolve_dates(f"it happened {phrase}", None) == f"it happened {phrase}"
