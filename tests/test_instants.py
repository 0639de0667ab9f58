"""Instants a client sends (a notes cursor, ``as_of``, a note's dates) outside what the
service can store are refused as a ValidationError (HTTP 422), never a 500."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from reliability_helpers import running

from memory_pipelines.admin.notes import decode_cursor
from memory_pipelines.apps.http import create_app
from memory_pipelines.errors import ValidationError
from memory_pipelines.history.as_of import check_as_of
from memory_pipelines.notes import Note, RunContext

OUT_OF_RANGE = [
    "0001-01-01T00:00:00+14:00",  # before year 1 once in UTC
    "9999-12-31T23:59:59+00:00",
    "0001-01-01T00:00:00+00:00",
    "3000-01-01T00:00:00+00:00",
]


def _cursor(stamp: str, note_id: str = "n1") -> str:
    raw = json.dumps([stamp, note_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.fixture
def client(svc) -> Iterator[httpx.Client]:
    svc.configure_agent("a1")
    svc.add_note("The user likes tea.", agent_id="a1")
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c


@pytest.mark.parametrize("stamp", OUT_OF_RANGE)
def test_python_refuses_out_of_range_instants(svc, stamp):
    svc.configure_agent("a1")
    with pytest.raises(ValidationError, match="as_of"):
        check_as_of(stamp)
    with pytest.raises(ValidationError, match="as_of"):
        svc.inject(RunContext(agent_id="a1"), "tea", as_of=datetime.fromisoformat(stamp))
    with pytest.raises(ValidationError, match="cursor"):
        decode_cursor(_cursor(stamp))
    with pytest.raises(ValidationError, match="cursor"):
        svc.list_notes(cursor=_cursor(stamp))
    with pytest.raises(ValueError, match="range"):
        Note(note="x", type="Preference", created_at=stamp)


def test_in_range_instants_still_work(svc):
    svc.configure_agent("a1")
    assert check_as_of("2026-05-01T10:00:00+02:00") == datetime(2026, 5, 1, 8, tzinfo=UTC)
    assert decode_cursor(_cursor("2026-05-01T10:00:00+00:00"))[0] == datetime(2026, 5, 1, 10, tzinfo=UTC)
    svc.inject(RunContext(agent_id="a1"), "tea", as_of=datetime(1990, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize("stamp", OUT_OF_RANGE)
def test_http_answers_422_for_out_of_range_instants(client, stamp):
    r = client.get("/v1/notes", params={"cursor": _cursor(stamp)})
    assert r.status_code == 422, r.text
    assert "cursor" in r.text
    ctx = {"agent_id": "a1"}
    r = client.post("/v1/inject", json={"context": ctx, "current_input": "tea", "as_of": stamp})
    assert r.status_code == 422, r.text
    assert "as_of" in r.text
    r = client.post("/v1/explain", json={"context": ctx, "topic": "tea", "as_of": stamp})
    assert r.status_code == 422, r.text
    assert "as_of" in r.text
    assert client.get("/v1/notes").status_code == 200


def test_any_aware_instant_is_accepted_or_refused_cleanly():
    """Hypothesis: every aware instant, any offset, is either accepted (and usable as a
    cursor) or a ValidationError; nothing else escapes."""
    from datetime import timedelta, timezone

    from hypothesis import given, settings
    from hypothesis import strategies as st

    offsets = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))

    @settings(max_examples=120, deadline=None)
    @given(st.datetimes(timezones=offsets))
    def check(when):
        try:
            check_as_of(when)
        except ValidationError:
            return
        assert decode_cursor(_cursor(when.isoformat()))[0] == when

    check()
