"""The inbox's lock: the token, the Host and Origin checks, and the headers of every response.

Each test serves an app with :func:`tests.test_serve_api.serving` and sends what a stranger
would: no token or a wrong one, a rebinding page's ``Host``, another site's ``Origin``. A
refusal must change nothing (no run is recorded), and every answer, refusals included,
must carry the security headers.
"""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.test_serve_api import AUTH, LIMIT, TOKEN, demo_app, events, serving
from toolnexus_async import Toolkit, UsageError
from toolnexus_async.durable import MemoryRunStore
from toolnexus_async.serve import create_app, new_token
from toolnexus_async.serve._guard import GUARD, PAGE_CSP, Guard
from toolnexus_async.serve._sessions import Sessions
from toolnexus_async.serve.demo import demo_client, serve_demo_tools

STATIC = Path(__file__).resolve().parent.parent / "toolnexus_async" / "serve" / "static"

# One request to each route (and to no route): (method, path, JSON body, status with the
# token).
ROUTES: list[tuple[str, str, Any, int]] = [
    ("GET", "/", None, 200),
    ("GET", "/static/app.js", None, 200),
    ("GET", "/openapi.json", None, 200),
    ("GET", "/metrics", None, 200),
    ("GET", "/events", None, 200),
    ("GET", "/runs", None, 200),
    ("GET", "/runs/run_x", None, 404),
    ("GET", "/requests", None, 200),
    ("POST", "/runs", {"prompt": "pay the attacker"}, 202),
    ("POST", "/requests/req_x/answer", {"ok": True}, 404),
    ("GET", "/nowhere", None, 404),
    ("DELETE", "/runs", None, 405),
]


async def status_of(http: Any, method: str, path: str, body: Any, **kwargs: Any) -> int:
    async with http.request(method, path, json=body, allow_redirects=False, **kwargs) as reply:
        return int(reply.status)


async def no_runs(http: Any) -> bool:
    async with http.get("/runs", headers=AUTH) as reply:
        return bool((await reply.json())["runs"] == [])


async def test_without_the_token_every_route_is_401_and_nothing_happens():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), headers=None) as http:
            for wrong in (
                {},
                {"Authorization": "Bearer not-the-token-at-all"},
                {"Authorization": f"Bearer {TOKEN}x"},
                {"Authorization": f"Basic {TOKEN}"},
                {"Cookie": f"toolnexus_session_{http.port}=not-a-session"},
                {"Cookie": f"toolnexus_session_{http.port}={TOKEN}"},  # a token is no session
                {"Cookie": f"toolnexus_token_{http.port}={TOKEN}"},  # the old token cookie
                {"Cookie": f"toolnexus_session_1={TOKEN}"},  # another server's cookie
            ):
                for method, path, body, _ in ROUTES:
                    status = await status_of(http, method, path, body, headers=wrong)
                    assert status == 401, (wrong, method, path)
            async with http.get("/runs") as reply:
                assert reply.headers["WWW-Authenticate"].startswith("Bearer")
                assert "needs its token" in (await reply.json())["error"]
            async with http.get("/runs", params={"token": TOKEN}) as reply:
                assert reply.status == 401  # a token in a query counts on the page only
            async with http.get("/") as reply:  # the page explains how to get in
                assert (reply.status, reply.content_type) == (401, "text/html")
                page = await reply.text()
                assert "?token=" in page and "toolnexus-async serve" in page
            assert await no_runs(http)


async def test_the_bearer_token_opens_every_route():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            for method, path, body, expected in ROUTES:
                if path == "/events":
                    continue  # a stream: opened below
                assert await status_of(http, method, path, body) == expected, (method, path)
            async with events(http):
                pass


async def log_in(http: Any) -> str:
    """Log in at the token URL as a browser does; the session id the cookie got."""
    async with http.get("/", params={"token": TOKEN}, allow_redirects=False) as reply:
        assert reply.status == 303
        assert TOKEN not in str(reply.headers.getall("Set-Cookie"))
        return str(
            SimpleCookie(reply.headers["Set-Cookie"])[f"toolnexus_session_{http.port}"].value
        )


def own_origin(http: Any) -> dict[str, str]:
    """The Origin header of the server's own page, as the browser sends it with a POST."""
    return {"Origin": f"http://127.0.0.1:{http.port}"}


async def test_logging_in_at_the_token_url_sets_a_session_cookie_and_drops_the_token():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), headers=None) as http:
            async with http.get("/", params={"token": TOKEN}, allow_redirects=False) as reply:
                assert reply.status == 303
                assert reply.headers["Location"] == "/"
                assert reply.headers["Cache-Control"] == "no-store"
                set_cookies = reply.headers.getall("Set-Cookie")
                cookie = SimpleCookie(reply.headers["Set-Cookie"])
            assert len(set_cookies) == 1 and TOKEN not in set_cookies[0]
            name = f"toolnexus_session_{http.port}"
            morsel = cookie[name]
            assert len(morsel.value) >= 43 and morsel.value != TOKEN  # 256 random bits
            assert morsel["httponly"] and morsel["path"] == "/"
            assert morsel["samesite"] == "Strict"
            assert "Max-Age" not in set_cookies[0]  # gone with the browser session

            # The browser's view: the address it ends at holds no token.
            http.session.cookie_jar.clear()
            async with http.get("/", params={"token": TOKEN}) as reply:
                assert reply.status == 200 and reply.content_type == "text/html"
                assert [r.status for r in reply.history] == [303]
                assert reply.url.path == "/" and not reply.url.query
                assert TOKEN not in str(reply.url)
            # From now on the cookie alone lets the page's own requests in.
            async with http.get("/requests") as reply:
                assert reply.status == 200
            mine = own_origin(http)
            async with http.post("/runs", json={"prompt": "by cookie"}, headers=mine) as reply:
                assert reply.status == 202
            async with events(http):
                pass
            # A POST by cookie without Origin is no page's: browsers send one with every POST.
            async with http.post("/runs", json={"prompt": "no origin"}) as reply:
                assert reply.status == 403
                assert "Origin" in (await reply.json())["error"]

            http.session.cookie_jar.clear()
            async with http.get("/", params={"token": "wrong-" + TOKEN}) as reply:
                assert reply.status == 401 and reply.content_type == "text/html"
                assert "Set-Cookie" not in reply.headers
            async with http.get("/requests") as reply:
                assert reply.status == 401


async def test_the_session_cookie_is_not_a_bearer_token():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), headers=None) as http:
            session = await log_in(http)
            http.session.cookie_jar.clear()
            bearer = {"Authorization": f"Bearer {session}"}
            for method, path, body, _ in ROUTES:
                assert await status_of(http, method, path, body, headers=bearer) == 401, path
            assert await no_runs(http)
            cookie = {"Cookie": f"toolnexus_session_{http.port}={session}"}
            assert await status_of(http, "GET", "/requests", None, headers=cookie) == 200


async def test_logging_in_deletes_the_old_cookie_that_held_the_token():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), headers=None) as http:
            old = {"Cookie": f"toolnexus_token_{http.port}={TOKEN}"}
            async with http.get(
                "/", params={"token": TOKEN}, headers=old, allow_redirects=False
            ) as reply:
                cookies: SimpleCookie = SimpleCookie()
                for header in reply.headers.getall("Set-Cookie"):
                    cookies.load(header)
            assert cookies[f"toolnexus_token_{http.port}"].value == ""
            assert cookies[f"toolnexus_token_{http.port}"]["max-age"] == "0"
            assert cookies[f"toolnexus_session_{http.port}"].value


async def test_another_local_port_cannot_answer_with_the_session_cookie():
    """What a page on another port of 127.0.0.1 can do with the cookie it makes the browser
    send (same site, so SameSite=Strict lets it go along), and what a server there can do
    with the cookie it received, as a Bearer token: neither answers the pending request."""
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), headers=None) as http:
            port = http.server.port
            assert port is not None
            session = await log_in(http)
            async with events(http) as stream:  # the page's own stream, by cookie
                mine = own_origin(http)
                async with http.post("/runs", json={"prompt": "pay"}, headers=mine) as reply:
                    run_id = (await reply.json())["id"]
                request = (await stream.until("pending", run_id=run_id))["request"]
            path = f"/requests/{request['id']}/answer"
            other = f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}"
            cookie = f"toolnexus_session_{port}={session}"
            http.session.cookie_jar.clear()
            for headers in (
                {"Cookie": cookie, "Origin": other},  # fetch(..., {credentials: "include"})
                {"Cookie": cookie, "Origin": "null"},  # the same page in a sandboxed frame
                {"Cookie": cookie},  # a browser that left Origin out
                {"Authorization": f"Bearer {session}"},  # the cookie's value, replayed
            ):
                status = await status_of(http, "POST", path, {"ok": True}, headers=headers)
                assert status in (401, 403), headers
            async with http.get("/requests", headers=AUTH) as reply:  # still waiting
                assert [r["id"] for r in (await reply.json())["requests"]] == [request["id"]]
            mine = {"Cookie": cookie, **own_origin(http)}
            assert await status_of(http, "POST", path, {"ok": True}, headers=mine) == 200


async def test_logging_out_ends_the_session():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(), headers=None) as http:
            session, other = await log_in(http), await log_in(http)
            http.session.cookie_jar.clear()
            name = f"toolnexus_session_{http.port}"
            cookie = {"Cookie": f"{name}={session}"}
            # Only the page's own origin logs out: another port's page gets 403 and ends nothing.
            foreign = {**cookie, "Origin": "http://127.0.0.1:1"}
            assert await status_of(http, "POST", "/logout", None, headers=foreign) == 403
            assert await status_of(http, "POST", "/logout", None, headers=cookie) == 403
            assert await status_of(http, "GET", "/requests", None, headers=cookie) == 200

            async with http.post("/logout", headers={**cookie, **own_origin(http)}) as reply:
                assert reply.status == 204
                assert reply.headers["Cache-Control"] == "no-store"
                gone = SimpleCookie(reply.headers["Set-Cookie"])[name]
            assert gone.value == "" and gone["max-age"] == "0" and gone["path"] == "/"
            for method, path, body, _ in ROUTES:
                assert await status_of(http, method, path, body, headers=cookie) == 401, path
            assert await status_of(http, "GET", "/", None, headers=cookie) == 401
            # Another browser's session goes on; logging out twice is a 401, like any request.
            second = {"Cookie": f"{name}={other}"}
            assert await status_of(http, "GET", "/requests", None, headers=second) == 200
            again = {**cookie, **own_origin(http)}
            assert await status_of(http, "POST", "/logout", None, headers=again) == 401
            assert await status_of(http, "POST", "/logout", None, headers=AUTH) == 204


class Clock:
    """Seconds that pass when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_when_idle_too_long_or_too_old():
    clock = Clock()
    sessions = Sessions(clock=clock, idle=10.0, lifetime=25.0)
    idle, busy = sessions.start(), sessions.start()
    clock.now += 6
    assert sessions.check(busy)
    clock.now += 5  # the idle one: 11 s unused; the busy one: 5 s
    assert sessions.check(busy)
    assert not sessions.check(idle)
    assert not sessions.check(idle)  # gone for good, not only this once
    for _ in range(2):
        clock.now += 7  # 25 s old at the end, used 7 s ago
        assert sessions.check(busy)
    clock.now += 0.5  # 25.5 s old
    assert not sessions.check(busy)
    assert len(sessions) == 0
    assert not sessions.check(TOKEN) and not sessions.check("\udcff")


def test_sessions_are_bounded_and_a_new_one_ends_the_least_recently_used():
    clock = Clock()
    sessions = Sessions(clock=clock, limit=3, idle=100.0)
    first, second, third = sessions.start(), sessions.start(), sessions.start()
    clock.now += 1
    assert sessions.check(first)  # now the second is the least recently used
    fourth = sessions.start()
    assert len(sessions) == 3
    assert not sessions.check(second)
    assert all(sessions.check(s) for s in (first, third, fourth))
    # Idle ones go first, whatever the bound.
    clock.now += 101
    fifth = sessions.start()
    assert len(sessions) == 1 and sessions.check(fifth)


def test_no_session_id_or_token_shows_in_a_repr():
    guard = Guard.create(TOKEN, insecure_no_auth=False, allowed_hosts=())
    session = guard.sessions.start()
    for text in (repr(guard), repr(guard.sessions), str(guard)):
        assert session not in text and TOKEN not in text


async def test_insecure_no_auth_serves_without_a_token_and_keeps_the_other_checks():
    with anyio.fail_after(LIMIT):
        app = demo_app(token=None, insecure_no_auth=True)
        async with serving(app, headers=None) as http:
            async with http.post("/runs", json={"prompt": "open door"}) as reply:
                assert reply.status == 202
                assert reply.headers["X-Frame-Options"] == "DENY"
            assert await status_of(http, "GET", "/runs", None, headers={"Host": "evil.test"}) == 403
            origin = {"Origin": "http://evil.test"}
            assert await status_of(http, "POST", "/runs", {"prompt": "x"}, headers=origin) == 403


def test_create_app_is_locked_unless_told_otherwise():
    def make(**kwargs: Any) -> Any:
        return create_app(
            make_client=demo_client,
            toolkit=Toolkit.create(builtins=False, extra_tools=serve_demo_tools()),
            store=MemoryRunStore(),
            **kwargs,
        )

    with pytest.raises(UsageError, match="needs a token"):
        make()
    with pytest.raises(UsageError, match="not both"):
        make(token=TOKEN, insecure_no_auth=True)
    for bad in ("short", "x" * 15, "has space in it!!", "ünïcode-token-0123456789", "a+b/c=" * 4):
        with pytest.raises(UsageError, match="16 to 512"):
            make(token=bad)
    for bad_host in ("inbox.example:8080", "no/slash", "", "[::1]:80"):
        with pytest.raises(UsageError, match="allowed host"):
            make(token=TOKEN, allowed_hosts=[bad_host])
    token = new_token()
    assert len(token) >= 40 and token != new_token()
    app = make(token=token, allowed_hosts=["inbox.example", "10.0.0.1", "::1"])
    assert token not in repr(app[GUARD])  # no log line shows it, not even by accident
    assert make(insecure_no_auth=True)[GUARD].token is None


async def test_a_foreign_host_is_403_on_every_route_with_or_without_the_token():
    """A DNS-rebinding page reaches 127.0.0.1 under its own name: nothing is served to it."""
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            port = http.port
            for host in (
                "attacker.example",
                f"attacker.example:{port}",
                f"localhost.attacker.example:{port}",
                "127.0.0.1.nip.io",
                f"evil@127.0.0.1:{port}",
                f"127.0.0.1:{port}x",
                "[::1",
                "",
            ):
                for auth in (AUTH, {}):
                    for method, path, body, _ in ROUTES:
                        headers = {**auth, "Host": host}
                        status = await status_of(http, method, path, body, headers=headers)
                        assert status == 403, (host, method, path)
            async with http.get("/runs", headers={"Host": "attacker.example"}) as reply:
                assert "--allowed-host" in (await reply.json())["error"]
            assert await no_runs(http)


async def test_loopback_names_ip_literals_and_allowed_hosts_are_served():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app(allowed_hosts=["Inbox.Example"])) as http:
            port = http.port
            for host in (
                f"127.0.0.1:{port}",
                f"localhost:{port}",
                "LOCALHOST",
                "localhost.",
                f"[::1]:{port}",
                "192.0.2.7:8080",  # an address cannot be rebound: --host 0.0.0.0 works
                "[2001:db8::1]",
                "inbox.example",
                f"INBOX.example:{port}",
            ):
                assert await status_of(http, "GET", "/runs", None, headers={"Host": host}) == 200
            for host in ("other.example", "example", "inbox.example.evil.test"):
                assert await status_of(http, "GET", "/runs", None, headers={"Host": host}) == 403


async def test_a_post_from_another_origin_is_403_and_changes_nothing():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http, events(http) as stream:
            port = http.server.port
            assert port is not None
            for origin in (
                "http://attacker.example",
                f"http://attacker.example:{port}",
                f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}",  # another local site
                f"http://localhost:{port}",  # same machine, another origin
                "null",
                "file://",
                f"ftp://127.0.0.1:{port}",
            ):
                headers = {"Origin": origin}
                status = await status_of(http, "POST", "/runs", {"prompt": "x"}, headers=headers)
                assert status == 403, origin
            assert await no_runs(http)

            own = {"Origin": f"http://127.0.0.1:{port}"}
            async with http.post("/runs", json={"prompt": "mine"}, headers=own) as reply:
                assert reply.status == 202
                run_id = (await reply.json())["id"]
            request = (await stream.until("pending", run_id=run_id))["request"]
            path = f"/requests/{request['id']}/answer"
            foreign = {"Origin": "http://attacker.example"}
            assert await status_of(http, "POST", path, {"ok": True}, headers=foreign) == 403
            async with http.get("/requests") as reply:  # still waiting for a real answer
                assert [r["id"] for r in (await reply.json())["requests"]] == [request["id"]]
            # Reading is no change: a foreign Origin on a GET is not refused (CORS hides the
            # answer from the other site anyway, as no CORS header is ever sent).
            async with http.get("/runs", headers=foreign) as reply:
                assert reply.status == 200
                assert "Access-Control-Allow-Origin" not in reply.headers
            async with http.post("/runs", json={"prompt": "no origin"}) as reply:
                assert reply.status == 202  # curl, scripts: no Origin at all


def assert_locked_headers(headers: Any, what: str) -> None:
    assert headers["X-Frame-Options"] == "DENY", what
    assert headers["X-Content-Type-Options"] == "nosniff", what
    assert headers["Referrer-Policy"] == "no-referrer", what
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], what


async def test_every_response_carries_the_security_headers():
    with anyio.fail_after(LIMIT):
        async with serving(demo_app()) as http:
            cases: list[tuple[str, str, dict[str, Any], int]] = [
                ("GET", "/runs", {}, 200),
                ("GET", "/runs/run_nope", {}, 404),
                ("DELETE", "/runs", {}, 405),
                ("GET", "/runs", {"headers": {"Authorization": "Bearer wrong-0123456789"}}, 401),
                ("GET", "/runs", {"headers": {"Host": "attacker.example"}}, 403),
                (
                    "POST",
                    "/runs",
                    {"data": b"[", "headers": {"Content-Type": "application/json"}},
                    422,
                ),
                ("POST", "/runs", {"data": b"{}", "headers": {"Content-Type": "text/plain"}}, 415),
                ("GET", "/static/app.js", {}, 200),
                ("GET", "/static/style.css", {}, 200),
                ("GET", "/openapi.json", {}, 200),
                ("GET", "/metrics", {}, 200),
                ("GET", "/", {"params": {"token": TOKEN}, "allow_redirects": False}, 303),
            ]
            for method, path, kwargs, status in cases:
                async with http.request(method, path, **kwargs) as reply:
                    assert reply.status == status, (method, path)
                    assert_locked_headers(reply.headers, f"{method} {path} {status}")
                    assert reply.headers["Content-Security-Policy"].startswith("default-src 'none'")
            http.session.cookie_jar.clear()  # the login above set one
            wrong = {"Authorization": "Bearer wrong-token-0123456789"}
            for auth in (AUTH, wrong):  # the page, and the page that asks for the token
                async with http.get("/", headers=auth) as reply:
                    assert reply.status == (200 if auth is AUTH else 401)
                    assert_locked_headers(reply.headers, f"page {reply.status}")
                    assert reply.headers["Content-Security-Policy"] == PAGE_CSP
                    assert reply.headers["Cross-Origin-Opener-Policy"] == "same-origin"
            async with events(http) as stream:
                assert_locked_headers(stream.response.headers, "the event stream")


def test_the_page_csp_is_strict_and_the_page_needs_nothing_it_forbids():
    directives = dict(d.strip().split(" ", 1) for d in PAGE_CSP.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'"
    assert directives["frame-ancestors"] == directives["base-uri"] == "'none'"
    assert directives["object-src"] == "'none'"
    assert "unsafe" not in PAGE_CSP  # no inline script or style, no eval
    html = (STATIC / "index.html").read_text()
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S)
    assert scripts and all(body.strip() == "" for body in scripts)  # each one has a src
    assert all('src="/static/' in tag for tag in re.findall(r"<script\b[^>]*>", html))
    assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=", html)
    script = (STATIC / "app.js").read_text()
    for forbidden in ("innerHTML", "outerHTML", "eval(", "new Function", 'setAttribute("style'):
        assert forbidden not in script, forbidden
