"""The memory proxy's added latency over a direct call to the same upstream.

``memory-pipelines bench proxy [--requests 200] [--notes 200] [--embedder minilm|hash]
[--stream] [--max-injected-tokens 300]``

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

Then the tokens the proxy adds per turn (the system message the upstream receives),
counted by the proxy's token counter: "before", the injection with the JSON-field
write instructions the proxy sent until it asked for a trailing block; "after", what
the timed turns sent (the shorter chat instructions); and, with the budget of
``--max-injected-tokens``, what a proxy with that budget sends for the same turns.
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

    from memory_pipelines.litellm_loader import import_litellm

    litellm = import_litellm()

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


def _tokens(svc: Any, stub: Any, stub_url: str, turns: int, budget: int) -> list[list[Any]]:
    """Tokens of the system message per turn: before, after, and after with ``budget``."""
    import openai

    from memory_pipelines.apps.http import serving_in_thread
    from memory_pipelines.apps.proxy import create_app
    from memory_pipelines.apps.proxy.tokens import token_counter

    counter = token_counter()
    after = [counter.count(r["messages"][0]["content"]) for r in stub.requests
             if r["messages"] and r["messages"][0]["role"] == "system"][-turns:]
    instructions = svc.write_instructions(AGENT)
    before = []
    for i in range(turns):
        ctx = {"agent_id": AGENT, "user_id": "u1", "run_id": f"tokens-{i}", "conversation_id": "bench-conv"}
        message = svc.inject(ctx, f"question {i}: which option for task {i % 23}?").message
        before.append(counter.count("\n\n".join(p for p in (message, instructions) if p)))
    upstream = {"api_base": stub_url + "/v1", "api_key": "sk-bench"}
    budgeted = []
    with serving_in_thread(create_app(svc, "openai/stub", upstream=upstream, max_injected_tokens=budget)) as url:
        via = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        for i in range(turns):
            via.chat.completions.create(
                model="stub", messages=[{"role": "user", "content": f"question {i}: which option for task {i % 23}?"}],
                extra_headers={"X-Memory-Agent": AGENT, "X-Memory-User": "u1", "X-Memory-Run": f"budget-{i}",
                               "X-Memory-Conversation": "bench-conv"},
            )
            budgeted.append(counter.count(stub.requests[-1]["messages"][0]["content"]))
    rows = []
    for name, values in (
        ("before: injection + JSON-field instructions", before),
        ("after: injection + chat instructions", after),
        (f"after, --max-injected-tokens {budget}", budgeted),
    ):
        rows.append([name, len(values), min(values), _pct(values, 0.5), max(values), statistics.fmean(values)])
    return rows


def run(
    requests: int, notes: int, embedder: Embedder, stream: bool, compact: bool = True,
    budget: int = 300, token_rows: list[list[Any]] | None = None,
) -> list[list[Any]]:
    """Measure and return the table rows (ms); the token rows go to ``token_rows``."""
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
                if token_rows is not None:
                    token_rows.extend(_tokens(svc, stub.state, stub_url, min(requests, 50), budget))
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
    parser.add_argument(
        "--max-injected-tokens", type=int, default=300,
        help="the token budget of the budgeted token row (default: 300)",
    )
    args = parser.parse_args(argv)
    if args.requests < 1 or args.notes < 0 or args.max_injected_tokens < 1:
        parser.error("--requests and --max-injected-tokens must be positive and --notes not negative")
    embedder: Embedder = MiniLMEmbedder() if args.embedder == "minilm" else HashEmbedder(384)
    token_rows: list[list[Any]] = []
    rows = run(args.requests, args.notes, embedder, args.stream, compact=not args.no_compact,
               budget=args.max_injected_tokens, token_rows=token_rows)
    mode = "streaming" if args.stream else "non-streaming"
    table = "added one by one" if args.no_compact else "compacted"
    print(f"proxy latency, {mode}, {args.notes} notes ({table}), embedder {args.embedder} (ms)")
    print(tabulate(rows, headers=["path", "n", "p50", "p95", "mean"], tablefmt="github", floatfmt=".2f"))
    from memory_pipelines.apps.proxy.tokens import token_counter

    print()
    print(f"tokens the proxy adds per turn (system message; counted with {token_counter().name})")
    print(tabulate(token_rows, headers=["system message", "turns", "min", "p50", "max", "mean"],
                   tablefmt="github", floatfmt=".0f"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
