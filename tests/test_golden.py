"""The refactor guard: the demo's note table, rendered injections, audit rows and the
Dagster asset keys, compared byte for byte with a recorded golden file.

The demo is seeded on a fixed clock, then one forced Memory Manager cycle runs (every
phase), a week passes and a second cycle runs (TTL and decay). Ids the code generates
(uuid note ids) are replaced by their order of first appearance, so the comparison
sees behaviour, not randomness. Regenerate with ``MEMORY_UPDATE_GOLDEN=1`` only for an
intended change of behaviour, and say so in the commit."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import sqlalchemy as sa

from memory_pipelines import MemoryService, RunContext
from memory_pipelines.apps.demo import AGENTS, USERS, seed
from memory_pipelines.clock import FakeClock
from memory_pipelines.embeddings import HashEmbedder

GOLDEN = Path(__file__).parent / "golden"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
HEX_ID = re.compile(r"\b[0-9a-f]{32}\b")
#: Columns that measure time spent, not behaviour.
TIMING = re.compile(r"(duration|elapsed|_ms$|_seconds$|seconds)")
#: The same inside JSON text (reports, audit payloads): ``"durationMs": 37.8``.
TIMING_VALUE = re.compile(
    r'(\\?"[A-Za-z_]*(?:Ms|Seconds|_ms|_seconds|duration)\\?":\s*)-?[0-9][0-9.e+-]*'
)
#: LanceDB table version numbers count commits, not behaviour (batching writes changes them).
VERSION_VALUE = re.compile(r'(\\?"[A-Za-z_]*Versions?(?:Before|After|Kept)\\?":\s*)[0-9]+')
#: Cosine similarities in audit payloads, cut to 4 decimals: the 6th moves with the float
#: rounding of the encoder's kernels (numpy or ONNX Runtime, and the CPU's), which is not
#: behaviour (0.979051 against 0.97905 for one pair). Cut, not rounded: that value lies on
#: a rounding boundary at 4 decimals too.
SIMILARITY_VALUE = re.compile(r'(\\?"similarity\\?":\s*-?[0-9]+\.[0-9]{4})[0-9]+')
#: Tables that hold secrets or nothing the refactor touches.
SKIPPED_TABLES = {"api_keys", "alembic_version"}  # secrets; the schema revision (not data)
QUESTIONS = {
    "code-helper": "Which Python version should the new service use?",
    "support-desk": "The customer asks about their refund and preferred channel.",
    "travel-planner": "Plan a trip to Lisbon next month with a window seat.",
}


class _Ids:
    """Replaces generated ids by ``id-<n>`` in order of first appearance."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            return self.seen.setdefault(m.group(0), f"id-{len(self.seen) + 1}")

        return HEX_ID.sub(sub, UUID.sub(sub, text))


def _plain(value):
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and value != value:
        return None
    return value


def _snapshot(svc: MemoryService) -> dict:
    snap: dict = {}
    notes = svc.notes().drop(columns=["vector"], errors="ignore")
    notes = notes.sort_values(["created_at", "note", "status"], kind="stable")
    snap["notes"] = [
        {k: _plain(v) for k, v in sorted(row.items())} for row in notes.to_dict("records")
    ]
    examples = svc.examples().drop(columns=["vector"], errors="ignore")
    examples = examples.sort_values(["created_at", "example_input"], kind="stable")
    snap["examples"] = [
        {k: _plain(v) for k, v in sorted(row.items())} for row in examples.to_dict("records")
    ]
    injections = {}
    for user_id, (company_id, _name) in sorted(USERS.items()):
        for agent_id in sorted(AGENTS):
            ctx = RunContext(
                agent_id=agent_id,
                run_id=f"golden-{agent_id}-{user_id}",
                user_id=user_id,
                company_id=company_id,
            )
            injections[f"{agent_id}/{user_id}"] = svc.inject(ctx, QUESTIONS[agent_id]).message
    snap["injections"] = injections
    tables = {}
    engine = svc.sources.engine
    with engine.connect() as conn:
        for name in sorted(sa.inspect(engine).get_table_names()):
            if name in SKIPPED_TABLES:
                continue
            rows = conn.execute(sa.text(f'SELECT * FROM "{name}" ORDER BY rowid')).mappings()
            tables[name] = [  # insertion order: what the code did, in the order it did it
                {k: _plain(v) for k, v in sorted(r.items()) if not TIMING.search(k)}
                for r in rows
            ]
    snap["tables"] = tables
    return snap


def _asset_keys() -> list[str]:
    from memory_pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    return sorted(k.to_user_string() for k in graph.get_all_asset_keys())


def _run_demo(home: Path, embedder) -> dict:
    clock = FakeClock()
    with MemoryService.open(home, embedder=embedder, clock=clock) as svc:
        seed(svc, progress_bar=False)
        before = _snapshot(svc)
        first = svc.manager.run_cycle(force_maintenance=True)
        after_cycle = _snapshot(svc)
        clock.advance(days=8)
        second = svc.manager.run_cycle(force_maintenance=True)
        after_week = _snapshot(svc)
    got = {
        "seeded": before,
        "cycle": json.loads(json.dumps(first, sort_keys=True, default=str)),
        "after_cycle": after_cycle,
        "second_cycle": json.loads(json.dumps(second, sort_keys=True, default=str)),
        "after_week": after_week,
        "asset_keys": _asset_keys(),
    }
    text = json.dumps(got, indent=1, sort_keys=True, default=str, ensure_ascii=False)
    text = VERSION_VALUE.sub(r"\g<1>0", TIMING_VALUE.sub(r"\g<1>0", _Ids()(text)))
    text = SIMILARITY_VALUE.sub(r"\g<1>", text)
    return json.loads(text)


def _check(name: str, got: dict) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(got, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if os.environ.get("MEMORY_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        import difflib

        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), "golden", "now", n=2
            )
        )
        pytest.fail(f"{name}: behaviour changed\n{diff[:6000]}")


def test_demo_golden_with_the_hashing_embedder(tmp_path, monkeypatch):
    monkeypatch.delenv("MEMORY_LLM_MODEL", raising=False)
    _check("demo-hash", _run_demo(tmp_path / "home", HashEmbedder(dim=64)))


def test_demo_golden_with_the_real_embedder(tmp_path, monkeypatch, minilm):
    monkeypatch.delenv("MEMORY_LLM_MODEL", raising=False)
    _check("demo-minilm", _run_demo(tmp_path / "home", minilm))
