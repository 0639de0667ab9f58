"""Source assets: the SQL conversations and agent runs the Memory Manager cycle mines.

Dagster does not create these tables: agents (through the service, the HTTP API or the
proxy) write them. Observing them records a data version that changes when a rated
message or an agent run arrives, so the asset graph shows which new data a cycle read.
``extracted_notes`` records the same observation each time it runs; the "Observe
sources" button of the UI records one on demand.
"""

import warnings

import dagster as dg

from memory_pipelines.assets.common import SOURCES_GROUP, source_metadata
from memory_pipelines.inventory import agent_run_source_state, conversation_source_state
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.service import MemoryService

#: The tag under which Dagster stores an observation's data version (what
#: ``ObserveResult(data_version=...)`` records).
DATA_VERSION_TAG = "dagster/data_version"

RATED_CONVERSATIONS = dg.AssetKey("rated_conversations")
AGENT_RUNS = dg.AssetKey("agent_runs")


def source_observations(svc: MemoryService) -> dict[dg.AssetKey, dg.ObserveResult]:
    """The observation of each SQL source asset now: its data version and counts."""
    states = {
        RATED_CONVERSATIONS: conversation_source_state(svc.context),
        AGENT_RUNS: agent_run_source_state(svc.context),
    }
    return {
        key: dg.ObserveResult(
            asset_key=key,
            data_version=dg.DataVersion(state.data_version),
            metadata=source_metadata(state.counts),
        )
        for key, state in states.items()
    }


#: Tags of both source assets: the "sql" kind (what the kinds argument of other assets
#: sets), their role, and that nothing in Dagster writes them.
_TAGS = {"dagster/kind/sql": "", "phase": "source", "writes": "nothing"}


#: The descriptions the UI shows (a source asset does not take its observe function's
#: docstring).
CONVERSATIONS_DESCRIPTION = """Conversations and their messages, written by agents and users (SQL).

Extraction mines the messages of memory-using agents past its cursor for notes and
examples. The data version changes when a rated message arrives (or an older message gets
a rating); unrated messages do not change it. Observing reads only."""

AGENT_RUNS_DESCRIPTION = """Agent runs, written by the agents' hosts (SQL).

Extraction mines high-value runs (shared or productive) and failed runs for notes. The data
version changes when a run arrives, fails or finishes. Observing reads only."""


def observe_rated_conversations(memory: MemoryApiResource) -> dg.ObserveResult:
    """Observes the conversation source: its counts and data version."""
    return source_observations(memory.get_service())[RATED_CONVERSATIONS]


def observe_agent_runs(memory: MemoryApiResource) -> dg.ObserveResult:
    """Observes the agent-run source: its counts and data version."""
    return source_observations(memory.get_service())[AGENT_RUNS]


# ``observable_source_asset`` is marked beta in Dagster 1.13; it is the documented way to
# give a source a data version, so its warning is silenced here rather than printed by
# every process that loads the definitions.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)
    rated_conversations = dg.observable_source_asset(
        key=RATED_CONVERSATIONS,
        group_name=SOURCES_GROUP,
        tags=_TAGS,
        description=CONVERSATIONS_DESCRIPTION,
    )(observe_rated_conversations)
    agent_runs = dg.observable_source_asset(
        key=AGENT_RUNS, group_name=SOURCES_GROUP, tags=_TAGS, description=AGENT_RUNS_DESCRIPTION
    )(observe_agent_runs)
