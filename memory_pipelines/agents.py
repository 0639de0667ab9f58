"""Agent settings: validate them on write, clamp them on read (CONTRACT §2.1, §2.8)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from memory_pipelines.errors import ConfigError, UnknownAgentError, ValidationError
from memory_pipelines.limits import check_count, check_fields, check_ids, limits, shown
from memory_pipelines.notes import AgentConfig
from memory_pipelines.partitions import check_agent_id
from memory_pipelines.scope import SecondaryScopeConfig
from memory_pipelines.sources import Sources

log = logging.getLogger(__name__)


#: The agent settings that count injected items (bounded by ``Limits.max_injected_items``).
COUNT_FIELDS = ("max_notes_to_inject", "max_examples_to_inject")


_RERANKER_FLAGS = (
    "enabled",
    "fallbackOnError",
    "fallback_on_error",
    "rerankExamples",
    "rerank_examples",
)


def check_agent_fields(fields: Mapping[str, Any]) -> None:
    """``ValidationError`` naming the field for an agent setting out of range (CONTRACT
    §2.8): counts above ``Limits.max_injected_items`` (or below 0, or not integers), a
    ``scope_config`` the scope layer cannot parse, a malformed ``reranker_config``."""
    bound = limits()
    for name in COUNT_FIELDS:
        if name in fields:
            check_count(name, fields[name], bound.max_injected_items)
    if fields.get("scope_config") is not None:
        value = fields["scope_config"]
        if not isinstance(value, Mapping):
            raise ValidationError(f"scope_config must be an object, got {shown(value)}")
        try:
            SecondaryScopeConfig.from_value(value)
        except (ConfigError, TypeError, ValueError) as e:
            raise ValidationError(f"scope_config is malformed: {e}") from e
    if fields.get("reranker_config") is not None:
        _check_reranker(fields["reranker_config"], bound.max_retrieval_multiplier)


def _check_reranker(value: Any, max_multiplier: int) -> None:
    if not isinstance(value, Mapping):
        raise ValidationError(f"reranker_config must be an object, got {shown(value)}")
    for key in _RERANKER_FLAGS:
        if key in value and not isinstance(value[key], bool):
            raise ValidationError(f"reranker_config.{key} must be true or false, got {shown(value[key])}")
    for key in ("retrievalMultiplier", "retrieval_multiplier"):
        if key in value and value[key] is not None:
            check_count(f"reranker_config.{key}", value[key], max_multiplier, minimum=1)
    if "type" in value and value["type"] is not None and not isinstance(value["type"], str):
        raise ValidationError(f"reranker_config.type must be a string, got {shown(value['type'])}")
    if "model" in value and value["model"] is not None and not isinstance(value["model"], str):
        raise ValidationError(f"reranker_config.model must be a string, got {shown(value['model'])}")


def clamp_agent(agent: AgentConfig) -> AgentConfig:
    """An agent row as reads use it: counts above ``Limits.max_injected_items`` (stored
    before ``configure_agent`` checked them) are clamped, with a logged warning."""
    bound = limits().max_injected_items
    update = {f: bound for f in COUNT_FIELDS if getattr(agent, f) > bound}
    if not update:
        return agent
    log.warning(
        "agent %r has %s above the limit %d; using %d (fix it with configure_agent)",
        agent.agent_id,
        ", ".join(f"{f}={getattr(agent, f)}" for f in update),
        bound,
        bound,
    )
    return agent.model_copy(update=update)


def configure_agent(sources: Sources, agent_id: str, **fields: Any) -> AgentConfig:
    """Create or update an agent's memory configuration (unknown fields are an error;
    out-of-range values are a ``ValidationError``, see :func:`check_agent_fields`)."""
    if not isinstance(agent_id, str) or not agent_id.strip():
        raise ValidationError("agent_id must be a non-empty string")
    check_ids({"agent_id": agent_id})
    check_agent_id(agent_id)
    unknown = set(fields) - set(AgentConfig.model_fields)
    if unknown:
        raise ValidationError(f"unknown agent field(s): {', '.join(sorted(unknown))}")
    check_fields(fields)
    check_agent_fields(fields)
    current = sources.get_agent(agent_id)
    base = current.model_dump() if current else {"agent_id": agent_id}
    try:
        config = AgentConfig.model_validate({**base, **fields})
    except Exception as e:
        raise ValidationError(f"invalid agent configuration: {e}") from e
    return sources.upsert_agent(config)


def get_agent(sources: Sources, agent_id: str) -> AgentConfig:
    """The agent's configuration as reads use it; ``UnknownAgentError`` if not configured."""
    agent = sources.get_agent(agent_id) if isinstance(agent_id, str) else None
    if agent is None:
        raise UnknownAgentError(f"unknown agent {agent_id!r}")
    return clamp_agent(agent)
