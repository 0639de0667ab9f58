"""Analyst plots: the PNG files, the decay curve numbers, and the ``note_inventory``
asset's plot and per-agent metadata (real Dagster executor, temporary home)."""

import base64

import dagster as dg
import pandas as pd

from memory_pipelines.assets.inventory import note_inventory
from memory_pipelines.config import DecayConfig
from memory_pipelines.notes import Note
from memory_pipelines.plots import (
    active_importance,
    agent_breakdown,
    decay_curve_points,
    decay_curves,
    importance_histogram,
)
from memory_pipelines.resources.memory_api import MemoryApiResource

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _seed(svc) -> None:
    svc.configure_agent("alpha")
    svc.configure_agent("beta")
    svc.save_notes(
        [
            Note(note="Alpha fact one.", agent_id="alpha", type="Context", importance_score=7.5),
            Note(
                note="Alpha likes tea.", agent_id="alpha", type="Preference", importance_score=2.0
            ),
            Note(
                note="Alpha old fact.",
                agent_id="alpha",
                type="Context",
                status="Archived",
                importance_score=9.9,
            ),
            Note(note="Beta fact.", agent_id="beta", type="Context", importance_score=None),
        ]
    )


def test_histogram_and_decay_curves_are_pngs_under_the_home(svc):
    _seed(svc)
    scores = active_importance(svc)
    assert sorted(scores.tolist()) == [2.0, 7.5]  # Archived and unscored notes left out
    png = importance_histogram(svc)
    assert png == svc.home / "plots" / "importance_histogram.png"
    assert png.read_bytes().startswith(PNG_MAGIC)
    curves = decay_curves(svc.home / "plots" / "decay_curves.png")
    assert curves.read_bytes().startswith(PNG_MAGIC)
    frame_png = importance_histogram(pd.DataFrame({"importance_score": []}))
    assert frame_png.read_bytes().startswith(PNG_MAGIC)  # empty data still draws


def test_decay_curve_points_follow_the_reference_table():
    points = decay_curve_points().set_index("day")
    assert len(points) == 61
    assert [points.loc[d, "Standard"] for d in (0, 3, 7, 14, 21)] == [7.0, 5.37, 2.82, 0.93, 0.34]
    assert (points["Protected"] == 7.0).all()  # decay-exempt for 365 days
    assert (points["Ephemeral"] <= points["Standard"]).all()
    early = points.loc[2:20]  # retention 1.2 caps day 1; both reach 0 late
    assert (early["Ephemeral"] < early["Standard"]).all()  # lambda x2 falls faster
    slower = decay_curve_points(DecayConfig(base_lambda=0.08)).set_index("day")
    assert slower.loc[14, "Standard"] > points.loc[14, "Standard"]


def test_agent_breakdown_counts_status_and_type(svc):
    _seed(svc)
    table = agent_breakdown(svc)
    assert list(table.index) == ["alpha", "beta"]
    assert table.loc["alpha", "total"] == 3 and table.loc["beta", "total"] == 1
    assert table.loc["alpha", "status: Archived"] == 1
    assert table.loc["alpha", "type: Preference"] == 1 and table.loc["beta", "type: Context"] == 1


def test_note_inventory_asset_attaches_plots_and_agent_table(home, open_service):
    with open_service(clock=None) as svc:
        _seed(svc)
    result = dg.materialize(
        [note_inventory],
        resources={"memory": MemoryApiResource(home=str(home), embedding_model="hash")},
    )
    assert result.success
    [event] = result.get_asset_materialization_events()
    meta = event.step_materialization_data.materialization.metadata
    # no server-local path: a remote operator could not open it; the plot is inlined
    assert not [k for k, v in meta.items() if isinstance(v, dg.PathMetadataValue)]
    for name in ("importance_histogram", "decay_curves"):
        raw = (home / "plots" / f"{name}.png").read_bytes()
        assert raw.startswith(PNG_MAGIC)
        md = meta[f"{name}_plot"].value
        prefix = f"![{name}](data:image/png;base64,"
        assert md.startswith(prefix) and md.endswith(")")
        assert base64.b64decode(md[len(prefix) : -1]) == raw
    table = meta["agent_breakdown"].value
    assert "| alpha" in table and "status: Archived" in table and "type: Preference" in table
    assert "by_status" in meta and "agent_status" in meta  # the existing tables stay
