"""The ``dask`` executor of the Memory Manager jobs: ``dagster_dask``'s executor with two
fixes, imported only when ``MEMORY_EXECUTOR=dask`` (it needs the ``distributed`` extra).

``dagster_dask.dask_executor`` 0.29.27 cannot run these jobs with dask/distributed 2025+:

- ``Client.submit`` walks every tuple argument looking for futures, and the run it
  submits (``DagsterRun``) holds a ``RunOpConcurrency`` record, which refuses iteration,
  whenever a step belongs to a pool (every note-table writer does): each run fails with
  "Iteration is not allowed on `@record` RunOpConcurrency" before any step starts. Here
  a step's arguments travel in one plain object (:class:`StepPayload`) that Dask passes
  through untouched.
- Dask task keys are ``job.step``, so two runs of one job on a shared scheduler get the
  same keys and the second gets the first's results (dagster issue #21418). Here keys
  carry the run id.

A step whose upstream step did not succeed is not executed (the Dask task returns no
events), so a failed phase never lets a later phase act on a half-updated note table.
The config schema is ``dagster_dask``'s ``cluster`` selector limited to ``existing``
(an address) and ``local`` (``distributed.LocalCluster`` keyword arguments; the cluster
lives for the run and is closed after it). Each step runs ``dagster_dask``'s
``query_on_dask_worker`` in a worker process, which writes its events to the run's
instance; the pool limits of the instance are not enforced.
"""

from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableJob
from dagster._core.errors import raise_execution_interrupts
from dagster._core.execution.context.system import PlanOrchestrationContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.plan.state import KnownExecutionState
from dagster._core.instance.ref import InstanceRef
from dagster._utils import iterate_with_context
from dagster_dask.executor import (
    DaskExecutor,
    get_dask_resource_requirements,
    query_on_dask_worker,
)
from distributed import Client, LocalCluster, as_completed

from memory_pipelines.errors import ConfigError

#: Cluster kinds this executor supports (``existing`` needs ``address``).
CLUSTER_KINDS = ("existing", "local")


@dataclass(frozen=True)
class StepPayload:
    """Everything a worker needs to execute one step, as one object that is not a
    tuple, list, set or dict, so ``Client.submit`` does not look inside it."""

    recon_job: ReconstructableJob
    dagster_run: dg.DagsterRun
    run_config: dict[str, Any]
    step_keys: list[str]
    instance_ref: InstanceRef
    known_state: KnownExecutionState | None


@dataclass(frozen=True)
class StepEvents:
    """The events one step's Dask task returns, in an object Dask sizes without looking
    inside (``distributed.sizeof`` walks lists and fails on Dagster's records)."""

    events: tuple[dg.DagsterEvent, ...]

    @property
    def succeeded(self) -> bool:
        """Whether the step reported ``STEP_SUCCESS``."""
        return any(e.event_type == dg.DagsterEventType.STEP_SUCCESS for e in self.events)


def execute_step_on_worker(dependencies: Sequence[StepEvents], payload: StepPayload) -> StepEvents:
    """Run in a Dask worker: execute the payload's step on the run's instance and return
    its events, or no events when an upstream step did not succeed. ``dependencies`` are
    the upstream tasks' results, which also make Dask order the steps."""
    if not all(upstream.succeeded for upstream in dependencies):
        return StepEvents(())
    events = query_on_dask_worker(
        dependencies,
        payload.recon_job,
        payload.dagster_run,
        payload.run_config,
        payload.step_keys,
        payload.instance_ref,
        payload.known_state,
    )
    return StepEvents(tuple(events))


class MemoryDaskExecutor(DaskExecutor):
    """``dagster_dask``'s ``DaskExecutor`` with opaque step arguments and per-run keys."""

    def __init__(self, cluster_type: str, cluster_configuration: dict[str, Any]) -> None:
        if cluster_type not in CLUSTER_KINDS:
            raise ConfigError(
                f"dask cluster {cluster_type!r} is not supported; use one of {CLUSTER_KINDS}"
            )
        super().__init__(cluster_type, cluster_configuration)

    def _connect(self, target: Any) -> Client:
        try:
            return Client(target)
        except (OSError, TimeoutError) as e:
            where = target if isinstance(target, str) else "the run's local cluster"
            raise ConfigError(
                f"could not reach the Dask scheduler at {where} (from MEMORY_DASK_ADDRESS "
                f"or the executor config): {e}"
            ) from e

    def execute(
        self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan
    ) -> Iterator[dg.DagsterEvent]:
        """Submit every step to the cluster (each after its upstream steps) and yield the
        events the workers return as the steps finish."""
        if not plan_context.instance.is_persistent:
            raise dg.DagsterInvariantViolationError(
                "Dask execution requires a persistent DagsterInstance (set DAGSTER_HOME)"
            )
        job_name = plan_context.job_name
        run_id = plan_context.dagster_run.run_id
        instance_ref = plan_context.instance.get_ref()
        with ExitStack() as stack:
            if self.cluster_type == "existing":
                target: Any = self.cluster_configuration["address"]
            else:
                target = stack.enter_context(LocalCluster(**self.build_dict(job_name)))
            client = stack.enter_context(self._connect(target))
            futures: dict[str, Any] = {}
            for step_level in execution_plan.get_steps_to_execute_by_level():
                for step in step_level:
                    dependencies = [
                        futures[key]
                        for step_input in step.step_inputs
                        for key in step_input.dependency_keys
                    ]
                    payload = StepPayload(
                        recon_job=plan_context.reconstructable_job,
                        dagster_run=plan_context.dagster_run,
                        run_config=dict(plan_context.run_config),
                        step_keys=[step.key],
                        instance_ref=instance_ref,
                        known_state=execution_plan.known_state,
                    )
                    futures[step.key] = client.submit(
                        execute_step_on_worker,
                        dependencies,
                        payload,
                        key=f"{job_name}.{step.key}.{run_id}",
                        resources=get_dask_resource_requirements(step.tags),
                    )
            finished = as_completed(list(futures.values()), with_results=True)
            for _future, result in iterate_with_context(raise_execution_interrupts, finished):
                yield from result.events


@dg.executor(
    name="dask",
    requirements=dg.multiple_process_executor_requirements(),
    config_schema={
        "cluster": dg.Field(
            dg.Selector(
                {
                    "existing": dg.Field(
                        {"address": dg.StringSource},
                        description="Connect to an existing scheduler.",
                    ),
                    "local": dg.Field(
                        dg.Permissive(),
                        is_required=False,
                        description="distributed.LocalCluster keyword arguments; the cluster "
                        "lives for the run.",
                    ),
                }
            )
        )
    },
)
def memory_dask_executor(init_context: dg.InitExecutorContext) -> MemoryDaskExecutor:
    """Execute each step of a run in a Dask worker process (see the module docstring)."""
    ((cluster_type, cluster_configuration),) = init_context.executor_config["cluster"].items()
    return MemoryDaskExecutor(cluster_type, dict(cluster_configuration or {}))
