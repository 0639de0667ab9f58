"""A local Dask cluster (one scheduler and N worker processes on 127.0.0.1) for running
the Memory Manager jobs with the ``dask`` executor, and ``memory-pipelines dask-cluster``.

:func:`local_dask_cluster` starts a ``distributed.LocalCluster`` bound to the loopback
interface with worker *processes* (each under a nanny), no dashboard on the scheduler or
the workers (the scheduler's health/metrics HTTP server takes a free loopback port), and
yields the scheduler address (``tcp://127.0.0.1:PORT``); the cluster is
closed when the block exits. Nothing listens beyond loopback and nothing is fetched.

Worker processes see the environment given as ``env`` on top of the environment of the
process that starts the cluster: the nanny applies ``env`` in the worker process before
the worker runs any task (and again whenever it restarts a worker), so a variable read
when a task imports the definitions (``MEMORY_HOME``, ``MEMORY_EXECUTOR``,
``LITELLM_LOCAL_MODEL_COST_MAP``...) always has the given value. The steps of a Dagster
run resolve ``EnvVar("MEMORY_HOME")`` in the worker, so the workers must see the same
memory home as the process that launches the run.

``memory-pipelines dask-cluster --workers N [--port P]`` runs such a cluster in the
foreground until SIGTERM or SIGINT and prints its address; point ``MEMORY_DASK_ADDRESS``
at it and set ``MEMORY_EXECUTOR=dask``. Workers keep the modules they imported, so
restart the cluster after changing the code.

This module needs the optional ``distributed`` extra (``pip install
'memory-pipelines[distributed]'``); it does not import Dagster.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from memory_pipelines.errors import ConfigError

#: The interface every scheduler and worker of :func:`local_dask_cluster` binds to.
LOOPBACK = "127.0.0.1"

#: Where the scheduler's HTTP server (health and metrics routes only: the dashboard is
#: off) listens. ``dashboard_address=None`` would still bind it, to port 8787.
SCHEDULER_HTTP_ADDRESS = f"{LOOPBACK}:0"

#: Set in every worker unless ``env`` overrides it: litellm reads its bundled price map
#: instead of fetching one when a task imports it.
DEFAULT_WORKER_ENV: Mapping[str, str] = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}

#: Environment variables ``dask-cluster`` reports at start (what the workers will use).
REPORTED_ENV = ("MEMORY_HOME", "DAGSTER_HOME", "MEMORY_EMBEDDING_MODEL", "MEMORY_LLM_MODEL")

#: The port of ``memory-pipelines dask-cluster`` unless ``--port`` says otherwise
#: (Dask's usual scheduler port; ``--port 0`` picks a free one).
DEFAULT_PORT = 8786


def _local_cluster_class() -> Any:
    try:
        from distributed import LocalCluster
    except ImportError as e:
        raise ConfigError(
            "a local Dask cluster needs the optional 'distributed' extra: "
            "pip install 'memory-pipelines[distributed]'"
        ) from e
    return LocalCluster


def worker_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables the nannies set in each worker: :data:`DEFAULT_WORKER_ENV` overlaid
    with ``env`` (values as strings)."""
    return {**DEFAULT_WORKER_ENV, **{str(k): str(v) for k, v in (env or {}).items()}}


@contextmanager
def local_dask_cluster(
    n_workers: int,
    *,
    threads_per_worker: int = 1,
    env: Mapping[str, str] | None = None,
    port: int = 0,
) -> Iterator[str]:
    """Start a scheduler and ``n_workers`` worker processes on 127.0.0.1; yield the
    scheduler address (``tcp://127.0.0.1:PORT``) and close them all on exit.

    ``threads_per_worker`` threads run tasks in each worker (keep 1 for Dagster steps);
    ``env`` is set in every worker process (see the module docstring); ``port`` 0 picks a
    free scheduler port. Dashboards are off. Raises :class:`ConfigError` for a
    non-positive worker or thread count, or when the ``distributed`` extra is missing.
    """
    if n_workers < 1:
        raise ConfigError(f"n_workers must be at least 1, got {n_workers}")
    if threads_per_worker < 1:
        raise ConfigError(f"threads_per_worker must be at least 1, got {threads_per_worker}")
    if not 0 <= port <= 65535:
        raise ConfigError(f"port must be between 0 and 65535, got {port}")
    local_cluster = _local_cluster_class()
    with local_cluster(
        n_workers=n_workers,
        threads_per_worker=threads_per_worker,
        processes=True,
        host=LOOPBACK,
        scheduler_port=port,
        # no dashboard; the scheduler's small HTTP server (health, metrics) takes a free
        # loopback port instead of its default 8787
        dashboard_address=SCHEDULER_HTTP_ADDRESS,
        scheduler_kwargs={"dashboard": False},
        worker_dashboard_address=None,
        env=worker_env(env),
    ) as cluster:
        yield str(cluster.scheduler_address)


def run_cluster(workers: int = 2, *, port: int = DEFAULT_PORT, threads_per_worker: int = 1) -> int:
    """``memory-pipelines dask-cluster --workers N [--port P]``: run a local Dask cluster
    in the foreground until SIGTERM or SIGINT."""
    stop = threading.Event()

    def _stop(signum: int, frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with local_dask_cluster(
            workers, threads_per_worker=threads_per_worker, port=port
        ) as address:
            print(f"Dask scheduler at {address} with {workers} worker process(es)")
            for name in REPORTED_ENV:
                print(f"  workers see {name}={os.environ.get(name, '(unset)')}")
            print(
                f"Run jobs with: MEMORY_EXECUTOR=dask MEMORY_DASK_ADDRESS={address}\n"
                "Stop with Ctrl-C or SIGTERM.",
                flush=True,
            )
            while not stop.wait(0.5):
                pass
            print("stopping the Dask cluster", flush=True)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the port is taken, or loopback is unusable
        print(f"error: could not start the Dask cluster: {e}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
