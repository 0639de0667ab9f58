"""The LanceDB/pylance internals the store relies on (memory_pipelines.store.lance_internals):
each is named here, so an upgrade that moves or drops one fails in this file, by name."""

from __future__ import annotations

import importlib
from pathlib import Path

import lancedb
import pyarrow as pa
import pytest

from memory_pipelines.store import lance_internals as li


@pytest.mark.parametrize("name", li.INTERNALS)
def test_each_internal_name_still_resolves(name):
    module, path = name.split(":")
    obj = importlib.import_module(module)
    for part in path.split("."):
        assert hasattr(obj, part), f"{name}: {module} no longer has {part!r} (LanceDB/pylance upgrade?)"
        obj = getattr(obj, part)


def test_no_other_module_imports_a_lance_internal():
    """Only the fence names them: the rest of the store goes through it."""
    root = Path(li.__file__).resolve().parents[1]
    needles = ("background_loop", "lance.optimize", "LanceOperation", "read_transaction")
    offenders = [
        f"{p.relative_to(root)}: {n}"
        for p in root.rglob("*.py")
        if p.name != "lance_internals.py"
        for n in needles
        if n in p.read_text(encoding="utf-8")
    ]
    assert not offenders, offenders


@pytest.fixture
def table(tmp_path):
    db = lancedb.connect(tmp_path / "db")
    t = db.create_table("t", pa.table({"id": ["a"], "text": ["one apple"]}))
    for i in range(3):  # four small fragments to compact
        t.add(pa.table({"id": [f"b{i}"], "text": [f"pear {i}"]}))
    return t


def test_the_internals_work_on_a_real_table(table):
    # the async table and LanceDB's loop
    native = li.async_table(table)
    assert native is not None
    assert li.run_on_lancedb_loop(native.count_rows()) == 4
    # a compaction: plan, execute, commit, then a Rewrite in the transaction log
    ds = table.to_lance()
    layout = li.fragment_layout(ds)
    assert [f[0] for f in layout] == [0, 1, 2, 3] and all(f[4] == 1 for f in layout)
    assert layout == li.fragment_layout(table.to_lance())  # the same version: equal
    assert li.fragment_layout(ds.checkout_version(1)) == layout[:1]  # before the appends
    compaction = li.compaction()
    options = {"target_rows_per_fragment": 1024}
    plan = compaction.plan(ds, options)
    rewrites = [task.execute(ds) for task in plan.tasks]
    written = [p for r in rewrites for p in li.rewritten_local_files(r)]
    folder = Path(table.uri.removeprefix("file://"))
    assert written and all((folder / li.DATA_DIR / p).is_file() for p in written)
    before = ds.version
    compaction.commit(ds, rewrites, options)
    ds = table.to_lance()
    ds = ds.checkout_version(ds.latest_version)
    assert ds.version > before
    assert any(li.is_rewrite(ds, v) for v in range(before + 1, ds.version + 1))
    assert not li.is_rewrite(ds, 2)  # an append
    assert set(written) <= li.data_file_paths(ds)
    table.delete("id = 'b0'")  # a deletion file: another layout of the same files
    assert li.fragment_layout(table.to_lance()) != li.fragment_layout(ds)
    # a delete leaves a deletion file in its folder
    table.delete("id = 'b0'")
    ds = table.to_lance()
    assert any(li.has_deletion_file(f) for f in ds.get_fragments())
    assert any((folder / li.DELETIONS_DIR).iterdir())
