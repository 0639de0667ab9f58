"""``make_judge``: the judge for an ``llm`` setting (None, "offline", a model string, a Judge)."""

from __future__ import annotations

from typing import Any

from memory_pipelines.errors import ConfigError
from memory_pipelines.judge.decisions import Judge
from memory_pipelines.judge.litellm_judge import LiteLLMJudge, judge_options_from_env
from memory_pipelines.judge.offline import OfflineJudge


def make_judge(llm: Any = None, *, embedder: Any = None) -> Judge:
    """The judge for ``llm``: None (or "offline") -> :class:`OfflineJudge` using ``embedder``;
    a litellm model string -> :class:`LiteLLMJudge`; an object satisfying :class:`Judge` ->
    itself. Anything else raises ``ConfigError``."""
    if llm is None:
        return OfflineJudge(embedder)
    if isinstance(llm, str):
        model = llm.strip()
        if not model:
            raise ConfigError("llm must be a litellm model string, a Judge, or None")
        if model.lower() == "offline":
            return OfflineJudge(embedder)
        return LiteLLMJudge(model, **judge_options_from_env())
    if isinstance(llm, Judge):
        return llm
    raise ConfigError(
        f"llm must be a litellm model string, a Judge, or None; got {type(llm).__name__}"
    )
