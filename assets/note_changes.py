"""Note changes asset: what one Memory Manager run changed, note by note, for analysts."""

from collections.abc import Iterator

import dagster as dg
import pandas as pd

from memory_pipelines.assets.common import ANALYST_GROUP, OWNERS, blank_missing, frame_markdown
from memory_pipelines.assets.decay import decayed_notes
from memory_pipelines.assets.note_table import note_table
from memory_pipelines.phases.review import CHANGE_COLUMNS, REVIEW_REASONS, run_changes
from memory_pipelines.resources.memory_api import MemoryApiResource

#: Rows of the table shown in the UI (the asset's value, a DataFrame, holds them all).
TABLE_ROWS = 200

_TYPES = {"at": "string", "confidence": "float"}
SCHEMA = dg.TableSchema(
    columns=[dg.TableColumn(c, _TYPES.get(c, "string")) for c in CHANGE_COLUMNS]
)


def _records(frame: pd.DataFrame) -> list[dg.TableRecord]:
    shown = frame.head(TABLE_ROWS).copy()
    shown["at"] = [t.isoformat() if pd.notna(t) else "" for t in shown["at"]]
    shown["confidence"] = [None if pd.isna(c) else round(float(c), 1) for c in shown["confidence"]]
    text = [c for c in CHANGE_COLUMNS if c not in ("confidence",)]
    shown[text] = blank_missing(shown[text]).astype(str)
    return [dg.TableRecord(row) for row in shown.to_dict(orient="records")]


@dg.asset(
    group_name=ANALYST_GROUP,
    kinds={"lancedb", "pandas"},
    owners=OWNERS,
    tags={"phase": "review", "writes": "nothing"},
    deps=[note_table, decayed_notes],
    check_specs=[
        dg.AssetCheckSpec(
            "notes_to_review",
            asset="note_changes",
            description=(
                "Warns when the run auto-protected a note, resolved a contradiction by "
                "recency alone, or revoked agent-written text that reads as an instruction."
            ),
        )
    ],
)
def note_changes(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> Iterator[dg.Output | dg.AssetCheckResult]:
    """The notes this run changed, one row per change, for analysts to filter and review.

    Reads the lifecycle events the run recorded (a cycle's extraction and hardening, or
    maintenance's five phases) and, for each, the phase and rule, the note and its
    scope, the status before and after, the note's text after, the reason, the judge's
    confidence, the related notes, and ``review``: why a person should check the change.
    The value is a pandas DataFrame (``defs.load_asset_value("note_changes")``); the
    metadata holds the first rows as a table and the rows to review. Its check
    ``notes_to_review`` warns when the run auto-protected a note, resolved a contradiction
    by recency alone, or revoked agent-written text that reads as an instruction.
    """
    frame = run_changes(memory.get_service().context, context.run_id)
    review = frame[frame["review"] != ""]
    counts = {r: int((review["review"] == r).sum()) for r in REVIEW_REASONS}
    context.log.info("%s note changes, %s to review", len(frame), len(review))
    yield dg.Output(
        frame,
        metadata={
            "dagster/row_count": dg.MetadataValue.int(len(frame)),
            "dagster/column_schema": SCHEMA,
            "changes": dg.MetadataValue.table(_records(frame), schema=SCHEMA),
            "to_review": dg.MetadataValue.int(len(review)),
            "review_preview": dg.MetadataValue.md(frame_markdown(review.head(20))),
        },
    )
    yield dg.AssetCheckResult(
        check_name="notes_to_review",
        passed=review.empty,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            **{r.replace(" ", "_").replace("-", "_"): n for r, n in counts.items()},
            "notes": dg.MetadataValue.md(frame_markdown(review.head(20))),
        },
    )
