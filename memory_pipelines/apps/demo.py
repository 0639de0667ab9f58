"""``memory-pipelines demo``: seed a realistic memory home and run the Memory Manager
jobs through Dagster.

On the first run the home gets three agents, four users in two companies, rated and
unrated conversations (clear preferences, team conventions, biographical facts, a
correction, small talk and one-off requests), agent runs including a failure, in-flight
writes (one a paraphrase of another, so hardening archives it) and curated examples.
Then ``memory_manager_cycle`` and ``memory_maintenance`` execute on a persistent Dagster
instance in ``<home>/dagster`` (telemetry off, one slot in the note-table pool), so
``dagster dev`` with that ``DAGSTER_HOME`` shows the runs. A later run reuses the store
and runs a cycle again. The summary shows what each phase did, the notes by status, type
and agent, and the message injected for one user.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from tabulate import tabulate

from memory_pipelines.apps.progress import progress as bar
from memory_pipelines.apps.terminal import printable
from memory_pipelines.jobs.runs import JobExecution, execute_jobs
from memory_pipelines.notes import RunContext
from memory_pipelines.service import MemoryService, default_home

SEEDED_KEY = "demo_seeded_at"
DAGSTER_DIR = "dagster"
CYCLE_JOB = "memory_manager_cycle"
MAINTENANCE_JOB = "memory_maintenance"

#: The instance configuration the demo writes (kept if the file already exists): no
#: telemetry; one slot in every pool (the note-table pool serialises its writers),
#: enforced per step; at most one queued run per agent partition at a time (the
#: partitioned jobs); run monitoring, so a run whose process died is failed and its
#: slot freed instead of blocking the pool.
DAGSTER_YAML = """\
telemetry:
  enabled: false
concurrency:
  pools:
    default_limit: 1
    granularity: op
  runs:
    tag_concurrency_limits:
      - key: dagster/partition
        value:
          applyLimitPerUniqueValue: true
        limit: 1
run_monitoring:
  enabled: true
  start_timeout_seconds: 120
  free_slots_after_run_end_seconds: 30
"""

COMPANIES = {"acme": "Acme Robotics", "globex": "Globex Logistics"}
USERS = {
    "alice": ("acme", "Alice Nguyen"),
    "bob": ("acme", "Bob Okafor"),
    "carol": ("globex", "Carol Diaz"),
    "dave": ("globex", "Dave Kim"),
}
AGENTS: dict[str, dict[str, Any]] = {
    "code-helper": {"name": "Code Helper", "inject_examples": True},
    "support-desk": {"name": "Support Desk", "inject_examples": True},
    "travel-planner": {"name": "Travel Planner", "note_injection_strategy": "All"},
}


@dataclass(frozen=True)
class DemoMessage:
    role: str
    text: str
    rating: int | None = None
    comment: str | None = None


@dataclass(frozen=True)
class DemoConversation:
    conversation_id: str
    agent_id: str
    user_id: str
    messages: tuple[DemoMessage, ...]
    artifact_count: int = 0
    artifact_share_count: int = 0


def _m(role: str, text: str, rating: int | None = None, comment: str | None = None) -> DemoMessage:
    return DemoMessage(role, text, rating, comment)


CONVERSATIONS: tuple[DemoConversation, ...] = (
    DemoConversation(
        "conv-alice-review",
        "code-helper",
        "alice",
        (
            _m("user", "Can you review this function that parses the billing export?"),
            _m("assistant", "Sure. The loop re-opens the file per row; read it once instead."),
            _m("user", "I prefer type hints on every public function and short docstrings."),
            _m("user", "Our team uses PostgreSQL 16 and SQLAlchemy 2 for every service."),
            _m("user", "Never suggest print debugging in committed code."),
            _m(
                "assistant",
                "Understood: typed signatures, short docstrings, logging not print.",
                9,
                "Exactly right",
            ),
        ),
        artifact_count=2,
        artifact_share_count=3,
    ),
    DemoConversation(
        "conv-bob-deploy",
        "code-helper",
        "bob",
        (
            _m("user", "How do we roll back the payments service?"),
            _m("assistant", "Here is a long explanation of release history and rollbacks..."),
            _m("user", "Too long. Always give me the command first, then one line of explanation."),
            _m("user", "Our team uses Python 3.12 for every service now."),
            _m("user", "I prefer YAML configs."),
            _m("user", "Actually, I prefer TOML configs."),
            _m("assistant", "argocd app rollback payments", 2, "Too wordy before that"),
        ),
    ),
    DemoConversation(
        "conv-carol-trip",
        "travel-planner",
        "carol",
        (
            _m("user", "Hi there!"),
            _m("user", "I am based in Lisbon and I work in the finance team."),
            _m("user", "I'm vegetarian and I don't drink alcohol, so skip wine tastings."),
            _m("user", "Book me a taxi to the airport tomorrow at 7am."),
            _m("assistant", "Done: taxi booked for 07:00."),
            _m("user", "thanks!"),
        ),
    ),
    DemoConversation(
        "conv-carol-flights",
        "travel-planner",
        "carol",
        (
            _m("user", "I always take a window seat and I prefer morning flights."),
            _m(
                "assistant",
                "Noted. Here are three morning options with window seats.",
                10,
                "Perfect",
            ),
        ),
    ),
    DemoConversation(
        "conv-dave-tickets",
        "support-desk",
        "dave",
        (
            _m("user", "I work as the IT admin at Globex."),
            _m("user", "Our company policy is to never share customer emails in ticket replies."),
            _m("user", "How do I bulk-close tickets tagged 'spam'?"),
            _m("assistant", "Filter by tag:spam, select all, then Edit > Status: Closed.", 8),
        ),
    ),
    DemoConversation(
        "conv-alice-smalltalk",
        "support-desk",
        "alice",
        (
            _m("user", "hello"),
            _m("assistant", "Hi Alice, how can I help?"),
            _m("user", "nothing, thanks, that's all"),
        ),
    ),
)

#: (agent, run id, user, writes): in-flight ``memoryWrites``; the two dark-mode notes are
#: paraphrases written by different runs, so hardening archives the second.
WRITES: tuple[tuple[str, str, str, tuple[dict[str, str], ...]], ...] = (
    (
        "code-helper",
        "run-alice-ui-1",
        "alice",
        ({"note": "Alice prefers dark mode in all dashboards", "type": "Preference"},),
    ),
    (
        "code-helper",
        "run-alice-ui-2",
        "alice",
        ({"note": "Alice prefers dark mode in all her dashboards", "type": "Preference"},),
    ),
    (
        "travel-planner",
        "run-carol-docs",
        "carol",
        ({"note": "Carol's passport expires in March 2027", "type": "Context"},),
    ),
    (
        "support-desk",
        "run-dave-steps",
        "dave",
        (
            {
                "note": "Dave wants answers as numbered steps",
                "type": "Preference",
                "scopeHint": "user",
            },
            {
                "note": "Globex support tickets are answered in English",
                "type": "Context",
                "scopeHint": "agent",
            },
        ),
    ),
)

#: Notes a person wrote before the demo starts (agent, company, text, tier, days ago):
#: the Python version is superseded by what Bob says, so extraction revokes it with
#: lineage; the escalation rule is Protected.
HUMAN_NOTES: tuple[tuple[str, str, str, str, int], ...] = (
    ("code-helper", "acme", "Team uses Python 3.10 for every service.", "Standard", 120),
    (
        "support-desk",
        "globex",
        "Escalate outages to the on-call phone, never by email.",
        "Protected",
        200,
    ),
)

EXAMPLES: tuple[tuple[str, str, str, float], ...] = (
    (
        "support-desk",
        "How do I reset a user's two-factor authentication?",
        "Admin > Users > select the user > Security > Reset 2FA; the user enrols again at next login.",
        95.0,
    ),
    (
        "support-desk",
        "Can I export all tickets from last quarter?",
        "Reports > Export > choose 'Tickets', set the date range, then download the CSV.",
        88.0,
    ),
    (
        "code-helper",
        "Write a SQLAlchemy 2 query for active users.",
        "select(User).where(User.active.is_(True)).order_by(User.created_at)",
        90.0,
    ),
)


# --------------------------------------------------------------------------- seeding


def seed(svc: MemoryService, progress_bar: bool | None = None) -> dict[str, int]:
    """Fill an empty home with the demo agents, people, conversations, runs, writes and
    examples; returns what was added (``progress_bar``: bars on stderr, None: on a TTY)."""
    now = svc.now()
    _seed_people_and_agents(svc)
    _seed_human_notes(svc, now)
    message_count = _seed_conversations(svc, now, progress_bar)
    _seed_unfinished_runs(svc, now)
    write_count = _seed_writes(svc, progress_bar)
    for agent_id, example_input, example_output, score in EXAMPLES:
        svc.add_example(agent_id, example_input, example_output, success_score=score)
    svc.sources.set_state(SEEDED_KEY, now.isoformat())
    return {
        "agents": len(AGENTS),
        "companies": len(COMPANIES),
        "users": len(USERS),
        "conversations": len(CONVERSATIONS),
        "messages": message_count,
        "agent runs": len(CONVERSATIONS) + 2 + len(WRITES),
        "in-flight writes": write_count,
        "human notes": len(HUMAN_NOTES),
        "curated examples": len(EXAMPLES),
    }


def _seed_people_and_agents(svc: MemoryService) -> None:
    for company_id, name in COMPANIES.items():
        svc.add_company(company_id, name)
    for user_id, (company_id, name) in USERS.items():
        svc.add_user(user_id, company_id, name)
    for agent_id, fields in AGENTS.items():
        svc.configure_agent(agent_id, **fields)


def _seed_human_notes(svc: MemoryService, now: datetime) -> None:
    for agent_id, company_id, text, tier, days in HUMAN_NOTES:
        svc.add_note(
            text,
            type="Context",
            agent_id=agent_id,
            company_id=company_id,
            protection_tier=tier,
            created_at=now - timedelta(days=days),
        )


def _seed_conversations(svc: MemoryService, now: datetime, progress_bar: bool | None) -> int:
    """Each conversation with its messages (one a minute) and its finished run; returns
    how many messages were added."""
    message_count = 0
    for k, conv in enumerate(
        bar(CONVERSATIONS, desc="demo: seed conversations", enabled=progress_bar)
    ):
        company_id = USERS[conv.user_id][0]
        svc.add_conversation(conv.conversation_id, conv.agent_id, conv.user_id, company_id)
        start = now - timedelta(hours=len(CONVERSATIONS) - k)
        for i, msg in enumerate(conv.messages):
            svc.add_message(
                conv.conversation_id,
                f"{conv.conversation_id}-m{i + 1}",
                msg.role,
                msg.text,
                rating=msg.rating,
                rating_comment=msg.comment,
                created_at=start + timedelta(minutes=i),
            )
            message_count += 1
        svc.add_agent_run(
            f"run-{conv.conversation_id}",
            conv.agent_id,
            user_id=conv.user_id,
            company_id=company_id,
            conversation_id=conv.conversation_id,
            artifact_count=conv.artifact_count,
            artifact_share_count=conv.artifact_share_count,
            created_at=start,
            finished_at=start + timedelta(minutes=len(conv.messages)),
        )
    return message_count


def _seed_unfinished_runs(svc: MemoryService, now: datetime) -> None:
    """A run that failed with an error message, and one still running."""
    svc.add_agent_run(
        "run-bob-prs-failed",
        "code-helper",
        user_id="bob",
        company_id="acme",
        status="Failed",
        success=False,
        error_message=(
            "TimeoutError: GitHub API did not answer within 30s while listing pull requests "
            "(secondary rate limit: 5000/5000 requests used)"
        ),
        created_at=now - timedelta(minutes=30),
    )
    svc.add_agent_run(
        "run-dave-running", "support-desk", user_id="dave", status="Running", success=None
    )


def _seed_writes(svc: MemoryService, progress_bar: bool | None) -> int:
    """The agents' in-flight writes, each run recorded first; returns how many."""
    write_count = 0
    for agent_id, run_id, user_id, writes in bar(
        WRITES, desc="demo: seed in-flight writes", enabled=progress_bar
    ):
        ctx = RunContext(
            agent_id=agent_id, run_id=run_id, user_id=user_id, company_id=USERS[user_id][0]
        )
        svc.add_agent_run(run_id, agent_id, user_id=user_id, company_id=USERS[user_id][0])
        svc.write(ctx, list(writes))
        write_count += len(writes)
    return write_count


# --------------------------------------------------------------------------- dagster


def dagster_home(home: Path) -> Path:
    """``<home>/dagster`` with a ``dagster.yaml`` (telemetry off, pool limit 1)."""
    folder = (home / DAGSTER_DIR).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "dagster.yaml"
    if not config.exists():
        config.write_text(DAGSTER_YAML)
    return folder


def run_jobs(home: Path, jobs: list[str], progress_bar: bool | None = None) -> list[JobExecution]:
    """Execute the jobs through Dagster on the demo instance (``<home>/dagster``), one at a
    time in order (``progress_bar``: a bar over the jobs on stderr, None: on a TTY)."""
    runs: list[JobExecution] = []
    for job in bar(jobs, desc="demo: jobs", enabled=progress_bar):
        runs += execute_jobs(
            str(home.resolve()), [job], str(dagster_home(home)), tags={"memory/trigger": "demo"}
        )
    return runs


# --------------------------------------------------------------------------- summary

#: Counts shown per phase (the rest are in the Dagster UI).
SHOWN_COUNTS = {
    "extracted_notes": [
        "conversations_processed", "messages_processed", "failed_runs_mined", "raw_note_count",
        "notes_created", "notes_merged", "notes_rejected", "fold_events_folded",
    ],
    "extracted_examples": ["conversations_processed", "raw_example_count", "examples_created", "examples_rejected"],
    "hardened_notes": ["provisional_count", "hardened", "deduped", "failed"],
}  # fmt: skip


def _phase_rows(runs: list[JobExecution]) -> list[tuple[str, str, str]]:
    rows = []
    for run in runs:
        for asset, meta in run.materializations.items():
            keys = (
                SHOWN_COUNTS.get(asset)
                or [
                    k
                    for k, v in meta.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                ][:8]
            )
            shown = ", ".join(
                f"{k}={meta[k]}" for k in keys if k in meta and k != "note_table_version"
            )
            rows.append((run.job, asset, shown))
    return rows


def _table(frame: pd.DataFrame, index: bool = True) -> str:
    if frame.empty:
        return "(none)"
    return tabulate(frame, headers="keys", tablefmt="github", showindex=index)


def summary(svc: MemoryService, runs: list[JobExecution], seeded: Mapping[str, int] | None) -> str:
    """The demo's report: seed, jobs, phases, notes by status/type/agent, one injection."""
    out: list[str] = []
    if seeded:
        out.append("Seeded: " + ", ".join(f"{v} {k}" for k, v in seeded.items()))
    else:
        out.append(f"Reusing the demo store seeded at {svc.sources.get_state(SEEDED_KEY)}")
    out.append("\n## Dagster runs\n")
    out.append(
        tabulate(
            [(r.job, r.run_id[:8], "success" if r.success else "FAILED", r.seconds) for r in runs],
            headers=["job", "run", "status", "seconds"],
            tablefmt="github",
        )
    )
    out.append("\n## What each phase did\n")
    out.append(tabulate(_phase_rows(runs), headers=["job", "asset", "counts"], tablefmt="github"))
    checks = [
        (r.job, name, "pass" if ok else "warn" if name in r.warnings else "FAIL")
        for r in runs
        for name, ok in r.checks.items()
    ]
    if checks:
        out.append("\n## Asset checks\n")
        out.append(tabulate(checks, headers=["job", "check", "result"], tablefmt="github"))
    notes = svc.notes()
    out.append(f"\n## Notes ({len(notes)})\n")
    if not notes.empty:
        out.append(_table(pd.crosstab(notes["type"], notes["status"])))
        out.append("")
        out.append(_table(pd.crosstab(notes["agent_id"].fillna("(none)"), notes["status"])))
        live = notes[notes["status"].isin(["Active", "Provisional"])].sort_values(
            ["agent_id", "user_id"]
        )
        shown = live[["agent_id", "user_id", "company_id", "type", "status", "author_type", "note"]]
        out.append("\n### Injectable notes\n")
        out.append(_table(shown.fillna("-"), index=False))
        gone = notes[~notes["status"].isin(["Active", "Provisional"])]
        if not gone.empty:
            out.append("\n### Archived or revoked\n")
            cols = ["agent_id", "status", "note", "consolidated_into_note_id"]
            out.append(_table(gone[cols].fillna("-"), index=False))
    ctx = RunContext(
        agent_id="code-helper", run_id="demo-inject", user_id="alice", company_id="acme"
    )
    injection = svc.inject(
        ctx, "Help me write a typed Python function that queries our Postgres database."
    )
    out.append("\n## Injected for alice (code-helper)\n")
    out.append(injection.message or "(nothing to inject)")
    return "\n".join(out)


def run_demo(home: str | Path | None = None, *, progress_bar: bool | None = None) -> int:
    """``memory-pipelines demo [--home H]``: seed (first run) and run the jobs through Dagster."""
    folder = Path(home) if home else default_home()
    os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")
    with MemoryService.from_env(folder) as svc:
        seeded = None
        if not svc.sources.get_state(SEEDED_KEY):
            seeded = seed(svc, progress_bar=progress_bar)
            jobs = [CYCLE_JOB, MAINTENANCE_JOB]
        else:
            jobs = [CYCLE_JOB]
        runs = run_jobs(folder, jobs, progress_bar=progress_bar)
        print(printable(summary(svc, runs, seeded), keep="\n"))
    print(
        "\nOpen the UI on these runs:\n"
        f"  MEMORY_HOME={folder.resolve()} DAGSTER_HOME={(folder / DAGSTER_DIR).resolve()} "
        "dagster dev -m memory_pipelines.definitions"
    )
    return 0 if runs and all(r.success for r in runs) else 1
