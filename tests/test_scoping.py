"""The scope lattice and the multi-tenant matcher as pure functions (reference §3.3)."""

from __future__ import annotations

import itertools

import pytest

from memory_pipelines.errors import ConfigError
from memory_pipelines.notes import Note
from memory_pipelines.scope import (
    LEVEL_LABELS,
    ScopeValidationError,
    SecondaryScopeConfig,
    dimensions_match,
    in_lattice,
    lattice_level,
    matches_multi_tenant,
    multi_tenant_prefilter,
    note_scope_filter,
    parse_scopes,
    post_filter_needed,
    resolve_run_scopes,
    scope_label,
)

A, U, C = "agent-a", "user-u", "company-c"
OTHER = "other"


@pytest.mark.parametrize(
    ("note", "level", "label"),
    [
        ((A, U, C), 1, "Agent + User + Company specific"),
        ((A, U, None), 2, "Agent + User specific"),
        ((A, None, C), 3, "Agent + Company specific"),
        ((None, U, C), 4, "User + Company specific"),
        ((A, None, None), 5, "Agent-specific"),
        ((None, U, None), 6, "User-specific"),
        ((None, None, C), 7, "Company-wide"),
        ((None, None, None), 8, "Global"),
    ],
)
def test_eight_levels_have_their_number_and_label(note, level, label):
    assert lattice_level(*note) == level
    assert (
        scope_label(Note(note="x", agent_id=note[0], user_id=note[1], company_id=note[2])) == label
    )
    assert in_lattice(*note, A, U, C)


def test_all_levels_match_a_full_run_and_nothing_foreign_does():
    values = {"agent": (A, None, OTHER), "user": (U, None, OTHER), "company": (C, None, OTHER)}
    for a, u, c in itertools.product(*values.values()):
        expected = OTHER not in (a, u, c)
        assert in_lattice(a, u, c, A, U, C) is expected, (a, u, c)


def test_absent_user_or_company_means_null_never_anyone():
    # no user in the run: a note of any user is invisible (reference §6.2 item 3)
    assert not in_lattice(A, U, None, A, None, None)
    assert not in_lattice(None, U, None, A, None, C)
    assert not in_lattice(A, None, C, A, U, None)
    assert in_lattice(A, None, None, A, None, None)
    assert in_lattice(None, None, None, A, None, None)


def test_shared_only_hides_every_user_note():
    assert not in_lattice(A, U, None, A, U, C, shared_only=True)
    assert in_lattice(A, None, C, A, U, C, shared_only=True)
    sql = note_scope_filter(A, U, C, shared_only=True).sql
    assert "`user_id` IS NULL" in sql and U not in sql


def test_filter_renders_each_dimension_as_equal_or_null():
    sql = note_scope_filter(A, None, C).sql
    assert "`agent_id` = 'agent-a'" in sql and "`agent_id` IS NULL" in sql
    assert "`user_id` IS NULL" in sql and "user-u" not in sql
    assert "`company_id` = 'company-c'" in sql
    hostile = note_scope_filter(A, "u' OR '1'='1", None).sql
    assert "'u'' OR ''1''=''1'" in hostile


def test_labels_cover_all_eight_combinations():
    assert len({label for _, label in LEVEL_LABELS.values()}) == 8


def test_secondary_labels():
    org = Note(note="x", primary_scope_record_id="org-1")
    user = Note(note="x", primary_scope_record_id="org-1", secondary_scopes={"contact": "c1"})
    assert scope_label(org) == "Company-level"
    assert scope_label(user) == "User-specific (most specific)"


# --------------------------------------------------------------------------- multi-tenant

CASCADE = SecondaryScopeConfig.from_value({"dimensions": [{"name": "team"}, {"name": "contact"}]})
STRICT_CONTACT = SecondaryScopeConfig.from_value(
    {"dimensions": [{"name": "team"}, {"name": "contact", "inheritanceMode": "strict"}]}
)


def match(
    note_primary, note_secondary, run_primary, run_secondary, config=CASCADE, entities=(None, None)
):
    return matches_multi_tenant(
        entities[0], note_primary, note_secondary, entities[1], run_primary, run_secondary, config
    )


def test_global_notes_always_match():
    assert match(None, None, None, None)
    assert match(None, "{}", "org", {"team": "t"})


def test_run_without_primary_sees_only_global_notes():
    assert not match("org", None, None, None)
    assert not match(None, {"team": "t"}, None, {"team": "t"})


def test_allow_secondary_only():
    cfg = SecondaryScopeConfig.from_value({"allowSecondaryOnly": True})
    assert match(None, {"team": "t"}, None, {"team": "t"}, cfg)
    assert not match(None, {"team": "t"}, None, {"team": "x"}, cfg)
    assert not match("org", {"team": "t"}, None, {"team": "t"}, cfg)  # a primary never matches
    assert not match(None, {"team": "t"}, None, None, cfg)  # needs run secondary scopes


def test_primary_must_be_equal_and_org_level_notes_match():
    assert match("org", None, "org", None)
    assert not match("org-2", None, "org", None)
    assert not match(None, {"team": "t"}, "org", {"team": "t"})
    assert not match("org", None, "org", None, entities=("Accounts", "Contacts"))
    assert match("org", None, "org", None, entities=("Accounts", None))


def test_secondary_note_needs_run_secondary():
    assert not match("org", {"team": "t"}, "org", None)


def test_cascading_fails_only_on_a_different_run_value():
    assert match("org", {"team": "t"}, "org", {"team": "t", "contact": "c"})
    assert match("org", {"team": "t"}, "org", {"contact": "c"})  # run lacks the dimension
    assert not match("org", {"team": "t"}, "org", {"team": "x"})


def test_strict_needs_the_same_value_and_the_dimension_on_the_note():
    assert match("org", {"contact": "c"}, "org", {"contact": "c"}, STRICT_CONTACT)
    assert not match("org", {"contact": "c"}, "org", {"team": "t"}, STRICT_CONTACT)
    # a strict run dimension must be on the note
    assert not match("org", {"team": "t"}, "org", {"team": "t", "contact": "c"}, STRICT_CONTACT)
    # org-level notes (no secondary) still match
    assert match("org", None, "org", {"contact": "c"}, STRICT_CONTACT)


def test_array_run_values_and_string_comparison():
    assert match("org", {"team": 7}, "org", {"team": ["3", "7"]})
    assert not match("org", {"team": 8}, "org", {"team": ["3", "7"]})
    assert dimensions_match({"n": 1}, {"n": "1"}, CASCADE)


def test_default_inheritance_mode_strict():
    cfg = SecondaryScopeConfig.from_value({"defaultInheritanceMode": "strict"})
    assert not match("org", {"team": "t"}, "org", {"contact": "c"}, cfg)
    assert cfg.mode_for("anything") == "strict"


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", '{"team": {"nested": 1}}', '"text"'])
def test_malformed_note_json_never_matches(bad):
    assert not match("org", bad, "org", {"team": "t"})
    with pytest.raises(ValueError):
        parse_scopes(bad)


def test_malformed_config_is_a_config_error():
    with pytest.raises(ConfigError):
        SecondaryScopeConfig.from_value({"dimensions": "team"})
    with pytest.raises(ConfigError):
        SecondaryScopeConfig.from_value(
            {"dimensions": [{"name": "t", "inheritanceMode": "sideways"}]}
        )
    with pytest.raises(ConfigError):
        SecondaryScopeConfig.from_value("{nope")


def test_strict_validation_and_defaults():
    cfg = SecondaryScopeConfig.from_value(
        {
            "strictValidation": True,
            "dimensions": [
                {"name": "team", "required": True},
                {"name": "region", "defaultValue": "eu"},
            ],
        }
    )
    assert resolve_run_scopes({"team": "t"}, cfg) == {"team": "t", "region": "eu"}
    with pytest.raises(ScopeValidationError):
        resolve_run_scopes({"region": "us"}, cfg)
    with pytest.raises(ScopeValidationError):
        resolve_run_scopes({"team": "t", "colour": "red"}, cfg)
    lax = SecondaryScopeConfig.from_value({"dimensions": [{"name": "team", "required": True}]})
    assert resolve_run_scopes({"colour": "red"}, lax) == {"colour": "red"}


def test_prefilter_is_exact_without_run_scopes():
    assert not post_filter_needed(None, None)
    sql = multi_tenant_prefilter(None, None).sql
    assert "`primary_scope_record_id` IS NULL" in sql and "`secondary_scopes` IS NULL" in sql
    with_primary = multi_tenant_prefilter("org", None).sql
    assert "'org'" in with_primary
    assert post_filter_needed("org", None) and post_filter_needed(None, {"team": "t"})
    assert "secondary_scopes" not in multi_tenant_prefilter("org", {"team": "t"}).sql
