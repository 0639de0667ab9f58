"""Analyst plots (PNG, matplotlib Agg backend, no display) of the note pool and of decay.

- ``importance_histogram(svc_or_df, path=None)``: histogram of ``importance_score`` of the
  Active notes (from a service's store, or from a notes DataFrame).
- ``decay_curves(path=None, config=None)``: the reference §4.11 curve of a fresh,
  never re-accessed auto note (access count 1, uniqueness 1): score vs days 0-60, its
  importance recomputed each day from the signals then decayed once, one line per tier:
  Standard, Ephemeral (lambda x2) and Protected (exempt from decay for 365 days since
  the last access: drawn flat at the fresh note's score over the window).
- ``agent_breakdown(svc_or_df)``: notes per agent by status and by type (a table).
- ``plot_dir(svc)``: ``<svc.home>/plots`` (created), or a temporary folder when the
  service has no home.

Reads the note table (histogram only); writes only the PNG files.
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from memory_pipelines.config import DecayConfig  # noqa: E402
from memory_pipelines.notes import Note, NoteStatus, ProtectionTier  # noqa: E402
from memory_pipelines.phases.ebbinghaus import decay_factor  # noqa: E402
from memory_pipelines.phases.scoring import Signal, compute_signals, importance_score  # noqa: E402
from memory_pipelines.store import eq  # noqa: E402

if TYPE_CHECKING:
    from memory_pipelines.service import MemoryService

PLOTS_DIR = "plots"
HISTOGRAM_FILE = "importance_histogram.png"
DECAY_FILE = "decay_curves.png"
#: Days drawn by :func:`decay_curves`.
DECAY_WINDOW_DAYS = 60
#: A fixed reference instant: the curves depend only on ages, not on the wall clock.
_REF = datetime(2026, 1, 1, tzinfo=UTC)


def plot_dir(svc: MemoryService | None = None) -> Path:
    """``<svc.home>/plots`` (created), or a fresh temporary folder without a home."""
    home = getattr(svc, "home", None) if svc is not None else None
    if home is None:
        return Path(tempfile.mkdtemp(prefix="memory-plots-"))
    folder = Path(home) / PLOTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _target(path: str | Path | None, svc: MemoryService | None, name: str) -> Path:
    out = Path(path) if path is not None else plot_dir(svc) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def active_importance(svc_or_df: MemoryService | pd.DataFrame) -> pd.Series:
    """The numeric ``importance_score`` of Active notes (unscored notes dropped)."""
    if isinstance(svc_or_df, pd.DataFrame):
        df = svc_or_df
        if "status" in df.columns:
            df = df[df["status"] == NoteStatus.ACTIVE.value]
    else:
        df = svc_or_df.store.notes.scan(
            eq("status", NoteStatus.ACTIVE), columns=["id", "importance_score"]
        )
    if df.empty or "importance_score" not in df.columns:
        return pd.Series(dtype="float64")
    return pd.to_numeric(df["importance_score"], errors="coerce").dropna()


def importance_histogram(
    svc_or_df: MemoryService | pd.DataFrame, path: str | Path | None = None
) -> Path:
    """Write a histogram of the Active notes' importance scores (0-10) and return its path.

    ``path`` defaults to ``<svc.home>/plots/importance_histogram.png`` (a temporary
    folder for a DataFrame or a service without a home).
    """
    svc = None if isinstance(svc_or_df, pd.DataFrame) else svc_or_df
    scores = active_importance(svc_or_df)
    out = _target(path, svc, HISTOGRAM_FILE)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        ax.hist(scores.to_numpy(), bins=[i * 0.5 for i in range(21)], color="#4c72b0")
        ax.set_xlim(0, 10)
        ax.set_xlabel("importance score")
        ax.set_ylabel("Active notes")
        ax.set_title(f"Importance of Active notes (n={len(scores)})")
        fig.tight_layout()
        fig.savefig(out, format="png")
    finally:
        plt.close(fig)
    return out


def decay_curve_points(
    config: DecayConfig | None = None, days: int = DECAY_WINDOW_DAYS
) -> pd.DataFrame:
    """Score per day (0..``days``) of a fresh auto note per tier (columns ``day``,
    ``Standard``, ``Ephemeral``, ``Protected``); the §4.11 sample table is the
    Standard column (7.0 / 5.37 / 2.82 / 0.93 / 0.34 at days 0 / 3 / 7 / 14 / 21)."""
    cfg = config or DecayConfig()
    unique = Signal(1.0, True)

    def importance_at(day: int) -> float:
        note = Note(
            note="a fact",
            is_auto_generated=True,
            access_count=1,
            created_at=_REF - timedelta(days=day),
        )
        return importance_score(compute_signals(note, _REF, uniqueness=unique))

    fresh = importance_at(0)
    rows = []
    for day in range(days + 1):
        score = importance_at(day)
        row: dict[str, float] = {"day": float(day)}
        for tier in (ProtectionTier.STANDARD, ProtectionTier.EPHEMERAL):
            row[tier.value] = round(score * decay_factor(score, day, 1, tier.value, cfg), 2)
        # Protected: decay-exempt while accessed within protected_inactivity_days
        row[ProtectionTier.PROTECTED.value] = (
            fresh
            if day < cfg.protected_inactivity_days
            else round(score * decay_factor(score, day, 1, None, cfg), 2)
        )
        rows.append(row)
    return pd.DataFrame(rows)


def decay_curves(path: str | Path | None = None, config: DecayConfig | None = None) -> Path:
    """Write the decay curves (score vs days 0-60 per tier, with the archival floor) and
    return the path (default: a temporary folder's ``decay_curves.png``)."""
    cfg = config or DecayConfig()
    points = decay_curve_points(cfg)
    out = _target(path, None, DECAY_FILE)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    try:
        styles = {
            ProtectionTier.STANDARD.value: ("Standard", "-"),
            ProtectionTier.EPHEMERAL.value: (
                f"Ephemeral (lambda x{cfg.ephemeral_decay_multiplier:g})",
                "--",
            ),
            ProtectionTier.PROTECTED.value: (
                f"Protected (no decay < {cfg.protected_inactivity_days:g} days)",
                ":",
            ),
        }
        for column, (label, style) in styles.items():
            ax.plot(points["day"], points[column], style, label=label)
        ax.axhline(cfg.archival_floor, color="grey", linewidth=0.8)
        ax.annotate(
            f"archival floor {cfg.archival_floor:g}",
            (points["day"].max(), cfg.archival_floor),
            ha="right",
            va="bottom",
            fontsize=8,
            color="grey",
        )
        ax.set_xlim(0, float(points["day"].max()))
        ax.set_ylim(0, 10)
        ax.set_xlabel("days since creation (never re-accessed)")
        ax.set_ylabel("importance score")
        ax.set_title("Decay of a fresh auto note (access 1, uniqueness 1)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out, format="png")
    finally:
        plt.close(fig)
    return out


def agent_breakdown(svc_or_df: MemoryService | pd.DataFrame) -> pd.DataFrame:
    """Notes per agent (all statuses): a ``total`` column, then one column per status
    (``status: X``) and per type (``type: Y``); indexed by ``agent_id``, largest first."""
    if isinstance(svc_or_df, pd.DataFrame):
        df = svc_or_df
    else:
        df = svc_or_df.store.notes.scan(None, columns=["id", "agent_id", "status", "type"])
    if df.empty:
        return pd.DataFrame()
    agents = df["agent_id"].fillna("(none)").rename("agent_id")
    parts = [agents.value_counts().rename("total").to_frame()]
    for column in ("status", "type"):
        table = pd.crosstab(agents, df[column].fillna("(none)"))
        table.columns = [f"{column}: {value}" for value in table.columns]
        parts.append(table)
    out = pd.concat(parts, axis=1).fillna(0).astype("int64")
    out = out.rename_axis(index="agent_id").reset_index()
    out = out.sort_values(["total", "agent_id"], ascending=[False, True])
    return out.set_index("agent_id")
