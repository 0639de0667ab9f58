"""The multi-tenant rules of an agent (reference §3.3): its secondary-scope dimensions and
their inheritance modes, parsed from ``AgentConfig.scope_config``, a note's secondary scopes
read from their JSON, and a run's scopes resolved against the dimensions (defaults filled
in, ``strictValidation`` enforced).

The matcher that applies these rules is :mod:`.match`; the store filter that narrows a
search before it is :mod:`.prefilter`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory_pipelines.errors import ConfigError, ValidationError

CASCADING = "cascading"
STRICT = "strict"
INHERITANCE_MODES: tuple[str, ...] = (CASCADING, STRICT)
#: ``agentWideWrites`` values: "allow" (the guide: a write may land agent-wide, without a
#: user or company), "company" (agent-wide only within the context's company), "deny"
#: (never without a user).
AGENT_WIDE_WRITES: tuple[str, ...] = ("allow", "company", "deny")


class ScopeValidationError(ValidationError):
    """A run's secondary scopes fail the agent's ``strictValidation`` rules."""


@dataclass(frozen=True)
class ScopeDimension:
    """One secondary-scope dimension of an agent's ``SecondaryScopeConfig``."""

    name: str
    entity_id: str | None = None
    required: bool = False
    inheritance_mode: str | None = None
    default_value: Any = None
    description: str | None = None


def _dimension_of(d: Any) -> ScopeDimension:
    if not isinstance(d, Mapping) or not isinstance(d.get("name"), str) or not d["name"]:
        raise ConfigError(f"invalid scope dimension {d!r}: a name is required")
    mode = d.get("inheritanceMode", d.get("inheritance_mode"))
    if mode is not None and mode not in INHERITANCE_MODES:
        raise ConfigError(f"unknown inheritanceMode {mode!r} for dimension {d['name']!r}")
    return ScopeDimension(
        name=d["name"],
        entity_id=d.get("entityId", d.get("entity_id")),
        required=bool(d.get("required", False)),
        inheritance_mode=mode,
        default_value=d.get("defaultValue", d.get("default_value")),
        description=d.get("description"),
    )


@dataclass(frozen=True)
class SecondaryScopeConfig:
    """An agent's multi-tenant settings, parsed from ``AgentConfig.scope_config``.

    Keys are read in camelCase (as the reference stores them) or snake_case.
    ``shared_only`` (``sharedOnly``) is this project's addition: inject only notes and
    examples without a user. So is ``agent_wide_writes`` (``agentWideWrites``): which
    in-flight writes may land without a user (one of :data:`AGENT_WIDE_WRITES`, None for
    the default; see :mod:`memory_pipelines.scope.placement`).
    """

    dimensions: tuple[ScopeDimension, ...] = ()
    default_inheritance_mode: str = CASCADING
    allow_secondary_only: bool = False
    strict_validation: bool = False
    shared_only: bool = False
    agent_wide_writes: str | None = None
    _modes: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_value(cls, value: Mapping[str, Any] | str | None) -> SecondaryScopeConfig:
        """Parse a config dict (or its JSON text); ``ConfigError`` when it is malformed."""
        if value is None or value == "":
            return cls()
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise ConfigError(f"scope_config is not valid JSON: {e}") from e
        if not isinstance(value, Mapping):
            raise ConfigError("scope_config must be an object")

        def get(camel: str, snake: str, default: Any) -> Any:
            if camel in value:
                return value[camel]
            return value.get(snake, default)

        default_mode = get("defaultInheritanceMode", "default_inheritance_mode", None) or CASCADING
        if default_mode not in INHERITANCE_MODES:
            raise ConfigError(f"unknown defaultInheritanceMode {default_mode!r}")
        raw_dims = get("dimensions", "dimensions", None) or []
        if not isinstance(raw_dims, Sequence) or isinstance(raw_dims, str):
            raise ConfigError("scope_config.dimensions must be a list")
        dims = [_dimension_of(d) for d in raw_dims]
        modes = {d.name: d.inheritance_mode or default_mode for d in dims}
        agent_wide = get("agentWideWrites", "agent_wide_writes", None)
        if agent_wide is not None and agent_wide not in AGENT_WIDE_WRITES:
            raise ConfigError(
                f"unknown agentWideWrites {agent_wide!r}: one of {', '.join(AGENT_WIDE_WRITES)}"
            )
        return cls(
            dimensions=tuple(dims),
            default_inheritance_mode=default_mode,
            allow_secondary_only=bool(get("allowSecondaryOnly", "allow_secondary_only", False)),
            strict_validation=bool(get("strictValidation", "strict_validation", False)),
            shared_only=bool(get("sharedOnly", "shared_only", False)),
            agent_wide_writes=agent_wide,
            _modes=modes,
        )

    def mode_for(self, dimension: str) -> str:
        """The dimension's ``inheritanceMode``, else the default, else 'cascading'."""
        return self._modes.get(dimension) or self.default_inheritance_mode or CASCADING


def parse_scopes(value: Any) -> dict[str, Any] | None:
    """A note's secondary scopes as a dict (None when empty); ``ValueError`` if malformed."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        raise ValueError("secondary scopes must be a JSON object")
    for v in value.values():
        if isinstance(v, (Mapping, list, tuple)) or v is None:
            raise ValueError("a secondary scope value must be a scalar")
    return dict(value) or None


def resolve_run_scopes(
    run_secondary: Mapping[str, Any] | None, config: SecondaryScopeConfig
) -> dict[str, Any] | None:
    """The run's secondary scopes with dimension defaults filled in.

    With ``strictValidation``, an unknown dimension or a missing required one (without a
    default) raises :class:`ScopeValidationError`.
    """
    scopes = {k: v for k, v in (run_secondary or {}).items() if v is not None}
    for d in config.dimensions:
        if d.name not in scopes and d.default_value is not None:
            scopes[d.name] = d.default_value
    if config.strict_validation and config.dimensions:
        known = {d.name for d in config.dimensions}
        unknown = sorted(set(scopes) - known)
        if unknown:
            raise ScopeValidationError(
                f"unknown secondary scope dimension(s): {', '.join(unknown)}"
            )
        missing = sorted(d.name for d in config.dimensions if d.required and d.name not in scopes)
        if missing:
            raise ScopeValidationError(f"missing required secondary scope(s): {', '.join(missing)}")
    return scopes or None
