"""`memory-pipelines doctor`: a home whose latest table version names a missing data file
is found out (the file named, the newest readable version, what a restore cannot keep)
and, with --repair, restored so the home reads again; a healthy home is left alone."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

from memory_pipelines.apps.cli import main
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.phases.lease import MANAGER_LEASE
from memory_pipelines.service import MemoryService

pytestmark = pytest.mark.usefixtures("hashing_commands")


def _home(tmp_path, *, break_it: bool):
    home = tmp_path / "home"
    with MemoryService.open(home, embedder=HashEmbedder(dim=64)) as svc:
        svc.store.notes.compact_every = 0
        kept = [svc.add_note(f"The user likes tea number {i}.", agent_id="a1") for i in range(3)]
        late = svc.add_note("The user moved to Lisbon.", agent_id="a1")
        ds = svc.store.notes.lance.to_lance()
    folder = home / "lance" / "notes.lance"
    if break_it:  # what a concurrent cleanup did: the newest version's file is gone
        newest = ds.get_fragments()[-1].metadata.data_files()[0].path
        os.remove(folder / "data" / newest)
    return home, kept, late, ds.version


def test_a_healthy_home_reads_and_nothing_changes(tmp_path, capsys):
    home, _, _, version = _home(tmp_path, break_it=False)
    assert main(["doctor", "--home", str(home), "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"notes: version {version} reads (4 rows)" in out and "restored" not in out


def test_a_missing_data_file_is_named_and_repaired(tmp_path, capsys, open_service):
    home, kept, late, version = _home(tmp_path, break_it=True)
    with MemoryService.open(home, embedder=HashEmbedder(dim=64)) as svc, pytest.raises(Exception, match="Not found"):
        svc.store.notes.all()  # the home cannot be read
    assert main(["doctor", "--home", str(home), "--json"]) == 1
    [notes, _] = json.loads(capsys.readouterr().out)["tables"]
    assert notes["readable"] is False and notes["latest_version"] == version
    assert len(notes["missing_files"]) == 1 and notes["missing_files"][0].startswith("data/")
    assert notes["readable_version"] == version - 1 and notes["lost_unreadable_rows"] == 1

    assert main(["doctor", "--home", str(home)]) == 1
    out = capsys.readouterr().out
    assert "does not read" in out and "cannot keep 1 row(s) in the missing files" in out
    assert "--repair" in out

    assert main(["doctor", "--home", str(home), "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"restored version {version - 1} as version {version + 1}; it reads: yes" in out
    with open_service(home, clock=None) as svc:
        assert sorted(n.id for n in svc.store.notes.all()) == sorted(n.id for n in kept)
        assert svc.get_note(late.id) is None  # what the doctor said it could not keep
        svc.add_note("Writes work again.", agent_id="a1")
    assert main(["doctor", "--home", str(home)]) == 0


def test_repair_waits_for_no_memory_manager_run(tmp_path, capsys, open_service):
    home, _, _, version = _home(tmp_path, break_it=True)
    with open_service(home, clock=None) as svc:
        svc.sources.take_lease(MANAGER_LEASE, "host:1:run", svc.now() + timedelta(minutes=5))
        assert main(["doctor", "--home", str(home), "--repair"]) == 1
        assert "holds this home" in capsys.readouterr().out
        assert svc.store.notes.latest_version() == version  # nothing restored
        svc.sources.release_lease(MANAGER_LEASE, "host:1:run")


def test_a_missing_home_is_refused(tmp_path, capsys):
    assert main(["doctor", "--home", str(tmp_path / "nope")]) == 2
    assert not (tmp_path / "nope").exists()
