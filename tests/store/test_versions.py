"""The latest version of a local table, read from its ``_versions`` folder without a
checkout (:class:`~memory_pipelines.store.versions.LatestVersion`): commits of this
and other connections, cleanup, a recreated table, V1 names, an unreadable folder."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa

from memory_pipelines.notes import Note
from memory_pipelines.store import NoteStore
from memory_pipelines.store.versions import LatestVersion

DIM = 4


def _add(store: NoteStore, i: int) -> None:
    store.notes.add([Note(id=f"n{i}", note=f"note {i}")], np.ones((1, DIM), dtype=np.float32))


def test_it_follows_commits_of_this_and_another_connection(tmp_path):
    uri = str(tmp_path / "lance")
    mine, other = NoteStore(uri, DIM, compact_every=0), NoteStore(uri, DIM, compact_every=0)
    probe = LatestVersion(str(Path(uri) / "notes.lance" / "_versions"))
    assert probe.get() == mine.notes.version
    _add(mine, 1)
    _add(other, 2)
    _add(other, 3)
    assert probe.get() == mine.notes.version == other.notes.version
    assert mine.notes.latest_version() == mine.notes.version


def test_it_survives_cleanup_and_a_recreated_table(tmp_path):
    uri = str(tmp_path / "lance")
    store = NoteStore(uri, DIM, compact_every=0)
    folder = str(Path(uri) / "notes.lance" / "_versions")
    probe = LatestVersion(folder)
    for i in range(5):
        _add(store, i)
    seen = probe.get()
    store.notes.lance.to_lance().cleanup_old_versions(older_than=timedelta(0))
    assert LatestVersion(folder).get() == seen  # the latest stays (a fresh one lists)
    assert probe.get() == seen
    _add(store, 9)
    assert probe.get() == seen + 1
    # dropped and created again: the version it knew is gone, so it lists the folder
    db = lancedb.connect(uri)
    db.drop_table("notes")
    db.create_table("notes", schema=store.notes.schema)
    assert probe.get() == 1 == LatestVersion(folder).get()


def test_v1_manifest_names_and_an_unreadable_folder(tmp_path):
    import lance

    path = str(tmp_path / "v1.lance")
    ds = lance.write_dataset(pa.table({"a": [1]}), path, enable_v2_manifest_paths=False)
    probe = LatestVersion(str(Path(path) / "_versions"))
    assert probe.get() == ds.version == 1
    for _ in range(3):
        ds = lance.write_dataset(pa.table({"a": [2]}), path, mode="append")
    assert probe.get() == ds.version == 4
    assert LatestVersion(str(tmp_path / "missing")).get() is None
    (tmp_path / "empty").mkdir()
    assert LatestVersion(str(tmp_path / "empty")).get() is None
