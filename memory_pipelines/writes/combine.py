"""Group commit inside one process: concurrent ``svc.write`` callers share their commits.

Many agents of one process (threads of a worker, an in-process tool server) write at
once. Each run's write costs a fixed part (the model's setup for an embedding call, a
note commit, a ledger transaction, an audit transaction) that hardly grows with the
number of writes, so callers that arrive together are run together.

:class:`GroupWriter` is a leader/follower combiner. A caller that finds no write running
becomes the *leader*: it takes every call waiting (its own first, in arrival order) and
runs them as one round, then the calls that arrived meanwhile, until its own call is
answered; then it hands over to a waiting caller. A caller that finds a write running
waits until a leader answers it (or it becomes the leader). So:

* one caller alone runs exactly as before, in its own thread (a round of one call is
  :func:`~memory_pipelines.writes.execute_writes`: no thread switch, no delay);
* a round of several calls is :func:`~memory_pipelines.writes.group.execute_group`:
  the same results, errors, ledger rows, audit steps and events as the calls one after
  another in arrival order, with one embedding call, one note commit and one ledger
  claim for all of them;
* nobody waits for a window to fill: a round is whatever arrived while the last one ran.

A write made inside a round on the leader's own thread (a hook that writes) runs at once
on its own: it must not wait for the round it is part of. Across processes nothing is
shared: each process's rounds commit with the note table's retries, as single writes do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memory_pipelines.errors import MemoryPipelineError

#: The most calls one round takes (the rest wait for the next round).
MAX_ROUND = 64

Call = tuple[Any, Sequence[Any]]
RunOne = Callable[[Any, Sequence[Any]], Any]
RunGroup = Callable[[Sequence[Call]], Sequence[Any]]


@dataclass(eq=False)
class _Waiting:
    """One caller's call and, once a round has run it, its result or exception."""

    call: Call
    done: bool = False
    result: Any = None
    error: BaseException | None = None

    def answer(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class GroupWriter:
    """Runs concurrent calls in rounds (see the module notes).

    ``run_one(ctx, writes)`` runs a round of one call; ``run_group(calls)`` runs a round
    of several and returns, per call, its result or the exception it raised. ``stats``
    counts calls and rounds: calls per round is how much arrived together.
    """

    def __init__(
        self,
        run_one: RunOne,
        run_group: RunGroup,
        *,
        max_round: int = MAX_ROUND,
    ) -> None:
        self._run_one = run_one
        self._run_group = run_group
        self._max_round = max(1, max_round)
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Waiting] = []
        self._leading = False
        self._local = threading.local()  # set on the leader's thread while it runs rounds
        self.stats = {"calls": 0, "rounds": 0, "largest_round": 0}

    def write(self, ctx: Any, writes: Sequence[Any]) -> Any:
        """Run ``(ctx, writes)``, alone or in a round with the calls that came with it."""
        if getattr(self._local, "leading", False):
            return self._run_one(ctx, writes)
        me = _Waiting((ctx, writes))
        with self._cond:
            self._queue.append(me)
            while self._leading and not me.done:
                self._cond.wait()
            if me.done:
                return me.answer()
            self._leading = True
        self._local.leading = True
        try:
            while not me.done:
                with self._cond:
                    round_ = self._queue[: self._max_round]
                    del self._queue[: len(round_)]
                self._run(round_)
                with self._cond:
                    self._cond.notify_all()  # the round's callers return
        finally:
            self._local.leading = False
            with self._cond:
                self._leading = False
                self._cond.notify_all()  # a caller still waiting leads the next round
        return me.answer()

    def _run(self, round_: list[_Waiting]) -> None:
        """Run one round and answer each of its callers (every one of them, whatever fails)."""
        try:
            self.stats["calls"] += len(round_)
            self.stats["rounds"] += 1
            self.stats["largest_round"] = max(self.stats["largest_round"], len(round_))
            if len(round_) == 1:
                outs: Sequence[Any] = [_outcome(self._run_one, *round_[0].call)]
            else:
                outs = self._run_group([w.call for w in round_])
                if len(outs) != len(round_):
                    raise MemoryPipelineError(
                        f"a write round answered {len(outs)} of {len(round_)} calls"
                    )
        except BaseException as e:  # the round as a whole failed: each caller sees it
            outs = [e] * len(round_)
        for waiting, out in zip(round_, outs, strict=True):
            if isinstance(out, BaseException):
                waiting.error = out
            else:
                waiting.result = out
            waiting.done = True


def _outcome(fn: RunOne, ctx: Any, writes: Sequence[Any]) -> Any:
    try:
        return fn(ctx, writes)
    except BaseException as e:  # handed to its own caller
        return e
