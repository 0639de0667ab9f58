"""Partitioned maintenance on a Dask cluster: wall time with 1 and 2 workers.

``memory-pipelines bench partitions [--agents 8] [--per-agent 20000] [--workers 1 2]
[--runs-at-once 2] [--dim 384] [--seed 0] [--json FILE]`` builds one synthetic pool (the
maintenance benchmark's pool generator with exactly ``--agents`` agents: 8 x 20k = 160k
notes by default), then, each time on a fresh copy of it:

1. **baseline**: the unpartitioned ``memory_maintenance`` job (the five phases over the
   whole pool, then compaction and the inventory) in one process, in-process executor;
2. **one after another**: the ``memory_maintenance_by_agent`` job for every partition
   (each agent, ``agent-retired`` and ``_shared``), one run after the other in one
   process, in-process executor: the same work as the Dask modes, with no parallelism;
3. for each worker count N: the same partition runs, ``--runs-at-once`` in flight at a
   time (a pool of launcher processes, like a run queue), their steps executed by a
   local Dask cluster of N single-threaded worker processes (``MEMORY_EXECUTOR=dask``
   with ``MEMORY_DASK_ADDRESS``).

The per-run caps (200 stale notes, 1000 decayed notes, 50 contradiction pairs) apply per
partition run, so the partitioned modes do more of the capped work than the baseline;
mode 2 is the like-for-like reference for the Dask modes. Each mode runs in its own
Python process (the executor is chosen when the definitions are imported) with its own
Dagster instance. Reported: wall seconds from the first submission to the last run's
end (launcher processes and the cluster are started before the clock starts; cluster
start-up is reported separately), runs and outcomes, what the phases did in total, and
the ratios. The service clock is the real one in every mode.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tabulate import tabulate

MAINTENANCE_JOB = "memory_maintenance"
PARTITIONED_JOB = "memory_maintenance_by_agent"
TRIGGER_TAG = "memory/maintenance_trigger"
DAGSTER_YAML = "telemetry:\n  enabled: false\n"
#: what the phases did, summed over the runs (materialization metadata of each phase)
DID = {
    "note_importance": "notes_scored",
    "consolidated_notes": "consolidated_cluster_count",
    "resolved_contradictions": "contradictions_resolved",
    "pruned_notes": "notes_archived",
    "decayed_notes": "notes_archived",
}


def build_pool(home: Path, agents: int, per_agent: int, dim: int, seed: int) -> dict[str, Any]:
    """The maintenance benchmark's pool with exactly ``agents`` agents, in ``home``."""
    from memory_pipelines.bench.maintenance import NOW, PoolBuilder
    from memory_pipelines.clock import FakeClock
    from memory_pipelines.embeddings import HashEmbedder
    from memory_pipelines.service import MemoryService

    with MemoryService.open(home, embedder=HashEmbedder(dim), clock=FakeClock(NOW)) as svc:
        builder = PoolBuilder(
            svc, agents * per_agent, dim, seed, progress_bar=False, n_agents=agents
        )
        counts = builder.build()
        svc.store.optimize()
        svc.store.notes.ensure_scalar_indexes(("agent_id", "status", "user_id", "company_id"))
        agent_ids = [a.agent_id for a in svc.sources.list_agents()]
    return {"counts": counts, "agents": agent_ids}


def _totals(executions: list[Any]) -> dict[str, int]:
    """What the phases did, summed over runs (each a ``definitions.JobExecution``)."""
    did: dict[str, int] = {}
    for execution in executions:
        for asset, metadata in execution.materializations.items():
            name = asset.split("/")[-1]
            value = metadata.get(DID.get(name, ""))
            if value is not None:
                did[name] = did.get(name, 0) + int(value)
    return did


def _outcome(executions: list[Any], wall: float) -> dict[str, Any]:
    return {
        "wall": wall,
        "runs": len(executions),
        "ok": sum(1 for e in executions if e.success),
        "did": _totals(executions),
    }


def drive(mode: str, workers: int, dagster_home: Path, runs_at_once: int = 2) -> dict[str, Any]:
    """Run one mode in this process (MEMORY_HOME and, for partitions, the Dask variables
    are already in the environment) and return its timings."""
    from memory_pipelines.jobs.runs import add_partitions, execute_jobs
    from memory_pipelines.partitions import partition_keys
    from memory_pipelines.service import MemoryService

    home = os.environ["MEMORY_HOME"]
    with MemoryService.open(home) as svc:
        keys = partition_keys(a.agent_id for a in svc.sources.list_agents())
    tags = {TRIGGER_TAG: "forced"}
    if mode == "baseline":
        t0 = time.perf_counter()
        executions = execute_jobs(home, [MAINTENANCE_JOB], str(dagster_home), tags)
        return _outcome(executions, time.perf_counter() - t0)
    add_partitions(str(dagster_home), keys)
    if mode == "sequential":
        t0 = time.perf_counter()
        executions = [
            run
            for key in keys
            for run in execute_jobs(home, [PARTITIONED_JOB], str(dagster_home), tags, key)
        ]
        return _outcome(executions, time.perf_counter() - t0)
    # each run needs a process of its own, so runs go to a pool of launcher processes,
    # warmed up before the clock starts, like a run queue with ``runs_at_once`` concurrent
    # runs; their steps go to the Dask workers
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=runs_at_once, mp_context=context, initializer=_warm_launcher
    ) as pool:
        list(pool.map(_settle, range(runs_at_once)))
        t0 = time.perf_counter()
        executions = list(pool.map(_run_partition, keys))
        wall = time.perf_counter() - t0
    return {**_outcome(executions, wall), "runs_at_once": runs_at_once}


def _warm_launcher() -> None:
    """Import what a run needs once per launcher process (not timed)."""
    import memory_pipelines.jobs.runs  # noqa: F401


def _settle(_: int) -> None:
    time.sleep(1.0)  # every launcher process starts (and imports) before timing


def _run_partition(key: str) -> Any:
    """One partition's maintenance run, executed by the job's (Dask) executor."""
    from memory_pipelines.jobs.runs import execute_partition_run

    return execute_partition_run(PARTITIONED_JOB, key, {TRIGGER_TAG: "forced"})


def _run_mode(
    mode: str, workers: int, pool: Path, work: Path, runs_at_once: int = 2
) -> dict[str, Any]:
    """Copy the pool, then drive ``mode`` in a fresh Python process."""
    home = work / f"{mode}-{workers}"
    shutil.copytree(pool, home)
    dagster_home = work / f"{mode}-{workers}-dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)
    env = {
        **os.environ,
        "MEMORY_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "MEMORY_EMBEDDING_MODEL": os.environ.get("BENCH_EMBEDDING_MODEL", "hash:384"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MEMORY_EXECUTOR": "dask" if mode == "partitions" else "in_process",
    }
    out = work / f"{mode}-{workers}.json"
    cmd = [
        sys.executable,
        "-m",
        "memory_pipelines.bench.partitions",
        "--drive",
        mode,
        "--workers",
        str(workers),
        "--out",
        str(out),
        "--dagster-home",
        str(dagster_home),
        "--runs-at-once",
        str(runs_at_once),
    ]
    subprocess.run(cmd, env=env, check=True)
    return json.loads(out.read_text())


def _drive_main(
    mode: str, workers: int, out: Path, dagster_home: Path, runs_at_once: int = 2
) -> int:
    result: dict[str, Any] = {"mode": mode, "workers": workers}
    if mode == "partitions":
        from memory_pipelines.apps.dask_cluster import local_dask_cluster

        env = {k: os.environ[k] for k in ("MEMORY_HOME", "DAGSTER_HOME", "MEMORY_EMBEDDING_MODEL")}
        env["MEMORY_EXECUTOR"] = "dask"
        t0 = time.perf_counter()
        with local_dask_cluster(workers, env=env) as address:
            result["cluster_start"] = time.perf_counter() - t0
            os.environ["MEMORY_DASK_ADDRESS"] = address
            os.environ["MEMORY_EXECUTOR"] = "dask"
            result.update(drive(mode, workers, dagster_home, runs_at_once))
    else:
        result["cluster_start"] = 0.0
        result.update(drive(mode, workers, dagster_home))
    out.write_text(json.dumps(result))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench partitions", description=main.__doc__
    )
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--per-agent", type=int, default=20_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--runs-at-once",
        type=int,
        default=2,
        help="partition runs in flight at once (launcher processes; default 2)",
    )
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--drive", choices=["baseline", "sequential", "partitions"], help=argparse.SUPPRESS
    )
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dagster-home", type=Path, help=argparse.SUPPRESS)
    return parser


def _run_all(args: argparse.Namespace) -> list[dict]:
    """Build the pool, then the unpartitioned job, the partitions one after another in
    process, and the partitions on each number of Dask workers; their results."""
    work = Path(tempfile.mkdtemp(prefix="bench-partitions-"))
    try:
        pool = work / "pool"
        t0 = time.perf_counter()
        built = build_pool(pool, args.agents, args.per_agent, args.dim, args.seed)
        print(
            f"pool: {built['counts'].get('notes')} notes, agents {len(built['agents'])} "
            f"(incl. agent-retired), built in {time.perf_counter() - t0:.1f}s",
            flush=True,
        )
        os.environ["BENCH_EMBEDDING_MODEL"] = f"hash:{args.dim}"
        results = [_run_mode("baseline", 1, pool, work)]
        print(f"baseline: {results[0]['wall']:.1f}s", flush=True)
        results.append(_run_mode("sequential", 1, pool, work))
        print(f"partitions one after another, in process: {results[-1]['wall']:.1f}s", flush=True)
        for n in args.workers:
            results.append(_run_mode("partitions", n, pool, work, args.runs_at_once))
            print(f"partitions, {n} worker(s): {results[-1]['wall']:.1f}s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def _result_row(r: dict, base: float) -> list:
    label = {
        "baseline": "unpartitioned job, in process",
        "sequential": "by agent, one run after another, in process",
    }.get(r["mode"], f"by agent, {r['workers']} Dask worker(s)")
    did = r["did"]
    return [
        label,
        f"{r['ok']}/{r['runs']}",
        round(r["wall"], 1),
        round(r["wall"] / base, 2),
        round(r.get("cluster_start", 0.0), 1),
        did.get("note_importance", 0),
        did.get("consolidated_notes", 0),
        did.get("resolved_contradictions", 0),
        did.get("pruned_notes", 0),
        did.get("decayed_notes", 0),
    ]


def _print_results(results: list[dict]) -> None:
    base = results[0]["wall"]
    print()
    print(
        tabulate(
            [_result_row(r, base) for r in results],
            headers=[
                "mode", "runs ok", "wall s", "vs baseline", "cluster start s",
                "scored", "clusters", "contradictions", "pruned", "decay-archived",
            ],
        )
    )  # fmt: skip
    by_workers = {r["workers"]: r["wall"] for r in results if r["mode"] == "partitions"}
    sequential = results[1]["wall"]
    print()
    for n, wall in sorted(by_workers.items()):
        print(f"{n} Dask worker(s) / one after another in process: {wall / sequential:.2f}")
    if 1 in by_workers and 2 in by_workers:
        print(f"2 workers / 1 worker wall-time ratio: {by_workers[2] / by_workers[1]:.2f}")


def main(argv: list[str] | None = None) -> int:
    """``memory-pipelines bench partitions``: partitioned maintenance with 1 and 2 Dask
    workers against the unpartitioned job."""
    args = _parser().parse_args(argv)
    if args.drive:
        return _drive_main(
            args.drive, args.workers[0], args.out, args.dagster_home, args.runs_at_once
        )
    results = _run_all(args)
    _print_results(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["ok"] == r["runs"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
