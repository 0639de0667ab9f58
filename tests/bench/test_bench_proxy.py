"""``memory-pipelines bench proxy`` runs end to end and reports the added latency and the
tokens the proxy adds per turn, before and after, with and without a budget."""

from __future__ import annotations

import re

import pytest

from memory_pipelines.bench import proxy


@pytest.mark.slow  # about 15 s: it starts the stub, the proxy and litellm
def test_bench_proxy_reports_latency_and_tokens_per_turn(capsys):
    assert proxy.main(["--requests", "2", "--notes", "8", "--embedder", "hash",
                       "--max-injected-tokens", "200"]) == 0
    out = capsys.readouterr().out
    assert "added by proxy" in out and "tokens the proxy adds per turn" in out

    def mean(label: str) -> float:
        line = next(row for row in out.splitlines() if label in row)
        return float(re.findall(r"\d+(?:\.\d+)?", line.split("|")[-2])[0])

    before = mean("before: injection + JSON-field instructions")
    after = mean("after: injection + chat instructions")
    budget = mean("after, --max-injected-tokens 200")
    assert budget <= 200 < after < before
