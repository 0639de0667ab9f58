"""Property tests over hostile input: random write requests and run contexts never make
``svc.write`` raise anything but the documented errors, every result has a valid
disposition, and a batch that saves nothing changes nothing stored. The HTTP API is
fuzzed from its own OpenAPI schema (schemathesis) against a real server: no 5xx."""

from __future__ import annotations

import hypothesis.strategies as st
import schemathesis
from hypothesis import HealthCheck, given, settings
from reliability_helpers import running, snapshot

from memory_pipelines import RunContext
from memory_pipelines.errors import UnknownAgentError, ValidationError
from memory_pipelines.http import create_app
from memory_pipelines.limits import clip_texts, printable

DISPOSITIONS = {
    "written", "superseded-own", "deduped", "skipped-duplicate", "skipped-cap",
    "rejected-type", "skipped-disabled", "error",
}
SAVING = {"written", "superseded-own", "deduped"}
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
plausible_text = st.sampled_from(
    ["User prefers tea", "  ", "", "User prefers TEA ", "x" * 2100, "Line\nbreak\u2028sep",
     "</memory_policy>", "User works in Paris", "\x00nul"]
) | st.text(max_size=60)
requests = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"note": plausible_text | json_values,
         "type": st.sampled_from(["Preference", "Context", "Constraint", "preference", "Issue",
                                  "Example", ""]) | json_values},
        optional={"scopeHint": st.sampled_from(["user", "agent", "global", "USER", None]) | json_values,
                  "extra": json_values},
    ),
)
ids = st.sampled_from(["agent-1", "agent-2", "ghost", "", "u1", "r1", "r2"]) | st.text(max_size=10)
contexts = st.one_of(
    st.fixed_dictionaries(
        {"agent_id": st.sampled_from(["agent-1", "agent-2"])},
        optional={"run_id": st.sampled_from(["r1", "r2", "r3"]) | st.none(),
                  "user_id": st.sampled_from(["u1", "u2"]) | st.none(),
                  "company_id": st.sampled_from(["c1"]) | st.none()},
    ),
    st.dictionaries(st.sampled_from(["agent_id", "run_id", "user_id", "company_id",
                                     "secondary_scopes", "bogus"]), ids | json_values, max_size=5),
)


def test_random_writes_never_escape(svc):
    svc.configure_agent("agent-1")
    svc.configure_agent("agent-2", allow_memory_write=False)
    svc.add_note("User prefers tea", agent_id="agent-1", user_id="u1")

    @SETTINGS
    @given(ctx=contexts, batch=st.lists(requests, max_size=6))
    def check(ctx, batch):
        before = snapshot(svc)
        try:
            results = svc.write(ctx, batch)
        except (UnknownAgentError, ValidationError):
            assert snapshot(svc) == before
            return
        assert len(results) == len(batch)
        for res, req in zip(results, batch, strict=True):
            assert res.disposition in DISPOSITIONS
            if res.disposition == "rejected-type":  # long or non-UTF-8 text comes back cut
                assert res.request == clip_texts(printable(req))
            else:
                assert res.request is req or res.request == req
            assert isinstance(res.reason, str) and res.reason
        if not any(r.disposition in SAVING for r in results):
            assert snapshot(svc) == before
        for r in results:
            if r.disposition == "written":
                note = svc.get_note(r.note_id)
                assert note is not None and note.type in ("Preference", "Context")
                assert note.agent_id == RunContext.model_validate(ctx).agent_id

    check()


def test_rejected_requests_store_nothing(svc):
    svc.configure_agent("agent-1")
    svc.add_note("User prefers tea", agent_id="agent-1", user_id="u1")
    bad = st.one_of(
        json_values.filter(lambda v: not isinstance(v, dict)),
        st.fixed_dictionaries({"note": plausible_text, "type": st.sampled_from(
            ["Constraint", "constraint", "Issue", "Example", "", "Preference "])}),
        st.fixed_dictionaries({"note": st.sampled_from(["", "   ", "x" * 2001]),
                               "type": st.just("Preference")}),
        st.fixed_dictionaries({"note": st.integers() | st.none() | st.lists(st.text()),
                               "type": st.just("Context")}),
        st.fixed_dictionaries({"note": st.just("User prefers coffee"), "type": st.just("Context"),
                               "scopeHint": st.sampled_from(["global", "company", "USER", 3])}),
    )

    @SETTINGS
    @given(batch=st.lists(bad, min_size=1, max_size=5))
    def check(batch):
        before = snapshot(svc)
        results = svc.write(RunContext(agent_id="agent-1", run_id="r1", user_id="u1"), batch)
        assert [r.disposition for r in results] == ["rejected-type"] * len(batch)
        assert all(r.note_id is None for r in results)
        assert snapshot(svc) == before

    check()


def test_openapi_fuzz_no_server_errors(svc):
    """Every operation of /openapi.json, fuzzed (valid and invalid inputs): never a 5xx."""
    svc.configure_agent("agent-1", inject_examples=True)
    svc.add_note("User prefers tea", agent_id="agent-1")
    with running(create_app(svc)) as url:
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        ops = [op.ok() for op in schema.get_all_operations()]
        assert {op.path for op in ops} >= {"/v1/memory-writes", "/v1/inject", "/healthz"}
        from schemathesis import GenerationMode

        strategies = [
            op.as_strategy(generation_mode=mode)
            for op in ops
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
        seen: dict[int, int] = {}

        @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        @given(case=st.one_of(strategies))
        def check(case):
            resp = case.call(base_url=url, timeout=60)
            seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
            assert resp.status_code < 500, (case.method, case.path, case.body, resp.text)

        check()
        assert any(200 <= s < 300 for s in seen), seen
        assert any(400 <= s < 500 for s in seen), seen


def test_openapi_fuzz_with_api_keys_no_server_errors(svc):
    """The same fuzzing once the home has keys: no key, a company key or an admin key on
    each request; never a 5xx, and the refusals are 401/403 in the error shape."""
    svc.configure_agent("agent-1")
    headers = [
        None,
        {"Authorization": "Bearer " + svc.create_api_key(company_id="co-1")},
        {"Authorization": "Bearer " + svc.create_api_key(admin=True)},
    ]
    with running(create_app(svc)) as url:
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        from schemathesis import GenerationMode

        strategies = [
            op.ok().as_strategy(generation_mode=mode)
            for op in schema.get_all_operations()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
        seen: dict[int, int] = {}

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        @given(case=st.one_of(strategies), auth=st.sampled_from(headers))
        def check(case, auth):
            resp = case.call(base_url=url, timeout=60, headers=auth)
            seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
            assert resp.status_code < 500, (case.method, case.path, case.body, resp.text)
            if resp.status_code in (401, 403):
                assert isinstance(resp.json()["detail"], str)
            if auth is None and case.path != "/healthz":
                assert resp.status_code in (401, 404, 405), (case.path, resp.status_code)

        check()
        assert 401 in seen, seen
