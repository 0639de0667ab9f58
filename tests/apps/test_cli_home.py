"""A mistyped home is refused, never created empty: commands that read or change a home
exit 2 with one line naming the path; purging an unknown user changes nothing."""

from __future__ import annotations

import pytest

from memory_pipelines.apps.cli import main

READERS = [
    ["inventory"],
    ["why", "--agent", "a1", "tea"],
    ["notes", "list"],
    ["agents", "list"],
    ["history", "n1"],
    ["export", "--out", "{tmp}/out.jsonl"],
    ["cycle"],
    ["cycle", "--force-maintenance"],
    ["purge-user", "u1"],
    ["keys", "list"],
    ["keys", "revoke", "k1"],
]


@pytest.fixture(autouse=True)
def no_external_stores(monkeypatch):
    for name in ("MEMORY_SQL_URL", "MEMORY_LANCE_URI", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("argv", READERS, ids=lambda a: " ".join(a[:2]))
def test_a_missing_home_is_refused_not_created(tmp_path, capsys, argv):
    typo = tmp_path / "memroy"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, "--home", str(typo)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(typo) in err[0] and "does not exist" in err[0]
    assert not typo.exists()


def test_memory_home_from_the_environment_and_an_empty_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMORY_HOME", str(tmp_path / "nope"))
    assert main(["inventory"]) == 2
    assert str(tmp_path / "nope") in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["inventory", "--home", str(empty)]) == 2
    assert "holds no memory" in capsys.readouterr().err
    assert list(empty.iterdir()) == []


def test_commands_that_create_a_home_still_do(tmp_path, capsys):
    home = tmp_path / "fresh"
    assert main(["keys", "create", "--admin", "--home", str(home)]) == 0
    assert (home / "memory.sqlite3").exists()
    assert main(["keys", "list", "--home", str(home)]) == 0


def test_purging_an_unknown_user_changes_nothing_and_exits_1(
    tmp_path, capsys, monkeypatch, open_service
):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    home = tmp_path / "home"
    with open_service(home, clock=None) as svc:
        svc.add_note("The user likes tea.", agent_id="a1", user_id="alice")
        svc.add_note("The user likes coffee.", agent_id="a1", user_id="bob")
        versions = svc.store.notes.list_versions()
        svc.store.notes.wait_for_compaction()
    assert main(["purge-user", "alcie", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert "alcie" in err and "unknown" in err and "nothing changed" in err
    with open_service(home, clock=None) as svc:
        assert svc.store.notes.list_versions() == versions  # no old version pruned
        assert svc.store.notes.count() == 2
        assert svc.purge_user("alcie")["lance_versions_removed"] == 0
        assert svc.store.notes.list_versions() == versions
        assert svc.purge_user("alice")["notes"] == 1  # a known user is still purged
