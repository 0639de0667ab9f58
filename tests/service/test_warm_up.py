"""``MemoryService.warm_up`` pays what the first injection of a process would otherwise pay
for the whole home (the model's first run, the tables' datasets, the SQL connection), so
that first injection only reads its own scope."""

from __future__ import annotations

import json
import subprocess
import sys

from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.service import MemoryService

AGENT = "agent-1"

FIRST_INJECT = """
import json, sys
from memory_pipelines import MemoryService
from memory_pipelines.embeddings import HashEmbedder
with MemoryService.open(sys.argv[1], embedder=HashEmbedder(dim=64)) as svc:
    if sys.argv[2] == "warm":
        svc.warm_up()
    before = set(sys.modules)
    found = svc.inject({"agent_id": sys.argv[3], "user_id": "u1"}, "tea?")
    print(json.dumps({"notes": [n.note for n in found.notes],
                      "imported": sorted({m.split(".")[0] for m in set(sys.modules) - before})}))
"""


def test_the_first_inject_after_warm_up_does_not_open_the_datasets(home, open_service):
    with open_service(clock=None) as svc:  # the wall clock
        svc.configure_agent(AGENT, note_injection_strategy="Recent")
        ctx = {"agent_id": AGENT, "user_id": "u1", "run_id": "r1"}
        svc.write(ctx, [{"note": "User likes tea."}])
    seen = {}
    for mode in ("cold", "warm"):
        out = subprocess.run(
            [sys.executable, "-c", FIRST_INJECT, str(home), mode, AGENT],
            capture_output=True, text=True, check=True, timeout=300,
        )  # fmt: skip
        seen[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["cold"]["notes"] == seen["warm"]["notes"] == ["User likes tea."]
    assert "lance" in seen["cold"]["imported"]  # what warm_up now pays instead
    # (a background thread of the service may import what it needs meanwhile)
    assert "lance" not in seen["warm"]["imported"]


class CountingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__(dim=64)
        self.calls: list[list[str]] = []

    def embed(self, texts):  # type: ignore[no-untyped-def]
        self.calls.append(list(texts))
        return super().embed(texts)


def test_warm_up_runs_the_model_once_and_leaves_the_home_as_it_was(home, clock):
    embedder = CountingEmbedder()
    with MemoryService.open(home, embedder=embedder, clock=clock) as svc:
        svc.configure_agent(AGENT)
        versions = (svc.store.notes.version, svc.store.examples.version)
        assert svc.warm_up() is None
        assert embedder.calls == [["warm up"]]
        assert (svc.store.notes.version, svc.store.examples.version) == versions
        assert svc.store.notes.count() == 0
