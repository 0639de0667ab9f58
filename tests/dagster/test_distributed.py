"""Running the Memory Manager jobs on a distributed executor (dagster-dask, local cluster).

Fast: ``MEMORY_EXECUTOR`` picks the executor and its config, bad values fail naming the
variable, ``execute_in_process`` ignores the choice, a local cluster passes its env to
worker processes. Slow: the demo home's cycle and maintenance jobs run with ``dagster job
execute`` on a 2-worker local Dask cluster, their steps run in the worker processes and
leave the note table as an in-process run does; an unreachable scheduler fails the run
clearly; ``memory-pipelines dask-cluster`` serves until SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest
from distributed import Client
from reliability_helpers import refused_port, run_bounded, wait_for_output

from memory_pipelines import MemoryService
from memory_pipelines.apps.dask_cluster import local_dask_cluster
from memory_pipelines.apps.demo import CYCLE_JOB, MAINTENANCE_JOB, dagster_home, seed
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import ConfigError, MemoryPipelineError
from memory_pipelines.jobs.dask_executor import (
    MemoryDaskExecutor,
    StepEvents,
    execute_step_on_worker,
)
from memory_pipelines.jobs.executors import (
    DASK_ADDRESS_VAR,
    DASK_WORKERS_VAR,
    EXECUTOR_VAR,
    dask_executor_config,
    executor_from_env,
)

ROOT = Path(__file__).resolve().parents[2]
#: A guard against a hung ``dagster job execute``, far above a run's time on a busy machine
#: (a demo job takes ~20 s on a quiet 2-core one): a slow machine is not a failure.
JOB_TIMEOUT = 600
DAGSTER = str(Path(sys.executable).with_name("dagster"))


@pytest.fixture
def no_executor_env(monkeypatch):
    for var in (EXECUTOR_VAR, DASK_ADDRESS_VAR, DASK_WORKERS_VAR):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _config(executor: dg.ExecutorDefinition) -> dict:
    """The config a configured executor gives itself when the run config is empty."""
    resolved = executor.config_schema.resolve_config({})
    assert resolved.success, resolved.errors
    return resolved.value["config"]


# --------------------------------------------------------------------------- selection


@pytest.mark.parametrize("value", [None, "", "  ", "in_process", "IN_PROCESS"])
def test_unset_empty_or_in_process_selects_the_in_process_executor(no_executor_env, value):
    if value is not None:
        no_executor_env.setenv(EXECUTOR_VAR, value)
    executor = executor_from_env()
    assert executor is dg.in_process_executor and executor.name == "in_process"


def test_multiprocess_selects_dagsters_multiprocess_executor(no_executor_env):
    no_executor_env.setenv(EXECUTOR_VAR, "multiprocess")
    executor = executor_from_env()
    assert executor is dg.multiprocess_executor and executor.name == "multiprocess"


def test_dask_with_an_address_connects_to_that_scheduler(no_executor_env):
    no_executor_env.setenv(EXECUTOR_VAR, "dask")
    no_executor_env.setenv(DASK_ADDRESS_VAR, " tcp://10.1.2.3:8786 ")
    no_executor_env.setenv(DASK_WORKERS_VAR, "5")  # ignored with an address
    executor = executor_from_env()
    assert executor.name == "dask"
    assert _config(executor) == {"cluster": {"existing": {"address": "tcp://10.1.2.3:8786"}}}


def test_dask_without_an_address_starts_a_local_cluster_per_run(no_executor_env):
    no_executor_env.setenv(EXECUTOR_VAR, "dask")
    local = _config(executor_from_env())["cluster"]["local"]
    assert local["n_workers"] == 2 and local["threads_per_worker"] == 1
    assert local["processes"] is True and local["host"] == "127.0.0.1"
    assert local["dashboard_address"].startswith("127.0.0.1:")
    assert local["scheduler_kwargs"] == {"dashboard": False}

    no_executor_env.setenv(DASK_WORKERS_VAR, "3")
    assert _config(executor_from_env())["cluster"]["local"]["n_workers"] == 3
    # an explicit mapping is read instead of os.environ
    config = dask_executor_config({DASK_ADDRESS_VAR: "tcp://127.0.0.1:1"})
    assert config == {"cluster": {"existing": {"address": "tcp://127.0.0.1:1"}}}


@pytest.mark.parametrize("workers", ["two", "0", "-1"])
def test_a_bad_worker_count_names_the_variable(no_executor_env, workers):
    no_executor_env.setenv(EXECUTOR_VAR, "dask")
    no_executor_env.setenv(DASK_WORKERS_VAR, workers)
    with pytest.raises(ConfigError, match=f"{DASK_WORKERS_VAR}='{workers}'"):
        executor_from_env()


def test_an_unknown_executor_names_the_variable_the_value_and_the_choices(no_executor_env):
    no_executor_env.setenv(EXECUTOR_VAR, "celery")
    with pytest.raises(MemoryPipelineError) as info:
        executor_from_env()
    assert isinstance(info.value, ConfigError)
    message = str(info.value)
    assert "MEMORY_EXECUTOR='celery'" in message
    for choice in ("in_process", "multiprocess", "dask"):
        assert choice in message


def test_dask_without_the_extra_says_what_to_install(no_executor_env):
    no_executor_env.setenv(EXECUTOR_VAR, "dask")
    # as if dagster-dask were not installed (the executor module is imported afresh)
    no_executor_env.delitem(sys.modules, "memory_pipelines.jobs.dask_executor", raising=False)
    no_executor_env.setitem(sys.modules, "dagster_dask", None)
    no_executor_env.setitem(sys.modules, "dagster_dask.executor", None)
    with pytest.raises(ConfigError, match=r"memory-pipelines\[distributed\]") as info:
        executor_from_env()
    assert isinstance(info.value.__cause__, ImportError)


def test_execute_in_process_ignores_the_dask_executor(no_executor_env):
    # the address is never contacted: execute_in_process always runs in this process
    no_executor_env.setenv(EXECUTOR_VAR, "dask")
    no_executor_env.setenv(DASK_ADDRESS_VAR, "tcp://127.0.0.1:9")

    @dg.op
    def where() -> int:
        return os.getpid()

    @dg.job(executor_def=executor_from_env())
    def job():
        where()

    result = job.execute_in_process()
    assert result.success and result.output_for_node("where") == os.getpid()


def test_the_dask_executor_supports_existing_and_local_clusters_only():
    with pytest.raises(ConfigError, match="'ssh'"):
        MemoryDaskExecutor("ssh", {})
    assert MemoryDaskExecutor("existing", {"address": "tcp://127.0.0.1:1"}).cluster_type == (
        "existing"
    )


def test_a_step_after_a_failed_step_is_not_executed():
    # the payload is never read: an upstream task without STEP_SUCCESS stops the step
    result = execute_step_on_worker([StepEvents(())], payload=None)  # type: ignore[arg-type]
    assert result == StepEvents(()) and not result.succeeded


# --------------------------------------------------------------------------- local cluster


def test_local_cluster_rejects_bad_sizes_before_starting():
    with pytest.raises(ConfigError, match="n_workers"), local_dask_cluster(0):
        pass
    with pytest.raises(ConfigError, match="threads_per_worker"):
        with local_dask_cluster(1, threads_per_worker=0):
            pass


def test_local_cluster_runs_worker_processes_that_see_the_given_env(tmp_path):
    env = {"MEMORY_HOME": str(tmp_path), "MEMORY_EXECUTOR": "dask"}
    with local_dask_cluster(1, env=env) as address:
        assert address.startswith("tcp://127.0.0.1:")
        with Client(address) as client:
            seen = client.run(
                lambda: (
                    os.getpid(),
                    os.environ.get("MEMORY_HOME"),
                    os.environ.get("MEMORY_EXECUTOR"),
                    os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP"),
                )
            )
            info = client.scheduler_info()
    ((pid, home, executor, cost_map),) = seen.values()
    assert pid != os.getpid()
    assert (home, executor, cost_map) == (str(tmp_path), "dask", "True")
    ((worker,),) = [list(info["workers"].values())]
    assert worker["nthreads"] == 1
    assert not psutil.pid_exists(pid)  # the worker process ended with the cluster


# --------------------------------------------------------------------------- end to end


def _job_env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (EXECUTOR_VAR, DASK_ADDRESS_VAR, DASK_WORKERS_VAR, "MEMORY_LLM_MODEL")
    }
    env.update(
        MEMORY_HOME=str(home),
        DAGSTER_HOME=str(home / "dagster"),
        MEMORY_EMBEDDING_MODEL="hash",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        DAGSTER_DISABLE_TELEMETRY="1",
    )
    env.update(extra)
    return env


def _dagster_execute(job: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    proc = run_bounded(
        [DAGSTER, "job", "execute", "-m", "memory_pipelines.definitions", "-j", job],
        env=env,
        cwd=ROOT,
        timeout=JOB_TIMEOUT,
    )
    return proc, time.perf_counter() - started


def _note_states(home: Path) -> list[tuple]:
    with MemoryService.open(home, embedder=HashEmbedder()) as svc:
        notes = svc.notes()
    cols = ["note", "type", "status", "author_type", "agent_id", "user_id", "company_id"]
    return sorted(notes[cols].fillna("-").itertuples(index=False, name=None))


@pytest.fixture
def demo_home(tmp_path, monkeypatch):
    """A seeded demo home (hash embedder, offline judge) with its Dagster instance."""
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    monkeypatch.delenv("MEMORY_LLM_MODEL", raising=False)
    home = tmp_path / "demo"
    with MemoryService.from_env(home) as svc:
        seed(svc, progress_bar=False)
    dagster_home(home)
    return home


@pytest.mark.slow
def test_demo_jobs_run_their_steps_in_dask_worker_processes(demo_home, tmp_path, monkeypatch):
    # the reference: the same seeded home, both jobs executed in process
    reference = tmp_path / "reference"
    shutil.copytree(demo_home, reference)
    from memory_pipelines.jobs.runs import execute_jobs

    monkeypatch.delenv(EXECUTOR_VAR, raising=False)
    ref_runs = execute_jobs(
        str(reference), [CYCLE_JOB, MAINTENANCE_JOB], str(reference / "dagster")
    )
    assert [r.success for r in ref_runs] == [True, True]
    before = _note_states(demo_home)
    assert any(state[2] == "Provisional" for state in before)

    env = _job_env(demo_home, MEMORY_EXECUTOR="dask")
    with local_dask_cluster(2, env=env) as address:
        with Client(address) as client:
            worker_pids = set(client.run(os.getpid).values())
        assert len(worker_pids) == 2 and os.getpid() not in worker_pids
        for job in (CYCLE_JOB, MAINTENANCE_JOB):
            proc, _ = _dagster_execute(job, {**env, DASK_ADDRESS_VAR: address})
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with Client(address) as client:  # the same workers are still there
            assert set(client.run(os.getpid).values()) == worker_pids

    with dg.DagsterInstance.from_config(str(demo_home / "dagster")) as instance:
        runs = {r.job_name: r for r in instance.get_runs()}
        assert set(runs) == {CYCLE_JOB, MAINTENANCE_JOB}
        materialized: dict[str, set[str]] = {}
        for job, run in runs.items():
            assert run.status == dg.DagsterRunStatus.SUCCESS
            events = [e.dagster_event for e in instance.all_logs(run.run_id) if e.dagster_event]
            driver = {e.pid for e in events if e.event_type == dg.DagsterEventType.RUN_START}
            assert driver and not driver & worker_pids
            step_starts = [e for e in events if e.event_type == dg.DagsterEventType.STEP_START]
            step_pids = {e.pid for e in step_starts}
            assert step_starts and step_pids <= worker_pids, (step_pids, worker_pids)
            materializations = [
                e for e in events if e.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION
            ]
            assert {e.pid for e in materializations} <= worker_pids
            materialized[job] = {e.asset_key.to_user_string() for e in materializations}
    assert {"extracted_notes", "hardened_notes"} <= materialized[CYCLE_JOB]
    assert {"note_importance", "decayed_notes", "note_inventory"} <= materialized[MAINTENANCE_JOB]

    after = _note_states(demo_home)
    assert after == _note_states(reference)
    assert after != before and not any(state[2] == "Provisional" for state in after)
    statuses = {(state[0], state[2]) for state in after}
    assert ("Team uses Python 3.10 for every service.", "Revoked") in statuses
    assert sum(state[3] == "MemoryManager" for state in after) >= 8  # extracted notes


@pytest.mark.slow
def test_an_unreachable_scheduler_fails_the_run_naming_the_address(tmp_path):
    home = tmp_path / "empty"
    dagster_home(home)
    with refused_port() as port:  # held bound for the run: nothing can listen there
        address = f"tcp://127.0.0.1:{port}"
        env = _job_env(
            home,
            MEMORY_EXECUTOR="dask",
            MEMORY_DASK_ADDRESS=address,
            DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="2s",
        )
        proc, _ = _dagster_execute(CYCLE_JOB, env)
    assert proc.returncode != 0
    assert f"could not reach the Dask scheduler at {address}" in proc.stdout + proc.stderr
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.FAILURE


@pytest.mark.slow
def test_dask_cluster_command_serves_until_sigterm(tmp_path):
    env = {**os.environ, "MEMORY_HOME": str(tmp_path)}
    # stdout goes to a file read whole after each poll: no pipe reader can buffer lines
    # past the one it returned and lose them to a second reader
    out_path = tmp_path / "cluster.out"
    with out_path.open("w") as out_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memory_pipelines.apps.cli",
                "dask-cluster",
                "--workers",
                "1",
                "--port",
                "0",
            ],
            env=env,
            cwd=ROOT,
            stdout=out_file,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        started = wait_for_output(
            proc, out_path, lambda text: "MEMORY_DASK_ADDRESS=" in text, timeout=120
        )
        first = started.splitlines()[0]
        assert first.startswith("Dask scheduler at tcp://127.0.0.1:"), started
        address = first.split()[3]
        with Client(address, timeout=20) as client:
            homes = set(client.run(lambda: os.environ.get("MEMORY_HOME")).values())
        assert homes == {str(tmp_path)}
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        out = out_path.read_text()
        assert proc.returncode == 0, out
        assert f"MEMORY_DASK_ADDRESS={address}" in out and "stopping" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


TOY_JOBS = """
import os
from pathlib import Path

import dagster as dg

from memory_pipelines.jobs.executors import executor_from_env


@dg.op
def first() -> int:
    return os.getpid()


@dg.op
def broken() -> int:
    raise RuntimeError("broken on purpose")


@dg.op
def second(context: dg.OpExecutionContext, x: int) -> int:
    Path(os.environ["TOY_MARKS"], context.run_id).write_text(str(os.getpid()))
    return x


@dg.op
def side() -> int:
    return os.getpid()


@dg.job(executor_def=executor_from_env())
def toy():
    second(first())
    side()


@dg.job(executor_def=executor_from_env())
def toy_failing():
    second(broken())
    side()


defs = dg.Definitions(jobs=[toy, toy_failing])
"""


@pytest.mark.slow
def test_concurrent_runs_keep_their_own_steps_and_a_failed_step_stops_its_successors(
    tmp_path,
):
    jobs_file = tmp_path / "toy_jobs.py"
    jobs_file.write_text(TOY_JOBS)
    marks = tmp_path / "marks"
    marks.mkdir()
    home = tmp_path / "home"
    dagster_home(home)
    env = _job_env(home, MEMORY_EXECUTOR="dask", TOY_MARKS=str(marks))
    with local_dask_cluster(2, env=env) as address:
        env[DASK_ADDRESS_VAR] = address

        def launch(job: str) -> subprocess.Popen:
            return subprocess.Popen(
                [DAGSTER, "job", "execute", "-f", str(jobs_file), "-j", job],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # killed as a group if it hangs (see finish)
            )

        def finish(proc: subprocess.Popen) -> tuple[int, str]:
            try:
                _, err = proc.communicate(timeout=JOB_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                _, err = proc.communicate()
                raise AssertionError(
                    f"a toy run did not finish in {JOB_TIMEOUT}s:\n{err[-3000:]}"
                ) from None
            return proc.returncode, err

        # one run alone first: two processes creating the first run of a job on a fresh
        # SQLite instance race on inserting its snapshot (Dagster's storage, not the
        # executor), which a deployment's daemon never does
        rc, err = finish(launch("toy"))
        assert rc == 0, err
        # two runs of one job at once: with dagster-dask's run-independent task keys the
        # second would receive the first's results and execute nothing
        both = [launch("toy"), launch("toy")]
        outcomes = [finish(p) for p in both]
        assert [rc for rc, _ in outcomes] == [0, 0], outcomes
        rc, _ = finish(launch("toy_failing"))
        assert rc != 0

    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        runs = instance.get_runs()
        toy_runs = [r for r in runs if r.job_name == "toy"]
        assert len(toy_runs) == 3
        for run in toy_runs:
            assert run.status == dg.DagsterRunStatus.SUCCESS
            started = {
                e.dagster_event.step_key
                for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)
            }
            assert started == {"first", "second", "side"}
        assert {p.name for p in marks.iterdir()} == {r.run_id for r in toy_runs}

        (failed,) = [r for r in runs if r.job_name == "toy_failing"]
        assert failed.status == dg.DagsterRunStatus.FAILURE
        started = {
            e.dagster_event.step_key
            for e in instance.all_logs(failed.run_id, of_type=dg.DagsterEventType.STEP_START)
        }
        assert started == {"broken", "side"}  # `second` never ran


@pytest.mark.slow
def test_partitioned_maintenance_on_a_dask_cluster_matches_the_whole_pool_job(tmp_path):
    """``bench partitions`` on a small pool: every agent partition's maintenance run
    succeeds on a 2-worker Dask cluster, two at a time; they do exactly what the same
    runs do one after another in process, and consolidate, resolve and prune what the
    unpartitioned job does on a copy of the pool (under its per-run caps)."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = run_bounded(
        [
            sys.executable, "-m", "memory_pipelines.bench.partitions",
            "--agents", "2", "--per-agent", "1500", "--dim", "64", "--workers", "2",
            "--json", str(out),
        ],
        env=env, timeout=3 * JOB_TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    baseline, sequential, partitioned = json.loads(out.read_text())
    assert [r["mode"] for r in (baseline, sequential, partitioned)] == [
        "baseline", "sequential", "partitions",
    ]  # fmt: skip
    assert partitioned["runs"] == 4 and partitioned["ok"] == 4  # agent-0/1, retired, _shared
    assert partitioned["did"] == sequential["did"]  # concurrency changes nothing
    for phase in ("consolidated_notes", "resolved_contradictions", "pruned_notes"):
        assert partitioned["did"][phase] == baseline["did"][phase], phase
    assert baseline["did"]["consolidated_notes"] > 0 and baseline["did"]["pruned_notes"] > 0
