"""The memory browser at /ui: pages, forms, escaping, errors, keys and CSRF, through
FastAPI's TestClient (cookies kept per client like a browser)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi.testclient import TestClient

from memory_pipelines.apps.http import create_app
from memory_pipelines.apps.http.ui import CSS_PATH, KEY_COOKIE, NONCE_COOKIE

ROOT = Path(__file__).resolve().parents[2]
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def client(svc) -> TestClient:
    return TestClient(create_app(svc, write_queue=False))


def seed(svc, clock):
    """Three acme notes and one globex note, a second apart (newest last)."""
    svc.add_company("acme")
    svc.add_company("globex")
    notes = {}
    for name, text, company, extra in [
        ("tea", "Prefers green tea in the morning", "acme", {}),
        ("metric", "Uses metric units in reports", "acme", {"type": "Constraint"}),
        ("old", "Old office address on Elm street", "acme", {"status": "Archived"}),
        ("rival", "Globex secret: launch date is May", "globex", {}),
    ]:
        clock.advance(seconds=1)
        notes[name] = svc.add_note(text, agent_id="helper", company_id=company, **extra)
    return notes


def token(html: str) -> str:
    found = TOKEN.search(html)
    assert found, "page has no CSRF token"
    return found.group(1)


class Markup(HTMLParser):
    """Collects what the accessibility checks look at."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def all(self, tag):
        return [a for t, a in self.tags if t == tag]


def markup(html: str) -> Markup:
    m = Markup()
    m.feed(html)
    return m


# --------------------------------------------------------------------------- pages


def test_list_filters_by_company_status_and_search(client, svc, clock):
    notes = seed(svc, clock)
    r = client.get("/ui", params={"company_id": "acme"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert notes["tea"].note in r.text and notes["metric"].note in r.text
    assert notes["rival"].note not in r.text
    assert f'href="/ui/notes/{notes["tea"].id}"' in r.text
    # newest first
    assert r.text.index(notes["metric"].note) < r.text.index(notes["tea"].note)
    archived = client.get("/ui", params={"company_id": "acme", "status": "Archived"}).text
    assert notes["old"].note in archived and notes["tea"].note not in archived
    found = client.get("/ui", params={"q": "METRIC reports"}).text
    assert notes["metric"].note in found and notes["tea"].note not in found
    assert 'value="METRIC reports"' in found  # the form keeps the search
    assert "No notes match" in client.get("/ui", params={"q": "nothing like this"}).text


def test_next_page_link_carries_the_cursor_and_the_filters(client, svc, clock):
    svc.add_company("acme")
    made = set()
    for i in range(5):
        clock.advance(seconds=1)
        made.add(svc.add_note(f"acme note {i}", agent_id="helper", company_id="acme").id)
    svc.add_note("other company", agent_id="helper", company_id="globex")
    seen: list[str] = []
    url = "/ui?company_id=acme&limit=2"
    pages = 0
    while url:
        html = client.get(url).text
        pages += 1
        seen += re.findall(r'href="/ui/notes/([^"]+)"', html)
        nxt = re.search(r'<a href="([^"]+)" rel="next">Next page</a>', html)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
        if url:
            query = parse_qs(urlsplit(url).query)
            assert query["company_id"] == ["acme"] and query["limit"] == ["2"] and query["cursor"]
    assert pages == 3
    assert len(seen) == len(set(seen)) == 5 and set(seen) == made


def test_note_page_shows_fields_provenance_and_history(client, svc, clock):
    svc.add_company("acme")
    source = svc.add_note("Source fact", agent_id="helper", company_id="acme")
    note = svc.add_note(
        "Merged fact",
        agent_id="helper",
        company_id="acme",
        importance_score=0.75,
        access_count=3,
        source_run_id="run-42",
        source_conversation_id="conv-7",
        derived_from_note_ids=[source.id],
        comments="[Created by analyst]",
    )
    svc.set_note_status(note.id, "Archived", "no longer true")
    r = client.get(f"/ui/notes/{note.id}")
    assert r.status_code == 200
    html = r.text
    for expected in ("Merged fact", "0.75", "run-42", "conv-7", "Archived", "company=acme",
                     "agent=helper", "[Created by analyst]", f'href="/ui/notes/{source.id}"'):
        assert expected in html, expected
    history = html[html.index('id="h-history"'):]
    assert "created" in history and "archived" in history
    assert "Active → Archived" in history and "no longer true" in history
    assert 'action="/ui/notes/' + note.id + '/restore"' in html  # retired: can be restored


def test_edit_archive_and_restore_through_the_forms(client, svc, clock):
    note = seed(svc, clock)["tea"]
    page = client.get(f"/ui/notes/{note.id}").text
    csrf = token(page)
    r = client.post(
        f"/ui/notes/{note.id}/edit",
        data={"csrf_token": csrf, "note": "Prefers black tea", "type": "Constraint",
              "protection_tier": "Protected"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == f"/ui/notes/{note.id}?done=edited"
    shown = client.get(r.headers["location"]).text
    assert "Saved your changes." in shown and 'role="status"' in shown
    saved = svc.get_note(note.id)
    assert (saved.note, saved.type, saved.protection_tier) == ("Prefers black tea", "Constraint", "Protected")
    same = client.post(
        f"/ui/notes/{note.id}/edit",
        data={"csrf_token": csrf, "note": "Prefers black tea", "type": "Constraint",
              "protection_tier": "Protected"},
    )
    assert same.status_code == 200 and "Nothing changed" in same.text
    r = client.post(f"/ui/notes/{note.id}/archive", data={"csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("?done=archived")
    assert svc.get_note(note.id).status == "Archived"
    r = client.post(f"/ui/notes/{note.id}/restore", data={"csrf_token": csrf})
    assert r.status_code == 200 and "Restored the note." in r.text
    assert svc.get_note(note.id).status == "Active"
    kinds = [e.event for e in svc.history(note.id)]
    assert kinds[0] == "created" and "updated" in kinds and "archived" in kinds
    assert kinds[-1] == "restored"


def test_every_note_text_is_escaped(client, svc):
    evil = svc.add_note('<script>alert(1)</script> & "quotes" <b>bold</b>', agent_id="a")
    for path in ("/ui", f"/ui/notes/{evil.id}"):
        html = client.get(path).text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "<script" not in html and "<b>bold" not in html
    svc.add_note("x", agent_id="a", user_id='"><img src=x onerror=alert(1)>')
    html = client.get("/ui", params={"q": '"><svg onload=alert(1)>'}).text
    assert "<svg" not in html and "<img" not in html
    assert "&#34;&gt;&lt;svg" in html or "&quot;&gt;&lt;svg" in html


def test_markup_is_accessible_and_self_contained(client, svc, clock):
    note = seed(svc, clock)["tea"]
    for path in ("/ui", f"/ui/notes/{note.id}"):
        html = client.get(path).text
        m = markup(html)
        assert m.all("html")[0].get("lang") == "en"
        assert any(a.get("name") == "viewport" for a in m.all("meta"))
        assert m.all("a")[0].get("href") == "#main"  # the skip link comes first
        assert m.all("header") and m.all("nav") and [a for a in m.all("main") if a.get("id") == "main"]
        assert m.all("table") and m.all("caption")
        assert all(a.get("scope") in ("col", "row") for a in m.all("th"))
        labelled = {a.get("for") for a in m.all("label")}
        for field in m.all("input") + m.all("select") + m.all("textarea"):
            if field.get("type") != "hidden":
                assert field.get("id") in labelled, field
        for tag in m.all("link") + m.all("script") + m.all("img"):
            target = tag.get("href") or tag.get("src") or ""
            assert target.startswith("/") and not target.startswith("//"), target
    css = client.get(CSS_PATH)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert "@media (max-width: 600px)" in css.text and ":focus-visible" in css.text


def test_ui_routes_stay_out_of_the_openapi_document(client):
    assert not [p for p in client.get("/openapi.json").json()["paths"] if p.startswith("/ui")]


# --------------------------------------------------------------------------- errors


def test_unknown_note_is_a_404_page(client, svc):
    r = client.get("/ui/notes/no-such-note")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "Not found" in r.text and "no-such-note" in r.text
    csrf = token(client.get("/ui/login").text)  # no key cookie: the same token
    r = client.post("/ui/notes/no-such-note/archive", data={"csrf_token": csrf})
    assert r.status_code == 404


@pytest.mark.parametrize(
    "params, words",
    [
        ({"status": "Bogus"}, "unknown status"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"company_id": "x" * 5000}, "company_id"),
        ({"agent_id": "a\x00b"}, "agent_id"),
    ],
)
def test_bad_filters_are_a_422_page(client, params, words):
    r = client.get("/ui", params=params)
    assert r.status_code == 422 and r.headers["content-type"].startswith("text/html")
    assert "Invalid input" in r.text and words in r.text


@pytest.mark.parametrize(
    "form, words",
    [
        ({"note": "   "}, "cannot be empty"),
        ({"note": "x" * 20_000}, "longer than"),
        ({"type": "Gossip"}, "unknown type"),
        ({"protection_tier": "Eternal"}, "unknown protection_tier"),
    ],
)
def test_bad_edits_are_a_422_page_and_change_nothing(client, svc, form, words):
    note = svc.add_note("Keep me", agent_id="a")
    csrf = token(client.get(f"/ui/notes/{note.id}").text)
    r = client.post(f"/ui/notes/{note.id}/edit", data={"csrf_token": csrf, **form})
    assert r.status_code == 422 and words in r.text
    assert svc.get_note(note.id).model_dump() == note.model_dump()


def test_a_form_with_invalid_utf8_stores_no_lone_surrogate(client, svc):
    """A browser cannot send a lone surrogate: its UTF-8 bytes (invalid UTF-8) become
    U+FFFD, which the note keeps as valid text."""
    note = svc.add_note("Keep me", agent_id="a")
    csrf = token(client.get(f"/ui/notes/{note.id}").text)
    r = client.post(
        f"/ui/notes/{note.id}/edit",
        content=f"csrf_token={csrf}&note=bad%ED%A0%80".encode(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200 and "Saved your changes." in r.text
    saved = svc.get_note(note.id).note
    assert saved.startswith("bad\ufffd") and saved.encode("utf-8")


# --------------------------------------------------------------------------- keys


def test_without_a_key_the_ui_answers_the_login_page(client, svc, clock):
    note = seed(svc, clock)["tea"]
    secret = svc.create_api_key(admin=True)
    r = client.get("/ui")
    assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
    assert 'action="/ui/login"' in r.text and note.note not in r.text
    assert client.get(f"/ui/notes/{note.id}").status_code == 401
    assert client.get(CSS_PATH).status_code == 200  # the stylesheet is open
    # the API keeps answering JSON
    assert client.post("/v1/inject", json={}).headers["content-type"].startswith("application/json")
    # a wrong secret: the login page again, with the reason
    csrf = token(r.text)
    bad = client.post("/ui/login", data={"csrf_token": csrf, "secret": "mp_nope_nope"})
    assert bad.status_code == 401 and "invalid API key" in bad.text
    r = client.post(
        "/ui/login",
        data={"csrf_token": csrf, "secret": secret, "next": f"/ui/notes/{note.id}"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == f"/ui/notes/{note.id}"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{KEY_COOKIE}=") and "HttpOnly" in cookie
    assert "SameSite=strict" in cookie and "Path=/ui" in cookie
    page = client.get(f"/ui/notes/{note.id}")
    assert page.status_code == 200 and note.note in page.text and "Log out" in page.text
    # the cookie is for the browser only: the API still wants the header
    assert client.post("/v1/inject", json={}).status_code == 401
    r = client.post("/ui/logout", data={"csrf_token": token(page.text)}, follow_redirects=False)
    assert r.status_code == 303 and KEY_COOKIE in r.headers["set-cookie"]
    assert client.get("/ui").status_code == 401


def test_login_only_follows_local_next_paths(client, svc):
    secret = svc.create_api_key(admin=True)
    csrf = token(client.get("/ui/login").text)
    for target in ("https://evil.example/", "//evil.example/ui", "/v1/inject", "/ui\\@evil"):
        r = client.post(
            "/ui/login", data={"csrf_token": csrf, "secret": secret, "next": target},
            follow_redirects=False,
        )
        assert r.status_code == 303 and r.headers["location"] == "/ui", target


def test_a_bound_key_sees_only_its_tenant(client, svc, clock):
    notes = seed(svc, clock)
    acme = {"Authorization": f"Bearer {svc.create_api_key(company_id='acme')}"}
    html = client.get("/ui", headers=acme).text
    assert notes["tea"].note in html and notes["rival"].note not in html
    assert "company=acme" in html  # the binding is shown
    assert 'value="acme" readonly' in html
    denied = client.get("/ui", params={"company_id": "globex"}, headers=acme)
    assert denied.status_code == 403 and notes["rival"].note not in denied.text
    # another tenant's note does not exist for this key
    rival = notes["rival"]
    page = client.get(f"/ui/notes/{rival.id}", headers=acme)
    assert page.status_code == 404 and rival.note not in page.text
    for action in ("archive", "restore", "edit"):
        r = client.post(f"/ui/notes/{rival.id}/{action}", headers=acme, data={"note": "pwned"})
        assert r.status_code == 404, action
    assert svc.get_note(rival.id).model_dump() == rival.model_dump()
    # searching for the other tenant's words finds nothing
    found = client.get("/ui", params={"q": "Globex secret"}, headers=acme).text
    assert rival.note not in found and "No notes match" in found


def test_state_changing_forms_need_the_csrf_token(client, svc, clock):
    note = seed(svc, clock)["tea"]
    secret = svc.create_api_key(admin=True)
    csrf = token(client.get("/ui/login").text)
    client.post("/ui/login", data={"csrf_token": csrf, "secret": secret})
    page = client.get(f"/ui/notes/{note.id}").text
    good = token(page)
    for data in ({}, {"csrf_token": ""}, {"csrf_token": "0" * 64}, {"csrf_token": csrf}):
        r = client.post(f"/ui/notes/{note.id}/archive", data=data)
        assert r.status_code == 403 and "security token" in r.text
    # another browser (its own nonce) cannot use this browser's token
    other = TestClient(client.app)
    other.cookies.set(KEY_COOKIE, secret, path="/ui")
    other.get("/ui")
    assert other.post(f"/ui/notes/{note.id}/archive", data={"csrf_token": good}).status_code == 403
    assert svc.get_note(note.id).status == "Active"
    assert client.post(f"/ui/notes/{note.id}/archive", data={"csrf_token": good}).status_code == 200
    assert svc.get_note(note.id).status == "Archived"


def test_pages_set_a_strict_nonce_cookie_and_no_store(client):
    r = client.get("/ui")
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{NONCE_COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert r.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert "set-cookie" not in client.get("/ui").headers  # kept once set


# --------------------------------------------------------------------------- in chromium


@pytest.mark.slow
@pytest.mark.skipif(
    not shutil.which("chromium") and not Path("/usr/bin/chromium").exists(), reason="no chromium"
)
def test_served_pages_in_headless_chromium(tmp_path):
    """scripts/ui_screenshots.py on a seeded home of two companies: the list and a note
    page as PNGs (desktop and phone), and the list's DOM holds acme's notes, no globex's."""
    dom = tmp_path / "list.html"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ui_screenshots.py"), "--out", str(tmp_path),
         "--dom", str(dom)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    for name in ("ui-notes.png", "ui-note.png", "ui-phone.png"):
        png = tmp_path / name
        assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = dom.read_text()
    listed = set(re.findall(r'href="/ui/notes/([^"]+)"', html))
    assert listed == set(summary["notes"]["acme"])
    assert not listed & set(summary["notes"]["globex"])
    assert "Globex" not in html and "Hank" not in html
    assert "Maria prefers replies in French." in html
