"""The HTTP API and the proxy are module-level routers that read their service from the
app serving the request: two apps in one process, over two homes, never answer from
each other's service, key set or write queue."""

from __future__ import annotations

import httpx
from reliability_helpers import running

from memory_pipelines.apps.http import create_app
from memory_pipelines.apps.proxy import create_app as create_proxy

AGENT = "agent-1"
CTX = {"agent_id": AGENT, "run_id": "run-1", "user_id": "user-1", "company_id": "co-1"}


def test_two_api_apps_in_one_process_keep_their_own_service(open_service, tmp_path):
    first, second = open_service(tmp_path / "one"), open_service(tmp_path / "two")
    for svc in (first, second):
        svc.configure_agent(AGENT, note_injection_strategy="Recent")
    first.add_note("Prefers green tea", agent_id=AGENT, user_id="user-1", company_id="co-1")
    second.add_note("Prefers black coffee", agent_id=AGENT, user_id="user-1", company_id="co-1")
    secret = second.create_api_key(admin=True)  # only the second home has keys
    with running(create_app(first)) as url_one, running(create_app(second)) as url_two:
        with (
            httpx.Client(base_url=url_one, timeout=60) as one,
            httpx.Client(base_url=url_two, timeout=60) as two,
        ):
            body = {"context": CTX, "current_input": "what does the user drink?"}
            a = one.post("/v1/inject", json=body)
            assert a.status_code == 200, a.text
            assert "green tea" in a.json()["message"] and "coffee" not in a.json()["message"]
            assert two.post("/v1/inject", json=body).status_code == 401
            b = two.post("/v1/inject", json=body, headers={"Authorization": f"Bearer {secret}"})
            assert b.status_code == 200, b.text
            assert "black coffee" in b.json()["message"] and "tea" not in b.json()["message"]
            write = {"context": CTX, "writes": [{"note": "Works from Lisbon", "type": "Context"}]}
            assert one.post("/v1/memory-writes", json=write).status_code == 200
            listed = one.get("/v1/notes", params={"q": "Lisbon"}).json()["notes"]
            assert [n["note"] for n in listed] == ["Works from Lisbon"]
            assert second.notes(note="Works from Lisbon").empty
            assert one.get("/healthz").json()["counts"]["notes"] == 2
            assert two.get("/healthz").json()["counts"]["notes"] == 1


def test_two_proxies_in_one_process_keep_their_own_model_and_service(open_service, tmp_path):
    first, second = open_service(tmp_path / "one"), open_service(tmp_path / "two")
    first.configure_agent(AGENT)
    app_one, app_two = create_proxy(first, "offline"), create_proxy(second, "openai/other")
    assert app_one.state.proxy.svc is first and app_two.state.proxy.svc is second
    with running(app_one) as url_one, running(app_two) as url_two:
        assert httpx.get(f"{url_one}/v1/models").json()["data"][0]["id"] == "offline"
        assert httpx.get(f"{url_two}/v1/models").json()["data"][0]["id"] == "openai/other"
        turn = {"messages": [{"role": "user", "content": "hello"}]}
        headers = {"X-Memory-Agent": AGENT}
        assert (
            httpx.post(f"{url_one}/v1/chat/completions", json=turn, headers=headers).status_code
            == 200
        )
        unknown = httpx.post(f"{url_two}/v1/chat/completions", json=turn, headers=headers)
        assert unknown.status_code == 404  # the agent is configured in the first home only
