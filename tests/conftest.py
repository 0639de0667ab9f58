"""Shared fixtures: a temporary memory home, a movable clock, services with a fake or
the real offline embedder. No test touches the network."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402
from reliability_helpers import restore_default_signals  # noqa: E402

from memory_pipelines import MemoryService  # noqa: E402
from memory_pipelines.clock import FakeClock  # noqa: E402
from memory_pipelines.embeddings import HashEmbedder, MiniLMEmbedder, model_available  # noqa: E402

# A runner that starts the suite in the background (SIGINT ignored) must not leave every
# child the tests start unable to be terminated (see restore_default_signals).
restore_default_signals()

# Property tests draw the same examples on every run: an example found by chance made one
# CI run fail and the next pass (a 200,000-character type quoted whole in a reason). To
# explore afresh, run with HYPOTHESIS_PROFILE=explore.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(autouse=True)
def no_inherited_dagster_home(monkeypatch):
    """No test records into the Dagster instance of the shell that runs the suite (`make
    test` exports the demo's DAGSTER_HOME, and `memory-pipelines cycle` runs through the
    instance DAGSTER_HOME names); a test that wants an instance sets its own."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


@pytest.fixture
def open_service(home, clock):
    """Opens services the way most tests do: ``open_service()`` is ``home`` with the cheap
    hashing embedder (64 dimensions) and the test clock; a first argument names another
    home, keywords override or add any ``MemoryService.open`` argument (``clock=None`` for
    the wall clock). Every service it opened is closed at teardown (closing is idempotent,
    so ``with open_service() as s:`` works too)."""
    opened: list[MemoryService] = []

    def open_(path=None, **overrides) -> MemoryService:
        kwargs = {"embedder": HashEmbedder(dim=64), "clock": clock, **overrides}
        service = MemoryService.open(home if path is None else path, **kwargs)
        opened.append(service)
        return service

    yield open_
    for service in reversed(opened):
        service.close()


@pytest.fixture
def svc(open_service):
    """A service with the cheap hashing embedder (unit tests)."""
    return open_service()


@pytest.fixture
def hashing_commands(monkeypatch):
    """Commands a test runs (``cli.main``, a server subprocess) open their home with the
    hashing embedder, and with the home's own SQL database and tables whatever the shell
    running the suite set."""
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    for name in ("MEMORY_SQL_URL", "MEMORY_LANCE_URI"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def minilm():
    """The real offline embedder, loaded once per session."""
    if not model_available():  # pragma: no cover - CI fetches the model first
        pytest.skip("MiniLM weights not available: run `memory-pipelines fetch-model`")
    emb = MiniLMEmbedder()
    emb.embed(["warm up"])
    return emb


@pytest.fixture
def svc_real(open_service, minilm):
    """A service with the real offline semantic embedder."""
    return open_service(embedder=minilm)


#: the one bucket of the test S3 server (:func:`s3_endpoint`)
S3_BUCKET = "memory-pipelines-test"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (free port) with one bucket, and the AWS_* environment
    pointing at it (AWS_ALLOW_HTTP left unset: the service derives it). Everything a stray
    AWS configuration on the machine could inject is neutralised, so the only credentials
    and endpoint in play are the test server's."""
    import boto3
    from moto.server import ThreadedMotoServer

    from memory_pipelines.storage import STORAGE_OPTIONS_ENV

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_ENDPOINT_URL": endpoint,
        }.items():
            mp.setenv(name, value)
        unset = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP", "AWS_ENDPOINT_URL_S3")
        for name in (*unset, STORAGE_OPTIONS_ENV):
            mp.delenv(name, raising=False)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=S3_BUCKET)
        yield endpoint
    server.stop()


@pytest.fixture
def s3_uri(s3_endpoint) -> str:
    """A fresh prefix in the test bucket."""
    return f"s3://{S3_BUCKET}/{uuid.uuid4().hex}"
