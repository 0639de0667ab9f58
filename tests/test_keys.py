"""API keys (CONTRACT §2.8): hashed storage, the key binding over a real loopback server,
the ``keys`` command, and ``serve`` refusing a non-loopback address without a key."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress

import httpx
import pytest
from reliability_helpers import PYTHON, free_port, running, subprocess_env

from memory_pipelines import MemoryService
from memory_pipelines.apps import cli
from memory_pipelines.apps.http import create_app
from memory_pipelines.errors import NotFoundError, PermissionDeniedError, ValidationError
from memory_pipelines.keys import bind_refusal, check_context, is_loopback, key_id_of

AGENT = "agent-1"
CTX = {"agent_id": AGENT, "run_id": "run-1", "user_id": "user-1", "company_id": "co-1"}
WRITE = [{"note": "User prefers tea over coffee", "type": "Preference"}]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def server(svc) -> Iterator[tuple[httpx.Client, str]]:
    svc.configure_agent(AGENT)
    svc.configure_agent("agent-2")
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c, url


def inject(client: httpx.Client, ctx: dict, secret: str | None = None) -> httpx.Response:
    headers = bearer(secret) if secret else {}
    return client.post("/v1/inject", json={"context": ctx}, headers=headers)


# --------------------------------------------------------------------------- service


def test_create_returns_a_secret_stored_only_as_a_hash(svc, home):
    secret = svc.create_api_key(company_id="co-1", agent_id=AGENT, user_id="user-1")
    key_id = key_id_of(secret)
    assert secret.startswith(f"mp_{key_id}_") and len(secret) > 50
    (row,) = svc.list_api_keys()
    assert row["key_id"] == key_id
    assert (row["company_id"], row["agent_id"], row["user_id"], row["admin"]) == (
        "co-1", AGENT, "user-1", False,
    )
    assert row["created_at"] == svc.now() and row["revoked_at"] is None
    assert "secret_hash" not in row and secret not in repr(row)
    stored = svc.sources.get_api_key(key_id)["secret_hash"]
    assert stored.startswith("sha256:") and secret not in stored
    svc.close()
    found = [p for p in home.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert found == []


def test_a_key_is_admin_or_bound_to_a_company(svc):
    with pytest.raises(ValidationError, match="admin or bound to a company"):
        svc.create_api_key()
    with pytest.raises(ValidationError, match="admin or bound to a company"):
        svc.create_api_key(agent_id=AGENT, user_id="user-1")
    with pytest.raises(ValidationError, match="admin key"):
        svc.create_api_key(admin=True, company_id="co-1")
    with pytest.raises(ValidationError, match="company_id"):
        svc.create_api_key(company_id="  ")
    svc.add_user("bob", company_id="co-2")
    with pytest.raises(ValidationError, match="belongs to company 'co-2'"):
        svc.create_api_key(company_id="co-1", user_id="bob")
    assert svc.list_api_keys() == []
    assert key_id_of(svc.create_api_key(admin=True))


def test_revoke_marks_the_key_with_the_service_clock(svc, clock):
    key_id = key_id_of(svc.create_api_key(company_id="co-1"))
    clock.advance(hours=1)
    svc.revoke_api_key(key_id)
    (row,) = svc.list_api_keys()
    assert row["revoked_at"] == svc.now()
    clock.advance(hours=1)
    svc.revoke_api_key(key_id)  # revoking again keeps the first time
    assert svc.list_api_keys()[0]["revoked_at"] < svc.now()
    with pytest.raises(NotFoundError):
        svc.revoke_api_key("nope")


# --------------------------------------------------------------------------- HTTP


def test_no_key_in_the_home_leaves_the_api_open(server):
    client, _ = server
    assert inject(client, CTX).status_code == 200
    assert inject(client, CTX, "mp_whatever_x").status_code == 200  # ignored while open


def test_a_key_created_while_serving_takes_effect(server, svc):
    client, _ = server
    assert inject(client, CTX).status_code == 200
    secret = svc.create_api_key(company_id="co-1")
    r = inject(client, CTX)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in r.json()["detail"]
    assert inject(client, CTX, secret).status_code == 200


def test_missing_wrong_or_revoked_keys_get_401(server, svc):
    client, _ = server
    secret = svc.create_api_key(company_id="co-1")
    other = svc.create_api_key(company_id="co-1")
    key_id = key_id_of(secret)
    for bad in (None, "garbage", f"mp_{key_id}_wrong", "mp_ffffffffffff_x", secret + "x"):
        r = inject(client, CTX, bad)
        assert r.status_code == 401, (bad, r.text)
        assert set(r.json()) == {"detail"}
    r = client.post("/v1/inject", json={"context": CTX}, headers={"Authorization": secret})
    assert r.status_code == 401  # not a Bearer header
    # an unauthenticated request learns nothing else: not even that its body is invalid
    assert client.post("/v1/memory-writes", content=b"{nope").status_code == 401
    svc.revoke_api_key(key_id)
    r = inject(client, CTX, secret)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert inject(client, CTX, other).status_code == 200
    svc.revoke_api_key(key_id_of(other))
    # every key revoked: the API stays locked rather than reopening
    assert inject(client, CTX).status_code == 401


def test_healthz_stays_open(server, svc):
    client, _ = server
    svc.create_api_key(company_id="co-1")
    assert client.get("/healthz").status_code == 200
    assert client.get("/openapi.json").status_code == 200


def test_a_company_key_acts_only_for_its_company(server, svc):
    client, _ = server
    secret = svc.create_api_key(company_id="co-1")
    body = {"context": CTX, "writes": WRITE}
    r = client.post("/v1/memory-writes", json=body, headers=bearer(secret))
    assert r.status_code == 200 and r.json()["results"][0]["disposition"] == "written"
    assert inject(client, {**CTX, "agent_id": "agent-2"}, secret).status_code == 200
    assert inject(client, {**CTX, "user_id": "someone-else", "run_id": "run-2"}, secret).status_code == 200
    for ctx in ({**CTX, "company_id": "co-2"}, {**CTX, "company_id": None}):
        r = inject(client, ctx, secret)
        assert r.status_code == 403, ctx
        assert set(r.json()) == {"detail"} and "co-1" in r.json()["detail"]
        other = {"context": {**ctx, "run_id": "run-9"}, "writes": WRITE}
        assert client.post("/v1/memory-writes", json=other, headers=bearer(secret)).status_code == 403
        r = client.post("/v1/explain", json={"context": ctx, "topic": "tea"}, headers=bearer(secret))
        assert r.status_code == 403
    # a user registered with another company cannot be claimed through this key
    svc.add_user("bob", company_id="co-2")
    assert inject(client, {**CTX, "user_id": "bob"}, secret).status_code == 403
    assert len(svc.notes()) == 1  # nothing was written by the refused requests


def test_agent_and_user_bindings(server, svc):
    client, _ = server
    agent_key = svc.create_api_key(company_id="co-1", agent_id=AGENT)
    user_key = svc.create_api_key(company_id="co-1", agent_id=AGENT, user_id="user-1")
    assert inject(client, CTX, agent_key).status_code == 200
    assert inject(client, {**CTX, "user_id": "user-2"}, agent_key).status_code == 200
    assert inject(client, {**CTX, "agent_id": "agent-2"}, agent_key).status_code == 403
    assert inject(client, CTX, user_key).status_code == 200
    assert inject(client, {**CTX, "user_id": "user-2"}, user_key).status_code == 403
    assert inject(client, {**CTX, "user_id": None}, user_key).status_code == 403
    assert inject(client, {**CTX, "agent_id": "agent-2"}, user_key).status_code == 403


def test_secondary_scopes_are_claims_the_key_must_allow(server, svc):
    client, _ = server
    plain = svc.create_api_key(company_id="co-1")
    scoped = svc.create_api_key(
        company_id="co-1", primary_scope=("org", "acme"), secondary_scopes={"project": "p1"}
    )
    claim = {**CTX, "secondary_scopes": {"project": "p1"}}
    assert inject(client, claim, plain).status_code == 403
    assert inject(client, claim, scoped).status_code == 200
    assert inject(client, {**CTX, "secondary_scopes": {"project": "p2"}}, scoped).status_code == 403
    assert inject(client, {**CTX, "secondary_scopes": {"team": "t"}}, scoped).status_code == 403
    primary = {**CTX, "primary_scope_entity_id": "org", "primary_scope_record_id": "acme"}
    assert inject(client, primary, plain).status_code == 403
    assert inject(client, primary, scoped).status_code == 200
    assert inject(client, {**primary, "primary_scope_record_id": "other"}, scoped).status_code == 403
    assert inject(client, CTX, scoped).status_code == 200  # claiming less is fine


def test_an_admin_key_acts_for_any_context(server, svc):
    client, _ = server
    admin = svc.create_api_key(admin=True)
    svc.create_api_key(company_id="co-1")
    for ctx in (
        CTX,
        {**CTX, "company_id": "co-2", "agent_id": "agent-2"},
        {"agent_id": AGENT},
        {**CTX, "secondary_scopes": {"project": "p1"}},
    ):
        assert inject(client, ctx, admin).status_code == 200, ctx
    r = client.post("/v1/memory-writes", json={"context": CTX, "writes": WRITE}, headers=bearer(admin))
    assert r.status_code == 200


def test_check_context_on_plain_mappings():
    key = {"company_id": "c", "agent_id": None, "user_id": None, "admin": False}
    check_context(None, {"agent_id": "a"})
    check_context({"admin": True}, {"agent_id": "a"})
    check_context(key, {"agent_id": "a", "company_id": "c"})
    with pytest.raises(PermissionDeniedError):
        check_context(key, {"agent_id": "a"})


# --------------------------------------------------------------------------- CLI


def run_cli(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out.strip().splitlines(), out.err


def test_cli_create_list_revoke(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    home = str(tmp_path / "h")
    code, lines, _ = run_cli(capsys, "keys", "create", "--home", home, "--company", "co-1",
                             "--agent", AGENT, "--scope", "project=p1")
    assert code == 0
    secret = lines[-1]
    key_id = key_id_of(secret)
    assert key_id and secret.startswith("mp_")
    code, lines, _ = run_cli(capsys, "keys", "create", "--home", home, "--admin")
    admin_secret = lines[-1]
    assert code == 0 and key_id_of(admin_secret)

    code, lines, _ = run_cli(capsys, "keys", "list", "--home", home)
    listing = "\n".join(lines)
    assert code == 0 and key_id in listing and "company=co-1 agent=agent-1" in listing
    assert "scope.project=p1" in listing and "admin" in listing
    assert secret not in listing and admin_secret not in listing and "sha256" not in listing

    code, lines, _ = run_cli(capsys, "keys", "revoke", key_id, "--home", home)
    assert code == 0
    code, lines, _ = run_cli(capsys, "keys", "list", "--home", home)
    (row,) = [line for line in lines if line.startswith(key_id)]
    assert " - " not in row.replace("  ", " ")  # has a revoked time
    code, _, err = run_cli(capsys, "keys", "revoke", "nope", "--home", home)
    assert code == 1 and "does not exist" in err

    for found in (tmp_path / "h").rglob("*"):
        if found.is_file():
            data = found.read_bytes()
            assert secret.encode() not in data and admin_secret.encode() not in data, found


def test_cli_create_needs_admin_or_company(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    home = str(tmp_path / "h")
    for argv in ([], ["--agent", AGENT], ["--admin", "--company", "c"], ["--admin", "--user", "u"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["keys", "create", "--home", home, *argv])
        assert exc.value.code == 2, argv
    capsys.readouterr()


# --------------------------------------------------------------------------- serve


def test_loopback_hosts():
    for host in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "10.0.0.1", "example.com", "192.168.1.2"):
        assert not is_loopback(host), host


def test_bind_refusal_needs_a_key_off_loopback(svc):
    assert bind_refusal("127.0.0.1", svc.sources) is None
    message = bind_refusal("0.0.0.0", svc.sources)
    assert message and "no API key" in message and "keys create" in message
    assert "\n" not in message
    svc.create_api_key(admin=True)
    assert bind_refusal("0.0.0.0", svc.sources) is None


def _serve(home, host: str, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, "-m", "memory_pipelines.apps.cli", "serve", "--home", str(home), "--host", host,
         "--port", str(port), "--log-level", "warning"],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_refuses_a_public_host_without_a_key_and_starts_with_one(tmp_path):
    home = tmp_path / "h"
    proc = _serve(home, "0.0.0.0", free_port())
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    assert "refusing to listen on '0.0.0.0'" in err and "keys create" in err

    created = subprocess.run(
        [PYTHON, "-m", "memory_pipelines.apps.cli", "keys", "create", "--home", str(home), "--admin"],
        env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip().splitlines()[-1]
    port = free_port()
    proc = _serve(home, "0.0.0.0", port)
    try:
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            with suppress(httpx.TransportError):
                status = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code
                break
            time.sleep(0.2)
        assert status == 200, proc.poll()
        r = httpx.post(f"http://127.0.0.1:{port}/v1/inject", json={"context": {"agent_id": "x"}})
        assert r.status_code == 401
        r = httpx.post(f"http://127.0.0.1:{port}/v1/inject", json={"context": {"agent_id": "x"}},
                       headers=bearer(secret))
        assert r.status_code == 404  # authenticated; the agent is unknown
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_key_bindings_are_ids_bounded_and_printable(tmp_path, capsys, monkeypatch):
    """A key's company, agent, user and scopes follow the id rules (200 characters, no
    control characters); `keys list` never writes a control character to the terminal."""
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    home = tmp_path / "h"
    with MemoryService.from_env(str(home)) as svc:
        for bad in ("ac\x1bme", "a" * 201, "line\nbreak", "\ud800"):
            with pytest.raises(ValidationError, match="company_id"):
                svc.create_api_key(company_id=bad)
            with pytest.raises(ValidationError, match="user_id"):
                svc.create_api_key(company_id="acme", user_id=bad)
        with pytest.raises(ValidationError, match="secondary_scopes"):
            svc.create_api_key(company_id="acme", secondary_scopes={"region": "eu\x1b[2J"})
        assert svc.list_api_keys() == []
        # a row stored before these checks still lists escaped
        svc.sources.add_api_key(
            {"key_id": "old", "secret_hash": "sha256:0", "company_id": "ac\x1b]0;x\x07me"}
        )
    assert cli.keys_command(["list", "--home", str(home)]) == 0
    assert cli.keys_command(["list", "--home", str(home), "--json"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b" in out
