"""A judge's calls in a benchmark run, by outcome: how many were answered, timed out, cut
off at their token cap, unparsable, failing their schema or refused by the judge's checks,
how long they took, and what the extraction phase's filter dropped of what they proposed
(:class:`RecordingJudge` wraps the judge under test and keeps the tally)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory_pipelines.errors import JudgeError
from memory_pipelines.judge import CandidateNote, Judge


def failure_kind(error: JudgeError) -> str:
    """What kind of "no decision" a ``JudgeError`` is (its ``kind``); a failed call also
    names the exception that failed it."""
    if error.kind == "call failed":
        cause = error.__cause__
        return f"call failed ({type(cause).__name__ if cause is not None else 'error'})"
    return error.kind


@dataclass
class JudgeTally:
    """The judge's calls in one conversation: outcomes per decision, seconds per call,
    notes proposed, and the first error of each kind (to show the user)."""

    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    proposed: int = 0
    examples: dict[str, str] = field(default_factory=dict)
    #: proposals the extraction phase dropped, by its reason (``notesFiltered_*``)
    filtered: Counter[str] = field(default_factory=Counter)

    def add_report(self, report: Mapping[str, Any]) -> None:
        """Count the proposals an extraction report says its filter dropped."""
        for key, value in report.items():
            if key.startswith("notesFiltered_") and isinstance(value, int):
                self.filtered[key.removeprefix("notesFiltered_")] += value

    def count(self, decision: str, outcome: str, seconds: float) -> None:
        self.outcomes.setdefault(decision, Counter())[outcome] += 1
        self.seconds.append(seconds)

    def failed(self) -> int:
        return sum(n for c in self.outcomes.values() for k, n in c.items() if k != "ok")

    def line(self) -> str:
        """One line: each decision's calls and outcomes, notes proposed, call seconds."""
        parts = []
        for decision, c in self.outcomes.items():
            what = ", ".join(f"{k} {n}" for k, n in sorted(c.items(), key=lambda kv: -kv[1]))
            parts.append(f"{decision.replace('_', ' ')} {sum(c.values())} ({what})")
        if not parts:
            return "no judge calls"
        secs = sorted(self.seconds)
        dropped = ", ".join(f"{k} {n}" for k, n in self.filtered.most_common())
        return (
            "; ".join(parts)
            + f"; notes proposed {self.proposed}"
            + (f" (dropped by the phase's filter: {dropped})" if dropped else "")
            + f"; seconds per call p50 {secs[len(secs) // 2]:.1f}, max {secs[-1]:.1f}"
        )


class RecordingJudge:
    """Wraps a judge: remembers which rule family proposed each note text, and tallies the
    outcome of each extraction and dedupe decision (``failure_kind`` for a ``JudgeError``)."""

    def __init__(self, inner: Judge) -> None:
        self.inner = inner
        self.name = inner.name
        self.rules: dict[str, str] = {}
        self.tally = JudgeTally()

    def _call(self, decision: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            got = getattr(self.inner, decision)(*args, **kwargs)
        except JudgeError as e:
            kind = failure_kind(e)
            self.tally.count(decision, kind, time.perf_counter() - t0)
            self.tally.examples.setdefault(kind, str(e))
            raise
        self.tally.count(decision, "ok", time.perf_counter() - t0)
        return got

    def extract_notes(self, messages, existing, *, rating_context):  # type: ignore[no-untyped-def]
        got: list[CandidateNote] = self._call(
            "extract_notes", messages, existing, rating_context=rating_context
        )
        self.tally.proposed += len(got)
        for c in got:
            self.rules[c.content.strip()] = c.rule or self.inner.name
        return got

    def extract_examples(self, messages, existing):  # type: ignore[no-untyped-def]
        return self._call("extract_examples", messages, existing)

    def is_duplicate(self, candidate, matches):  # type: ignore[no-untyped-def]
        return self._call("is_duplicate", candidate, matches)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


def print_judge_calls(results: Sequence[Any]) -> None:
    """Each result's judge calls (its ``judge`` tally, by ``sample_id``) by outcome, and the
    first error of each kind: a judge that stores no note says here whether it timed out,
    failed or was refused."""
    print("\njudge calls (a failed call leaves its session's notes as they were):")
    examples: dict[str, str] = {}
    for r in results:
        print(f"  {r.sample_id}: {r.judge.line()}")
        for kind, text in r.judge.examples.items():
            examples.setdefault(kind, text)
    for kind, text in examples.items():
        print(f"  first '{kind}': {text[:300]}")
