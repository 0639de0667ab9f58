"""The memory proxy's added latency over a direct call to the same upstream.

``memory-pipelines bench proxy [--requests 200] [--notes 200] [--embedder minilm|hash]
[--stream]``

A scripted OpenAI-compatible stub (:mod:`memory_pipelines.apps.openai_stub`, answering "ok"
at once) and the proxy in front of it (``openai/stub``) run on loopback in this process,
over a fresh memory home whose agent has ``--notes`` Active notes of one user. The
official ``openai`` client then sends the same ``--requests`` chat completions (distinct
user texts, so the embedding cache never hits) directly to the stub and through the
proxy, interleaved, each turn a new run of the same conversation. Reported: p50/p95/mean
wall time per request of both and the added latency (proxy minus direct), which is the
proxy's own work: the key check, the injection (embedding the last user message and the
scoped search), the write instructions, the litellm call and the recording of the turn;
then, as same-run baselines, ``svc.inject`` alone and a bare litellm call to the stub.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

from memory_pipelines.embeddings import Embedder, HashEmbedder, MiniLMEmbedder

AGENT = "bench-agent"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _parts(svc: Any, stub_url: str, requests: int) -> tuple[list[float], list[float]]:
    """The same run's baselines: ``svc.inject`` alone (fresh texts) and a bare litellm
    call to the stub (what the proxy adds beside its own HTTP hop and recording)."""
    import asyncio

    import litellm

    ctx = {"agent_id": AGENT, "user_id": "u1", "run_id": "parts", "conversation_id": "bench-conv"}
    inject_ms = []
    for i in range(requests):
        t0 = time.perf_counter()
        svc.inject(ctx, f"another question {i}: which option for task {i % 23}?")
        inject_ms.append((time.perf_counter() - t0) * 1000)

    async def calls() -> list[float]:
        out = []
        for _ in range(requests):
            t0 = time.perf_counter()
            await litellm.acompletion(
                model="openai/stub", api_base=stub_url + "/v1", api_key="x", max_retries=0,
                messages=[{"role": "user", "content": "hi"}],
            )
            out.append((time.perf_counter() - t0) * 1000)
        return out

    return inject_ms, asyncio.run(calls())


def run(
    requests: int, notes: int, embedder: Embedder, stream: bool, compact: bool = True
) -> list[list[Any]]:
    """Measure and return the table rows (ms)."""
    import openai

    from memory_pipelines.apps.http import serving_in_thread
    from memory_pipelines.apps.openai_stub import create_stub_app
    from memory_pipelines.apps.proxy import create_app
    from memory_pipelines.service import MemoryService

    with tempfile.TemporaryDirectory() as tmp, MemoryService.open(Path(tmp) / "home", embedder=embedder) as svc:
        svc.configure_agent(AGENT)
        for i in range(notes):
            svc.add_note(f"User fact number {i}: prefers option {i % 17} for task {i % 23}.",
                         agent_id=AGENT, user_id="u1")
        if compact:
            # as the daily maintenance leaves it: one add per note leaves one fragment per
            # note, and injection over many fragments is slow (issue 14, not the proxy)
            svc.store.optimize()
        stub = create_stub_app()
        with serving_in_thread(stub) as stub_url:
            upstream = {"api_base": stub_url + "/v1", "api_key": "sk-bench"}
            with serving_in_thread(create_app(svc, "openai/stub", upstream=upstream)) as proxy_url:
                direct = openai.OpenAI(base_url=stub_url + "/v1", api_key="x", max_retries=0)
                via = openai.OpenAI(base_url=proxy_url + "/v1", api_key="x", max_retries=0)

                def once(client: openai.OpenAI, i: int, headers: dict[str, str]) -> float:
                    messages = [{"role": "user", "content": f"question {i}: which option for task {i % 23}?"}]
                    t0 = time.perf_counter()
                    if stream:
                        for _ in client.chat.completions.create(
                            model="stub", messages=messages, stream=True, extra_headers=headers
                        ):
                            pass
                    else:
                        client.chat.completions.create(model="stub", messages=messages, extra_headers=headers)
                    return (time.perf_counter() - t0) * 1000

                for i in range(5):  # warm up both paths (imports, connections, caches)
                    once(direct, -i - 1, {})
                    once(via, -i - 1, {"X-Memory-Agent": AGENT, "X-Memory-Run": f"warm-{i}"})
                d_ms, p_ms = [], []
                for i in range(requests):
                    d_ms.append(once(direct, i, {}))
                    p_ms.append(once(via, i, {
                        "X-Memory-Agent": AGENT, "X-Memory-User": "u1", "X-Memory-Run": f"run-{i}",
                        "X-Memory-Conversation": "bench-conv",
                    }))
                inject_ms, litellm_ms = _parts(svc, stub_url, requests)
    added = [p - d for p, d in zip(p_ms, d_ms, strict=True)]
    rows = []
    for name, values in (
        ("direct to stub", d_ms), ("through proxy", p_ms), ("added by proxy", added),
        ("  of which: svc.inject alone", inject_ms), ("  of which: litellm call alone", litellm_ms),
    ):
        rows.append([name, len(values), _pct(values, 0.5), _pct(values, 0.95), statistics.fmean(values)])
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``memory-pipelines bench proxy [options]``."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench proxy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=200, help="requests per path")
    parser.add_argument("--notes", type=int, default=200, help="Active notes of the agent's user")
    parser.add_argument("--embedder", choices=["minilm", "hash"], default="minilm")
    parser.add_argument("--stream", action="store_true", help="streaming requests")
    parser.add_argument(
        "--no-compact",
        action="store_true",
        help="measure over the notes as added one by one (one fragment each) instead of "
        "compacted as the daily maintenance leaves them",
    )
    args = parser.parse_args(argv)
    if args.requests < 1 or args.notes < 0:
        parser.error("--requests must be positive and --notes not negative")
    embedder: Embedder = MiniLMEmbedder() if args.embedder == "minilm" else HashEmbedder(384)
    rows = run(args.requests, args.notes, embedder, args.stream, compact=not args.no_compact)
    mode = "streaming" if args.stream else "non-streaming"
    table = "added one by one" if args.no_compact else "compacted"
    print(f"proxy latency, {mode}, {args.notes} notes ({table}), embedder {args.embedder} (ms)")
    print(tabulate(rows, headers=["path", "n", "p50", "p95", "mean"], tablefmt="github", floatfmt=".2f"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
