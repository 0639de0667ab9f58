"""The executor the Memory Manager jobs run with, chosen by ``MEMORY_EXECUTOR``.

- unset, empty or ``in_process``: every step in the run's process (the default: a fresh
  process per step would re-import LanceDB and litellm).
- ``multiprocess``: Dagster's multiprocess executor, one child process per step.
- ``dask``: ``jobs.dask_executor.memory_dask_executor``, ``dagster_dask``'s executor
  with the fixes that module describes (the optional ``distributed`` extra). With
  ``MEMORY_DASK_ADDRESS`` set, steps go to that existing scheduler (for example one
  started by ``memory-pipelines dask-cluster``); otherwise each run starts its own local
  cluster of ``MEMORY_DASK_WORKERS`` (default 2) single-threaded worker processes on
  127.0.0.1 with no dashboard, and closes it when the run ends.

The variables are read when the definitions are imported, so they choose the executor of
``dagster job execute``, ``dagster dev`` and the daemon's runs. ``execute_in_process``
always runs in process, whatever is chosen here.

With ``dask``, each step runs in a worker process that resolves the run's environment
variables (``MEMORY_HOME`` ...) from its own environment, and the Dask executor does not
claim Dagster pool slots: the ``memory_note_table`` pool limit is not enforced, so two
steps of a run that the asset graph does not order (``extracted_notes`` and
``extracted_examples``) may run at once, and so may two runs.
"""

import os
from collections.abc import Mapping
from typing import Any

import dagster as dg

from memory_pipelines.errors import ConfigError

#: Interface and scheduler HTTP address of the per-run local cluster (the same as
#: ``memory_pipelines.apps.dask_cluster``, which needs ``distributed`` to import).
LOOPBACK = "127.0.0.1"
SCHEDULER_HTTP_ADDRESS = f"{LOOPBACK}:0"

EXECUTOR_VAR = "MEMORY_EXECUTOR"
DASK_ADDRESS_VAR = "MEMORY_DASK_ADDRESS"
DASK_WORKERS_VAR = "MEMORY_DASK_WORKERS"

IN_PROCESS = "in_process"
MULTIPROCESS = "multiprocess"
DASK = "dask"
#: The values ``MEMORY_EXECUTOR`` accepts (unset or empty means ``in_process``).
EXECUTOR_CHOICES = (IN_PROCESS, MULTIPROCESS, DASK)

#: Worker processes of the per-run local cluster when ``MEMORY_DASK_WORKERS`` is unset.
DEFAULT_DASK_WORKERS = 2


def _dask_workers(environ: Mapping[str, str]) -> int:
    raw = environ.get(DASK_WORKERS_VAR, "").strip()
    if not raw:
        return DEFAULT_DASK_WORKERS
    try:
        workers = int(raw)
    except ValueError as e:
        raise ConfigError(f"{DASK_WORKERS_VAR}={raw!r} is not a whole number of workers") from e
    if workers < 1:
        raise ConfigError(f"{DASK_WORKERS_VAR}={raw!r}: at least one worker is needed")
    return workers


def dask_executor_config(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``dask_executor`` config the environment asks for: ``{"cluster": {"existing":
    {"address": ...}}}`` when ``MEMORY_DASK_ADDRESS`` is set, else a local cluster of
    ``MEMORY_DASK_WORKERS`` (default 2) single-threaded worker processes on 127.0.0.1
    without a dashboard (the scheduler's health/metrics server takes a free loopback
    port). Raises :class:`ConfigError` for a bad worker count."""
    env = os.environ if environ is None else environ
    address = env.get(DASK_ADDRESS_VAR, "").strip()
    if address:
        return {"cluster": {"existing": {"address": address}}}
    return {
        "cluster": {
            "local": {
                "n_workers": _dask_workers(env),
                "threads_per_worker": 1,
                "processes": True,
                "host": LOOPBACK,
                # no dashboard; the scheduler's health/metrics server on a free port
                "dashboard_address": SCHEDULER_HTTP_ADDRESS,
                "scheduler_kwargs": {"dashboard": False},
            }
        }
    }


def executor_from_env(environ: Mapping[str, str] | None = None) -> dg.ExecutorDefinition:
    """The executor named by ``MEMORY_EXECUTOR`` (``environ`` defaults to ``os.environ``).

    ``in_process`` (also unset or empty), ``multiprocess`` or ``dask`` (configured by
    :func:`dask_executor_config`; ``dagster_dask`` is imported only then). Raises
    :class:`ConfigError` naming the variable, the value and the allowed values for
    anything else, and a :class:`ConfigError` saying which extra to install when
    ``dask`` is asked for without ``dagster-dask``.
    """
    env = os.environ if environ is None else environ
    raw = env.get(EXECUTOR_VAR, "")
    name = raw.strip().lower()
    if name in ("", IN_PROCESS):
        return dg.in_process_executor
    if name == MULTIPROCESS:
        return dg.multiprocess_executor
    if name == DASK:
        config = dask_executor_config(env)
        try:
            from memory_pipelines.jobs.dask_executor import memory_dask_executor
        except ImportError as e:
            raise ConfigError(
                f"{EXECUTOR_VAR}=dask needs dagster-dask and distributed, which are not "
                f"installed ({e}): pip install 'memory-pipelines[distributed]'"
            ) from e
        return memory_dask_executor.configured(config)
    raise ConfigError(
        f"{EXECUTOR_VAR}={raw!r} is not an executor; use one of {', '.join(EXECUTOR_CHOICES)} "
        f"(unset means {IN_PROCESS})"
    )
