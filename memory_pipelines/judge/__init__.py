"""The judge: every LLM decision the Memory Manager needs, behind one protocol.

Two implementations: :class:`OfflineJudge` (default; deterministic rules plus embeddings,
no model) and :class:`LiteLLMJudge` (any litellm model string; JSON output, temperature 0,
timeout, retries; prompts in :mod:`memory_pipelines.judge.prompts`). ``make_judge(llm,
embedder=...)`` picks one. A judge that cannot decide raises ``JudgeError``; callers then
keep things as they are.

Modules: ``decisions`` (types, the protocol, limits, shared pre-checks), ``lexicon`` and
``clauses`` (reading note text), ``rules`` and ``statements`` (the offline extraction
rules), ``offline``, ``schemas`` and ``litellm_judge``, ``prompts``, ``factory``.
"""

from memory_pipelines.judge.decisions import (
    CandidateExample,
    CandidateNote,
    ConsolidationDecision,
    ContradictionDecision,
    ConversationMessage,
    DedupeDecision,
    Judge,
    judged_messages,
)
from memory_pipelines.judge.factory import make_judge
from memory_pipelines.judge.lexicon import entities
from memory_pipelines.judge.litellm_judge import (
    RESPONSE_FORMATS,
    LiteLLMJudge,
    judge_options_from_env,
    parse_json_object,
)
from memory_pipelines.judge.offline import OfflineJudge
from memory_pipelines.judge.rules import reads_as_instruction
from memory_pipelines.judge.schemas import TASK_SCHEMAS

__all__ = [
    "RESPONSE_FORMATS",
    "TASK_SCHEMAS",
    "CandidateExample",
    "CandidateNote",
    "ConsolidationDecision",
    "ContradictionDecision",
    "ConversationMessage",
    "DedupeDecision",
    "Judge",
    "LiteLLMJudge",
    "OfflineJudge",
    "entities",
    "judge_options_from_env",
    "judged_messages",
    "make_judge",
    "parse_json_object",
    "reads_as_instruction",
]
