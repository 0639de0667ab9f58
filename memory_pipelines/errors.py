"""The project's error hierarchy: every error derives from ``MemoryPipelineError``."""


class MemoryPipelineError(Exception):
    """Root of every error this project raises."""


class ConfigError(MemoryPipelineError, ValueError):
    """A configuration value is missing or invalid."""


class ValidationError(MemoryPipelineError, ValueError):
    """Input failed validation; the message names the field."""


class UnknownAgentError(MemoryPipelineError, LookupError):
    """The agent id is not configured."""


class NotFoundError(MemoryPipelineError, LookupError):
    """A note, example or source row does not exist."""


class StoreError(MemoryPipelineError):
    """The LanceDB note store failed."""


class EmbeddingError(MemoryPipelineError):
    """The embedder failed."""


class EmbeddingModelMissingError(EmbeddingError):
    """The offline embedding model's weights are not on disk."""


class JudgeError(MemoryPipelineError):
    """The LLM judge could not give a decision (timeout, exception, malformed output).
    ``kind`` says which, for reports: "timed out", "call failed", "cut off at max_tokens",
    "unparsable reply", "reply fails its schema", or (the default) "refused by the judge's
    checks"."""

    def __init__(self, message: str = "", *, kind: str = "refused by the judge's checks") -> None:
        super().__init__(message)
        self.kind = kind


class SourceError(MemoryPipelineError):
    """The SQL source database failed or is unreachable."""


class HomeError(MemoryPipelineError):
    """The memory home cannot be used: it is not a folder, cannot be written, holds a
    corrupted SQLite file, or its note store is missing while the SQL database still
    references its notes. The message names the path."""


class AuthenticationError(MemoryPipelineError):
    """A request carries no API key, or one that is unknown, wrong or revoked (HTTP 401)."""


class PermissionDeniedError(MemoryPipelineError, PermissionError):
    """An API key asks for a context outside its binding (HTTP 403)."""


class RunConflictError(MemoryPipelineError):
    """A run id that another context (agent, company, user) already used: a run belongs
    to the one context that first used it (HTTP 409)."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its class name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
