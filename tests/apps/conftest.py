"""Fixtures of the app tests: the OpenAI-compatible stub upstream the proxy talks to."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from reliability_helpers import running

from memory_pipelines.apps.openai_stub import create_stub_app


@pytest.fixture
def stub() -> Iterator[Any]:
    """The stub upstream on loopback: its ``app.state`` (``.url``, and what it was sent)."""
    app = create_stub_app()
    with running(app) as url:
        app.state.url = url
        yield app.state
