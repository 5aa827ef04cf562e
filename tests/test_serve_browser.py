"""The serve page in a real browser: Debian's Chromium, driven by Playwright.

The real command, ``toolnexus-async serve --port 0``, runs in a child process; the tests
read the URL it prints, with its token, and open it as a person would. One test logs in
through that URL, starts a run from the page and answers, on the page, all the demo asks
(a login link, a question, an approval), then sees the run's final answer appear. Another
starts the example with one click, declines the deposit, and sees the run *declined*, with
its steps, also after a reload and on a restarted server. The
last plays the hostile pages: a page of another site that frames the inbox (the frame
stays blocked), a DNS-rebinding name (403), and a link from another site to the token URL
(the SameSite=Strict cookie is held back on that visit; the login page's own link opens
the inbox). Another plays a page on another port of 127.0.0.1 that receives the session
cookie and makes the browser POST an answer with it (403, by its Origin). The framing site
is a second server on 127.0.0.1; a route that Playwright fulfils stands in for the
linking one, and Chromium maps the rebinding name to 127.0.0.1 itself: nothing leaves
this machine. Three more run the real ``bash`` and ``apply_patch`` behind the inbox
(tests/serve_acting.py) and check that a request shows what would run: a bidi command as
visible escapes with a warning, a newline command as two lines, a long patch as a diff
with every line reachable.

Needs ``/usr/bin/chromium`` (Debian's ``chromium`` package) and ``pip install playwright``;
never ``playwright install``: no browser is downloaded. Without them the test is skipped,
or fails when the ``CI`` environment variable is set (CI installs both).
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from toolnexus_async.serve._demo import LOGIN_URL

CHROMIUM = "/usr/bin/chromium"
# A fresh headless profile that talks to nothing but the test server.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # The attacker's name for a DNS-rebinding page, resolved without any DNS.
    "--host-resolver-rules=MAP rebind.test 127.0.0.1",
]
SCREENSHOT = Path("/tmp/serve_page.png")


def _missing_tools() -> str | None:
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is missing (pip install playwright; never `playwright install`)"
    return None


MISSING = _missing_tools()
if MISSING is not None and not os.environ.get("CI"):
    pytest.skip(f"the browser test needs its tools: {MISSING}", allow_module_level=True)


class ServeProcess:
    """``toolnexus-async serve`` on a free port of 127.0.0.1, in a child process.

    ``url`` is the address it prints, token included; ``base`` is the same without the
    token. Leaving the block stops it with SIGINT (Ctrl-C), which must end it cleanly.
    """

    def __init__(self, store_path: Path, command: list[str] | None = None) -> None:
        serve = [sys.executable, "-m", "toolnexus_async", "serve", "--port", "0"]
        # Another program that prints the same line may stand in (tests/serve_acting.py).
        self._command = command or [*serve, "--store", str(store_path)]
        env = {k: v for k, v in os.environ.items() if k != "TOOLNEXUS_TOKEN"}
        self._env = env
        self.url = self.base = ""

    def __enter__(self) -> ServeProcess:
        self.process = subprocess.Popen(self._command, stdout=subprocess.PIPE, env=self._env)
        assert self.process.stdout is not None
        out, deadline = b"", time.monotonic() + 30
        while b"\n" not in out.partition(b"Open the inbox: ")[2]:  # the whole URL line
            left = deadline - time.monotonic()
            # Raw reads of the pipe: a buffered reader could hold a line select cannot see.
            if not select.select([self.process.stdout], [], [], max(left, 0))[0]:
                self.process.kill()
                self.process.wait()
                raise RuntimeError(f"toolnexus-async serve printed no URL in 30 s: {out!r}")
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"toolnexus-async serve ended: {self.process.wait()}")
            out += chunk
        line = out.split(b"Open the inbox: ", 1)[1].split(b"\n", 1)[0]
        self.url = line.decode().strip()
        self.base = self.url.split("/?", 1)[0]
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            assert self.process.stdout is not None
            self.process.stdout.close()
        assert code == 0, f"toolnexus-async serve exited with {code}"

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])


# A page of another site that tries to answer the request its address names, with the
# browser's cookies: as JSON (the browser asks first, and is refused), and as a "simple"
# request, which the browser sends without asking. It tells what it saw in its title.
ANSWER_PAGE = """<script>
const [target, id] = decodeURIComponent(location.hash.slice(1)).split(" ");
const url = `${target}/requests/${id}/answer`;
const body = JSON.stringify({ ok: true });
const json = fetch(url, {
  method: "POST", credentials: "include", body,
  headers: { "Content-Type": "application/json" },
}).then((r) => `json ${r.status}`, () => "json blocked");
const simple = fetch(url, { method: "POST", credentials: "include", mode: "no-cors", body })
  .then(() => "simple sent", () => "simple blocked");
Promise.all([json, simple]).then((seen) => { document.title = seen.join(", "); });
</script>"""


class OtherSite:
    """Another web site on 127.0.0.1 (a plain ``http.server`` in a thread): ``/decoy`` frames
    ``target`` nearly transparent over a button, beside ``/plain``, a page that may be
    framed, so that a test can tell a blocked frame from one that loads; ``/answer`` is
    :data:`ANSWER_PAGE`."""

    def __init__(self, target: str) -> None:
        decoy = (
            '<button id="decoy">Win a prize</button>'
            f'<iframe id="inbox" src="{target}/" style="opacity:0.01"></iframe>'
            '<iframe id="plain" src="/plain"></iframe>'
        )
        pages = {
            "/decoy": decoy,
            "/plain": "<p id='shown'>a frame that loads</p>",
            "/answer": ANSWER_PAGE,
        }
        self.cookies: list[str] = []  # the Cookie headers the browser sent here
        cookies = self.cookies

        class Pages(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                cookies.extend(self.headers.get_all("Cookie", []))
                body = pages.get(self.path, "").encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def launch(pw: Any) -> Any:
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def test_a_run_is_started_answered_and_finished_on_the_page(tmp_path: Path) -> None:
    """Start a run on the page; log in, pick from the question form and approve the deposit
    there; the run's final answer (the server's own text) appears, the inbox empties."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import ConsoleMessage, expect, sync_playwright

    prompt = "Book a table for <b>tonight</b>"  # markup in data must show as plain text
    with ServeProcess(tmp_path / "runs.sqlite") as server, sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 900})
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))

            def note_console_error(message: ConsoleMessage) -> None:
                if message.type == "error":
                    problems.append(f"console: {message.text}")

            page.on("console", note_console_error)
            # Log in through the printed URL: the token leaves the address bar at once.
            page.goto(server.url)
            expect(page).to_have_url(f"{server.base}/")
            expect(page.locator("#connection")).to_have_text("Live")

            page.get_by_label("What should the agent do?").fill(prompt)
            page.get_by_role("button", name="Start run").click()
            run = page.locator("#runs > li").first
            expect(run.locator(".prompt")).to_have_text(prompt)

            # 1. The login link opens in a new tab that cannot reach back to this page.
            login = page.locator('#requests > li[data-kind="authorization"]')
            expect(run.locator(".status")).to_have_text("waiting for an answer")
            link = login.get_by_role("link", name="Open the login page")
            expect(link).to_have_attribute("href", LOGIN_URL)
            expect(link).to_have_attribute("target", "_blank")
            expect(link).to_have_attribute("rel", "noopener noreferrer")
            login.get_by_role("button", name="Done, I logged in").click()
            expect(login).to_have_count(0)

            # 2. The question form: one radio group per question.
            question = page.locator('#requests > li[data-kind="question"]')
            question.get_by_role("radio", name="Sakura", exact=True).check()
            question.get_by_role("radio", name="4", exact=True).check()
            question.get_by_role("button", name="Send answers").click()
            expect(question).to_have_count(0)

            # 3. The approval carries the choices made above.
            approval = page.locator('#requests > li[data-kind="approval"]')
            expect(approval.locator(".prompt")).to_contain_text("40 EUR deposit to Sakura for 4")
            approval.get_by_role("button", name="Approve").click()
            expect(approval).to_have_count(0)

            expect(run.locator(".status")).to_have_text("done")
            result = run.locator(".result")
            expect(result).to_contain_text("You chose Sakura for 4 at 19:30")
            expect(result).to_contain_text("deposit of 40 EUR paid")
            runs = json.loads(page.request.get(f"{server.base}/runs").text())["runs"]
            assert runs[0]["status"] == "done"
            expect(result).to_have_text(runs[0]["text"])
            expect(page.locator("#requests-empty")).to_be_visible()
            expect(page.locator("#runs b")).to_have_count(0)  # the prompt was not parsed

            page.screenshot(path=str(SCREENSHOT), full_page=True)
            assert problems == []

            # Log out: the session ends and the cookie goes; the page says how to log in
            # again instead of failing quietly.
            page.get_by_role("button", name="Log out").click()
            expect(page.locator("#connection")).to_contain_text("Not logged in")
            assert page.context.cookies() == []
            page.get_by_label("What should the agent do?").fill("one more")
            page.get_by_role("button", name="Start run").click()
            expect(page.locator("#start-form .error")).to_contain_text("HTTP 401")
            expect(page.locator("#connection")).to_contain_text("Not logged in")
            expect(page.locator("#connection")).to_contain_text("?token=")
        finally:
            browser.close()


def test_other_sites_can_neither_frame_the_page_nor_rebind_nor_log_in_for_you(
    tmp_path: Path,
) -> None:
    """A decoy page frames the logged-in inbox (the frame stays blocked; a frame of a page
    without the headers, beside it, shows, so the check can see a frame that loads); a
    rebinding name gets 403; a link from another site to the token URL lands on the login
    page, whose own link then opens the inbox."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    with ServeProcess(tmp_path / "runs.sqlite") as server, sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page()
            page.goto(server.url)
            expect(page.locator("#connection")).to_have_text("Live")

            # Another site on this machine (a real server on another port: the same *site*
            # for cookies, so the login cookie goes along) frames the inbox over a button.
            with OtherSite(server.base) as other:
                page.goto(f"{other}/decoy")  # "load": every frame has loaded, or failed to
                expect(page.frame_locator("#plain").locator("#shown")).to_have_count(1)
                expect(page.frame_locator("#inbox").locator("#start-form")).to_have_count(0)
                children = sorted(frame.url for frame in page.main_frame.child_frames)
                assert children == ["chrome-error://chromewebdata/", f"{other}/plain"]

            # DNS rebinding: a name of the attacker's that now resolves to 127.0.0.1.
            reply = page.goto(f"http://rebind.test:{server.port}/")
            assert reply is not None and reply.status == 403

            # A link on another site to the token URL: the browser logs in, but holds the
            # SameSite=Strict cookie back on that cross-site visit; the login page's link,
            # clicked on the inbox's own origin, then opens it.
            fresh = browser.new_context().new_page()
            fresh.route("http://elsewhere.test/", lambda route: route.fulfill(
                content_type="text/html", body=f'<a href="{server.url}">my inbox</a>'
            ))  # fmt: skip
            fresh.goto("http://elsewhere.test/")
            fresh.get_by_role("link", name="my inbox").click()
            expect(fresh).to_have_url(f"{server.base}/")
            expect(fresh.get_by_role("heading")).to_have_text("This inbox needs its token")
            fresh.get_by_role("link", name="open the inbox").click()
            expect(fresh.locator("#connection")).to_have_text("Live")
        finally:
            browser.close()


def test_a_page_on_another_local_port_cannot_answer_with_the_login_cookie(
    tmp_path: Path,
) -> None:
    """Logged in, the person visits a page on another port of 127.0.0.1: the same site, so
    the browser sends the inbox's cookie along with that page's requests. It POSTs an answer
    to the pending request with credentials; the server refuses (403, by its Origin) and
    the request stays pending. The cookie the browser holds is no token: as a Bearer token
    it is 401."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    with ServeProcess(tmp_path / "runs.sqlite") as server, sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page()
            page.goto(server.url)
            expect(page.locator("#connection")).to_have_text("Live")
            page.get_by_role("button", name="Start run").click()
            login = page.locator('#requests > li[data-kind="authorization"]')
            expect(login).to_have_count(1)
            pending = json.loads(page.request.get(f"{server.base}/requests").text())["requests"]
            request_id = pending[0]["id"]

            (cookie,) = page.context.cookies()
            assert cookie["name"] == f"toolnexus_session_{server.port}"
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            token = server.url.split("?token=", 1)[1]
            assert token not in cookie["value"]

            # What the server answered, read below the page: a refused reply never reaches it.
            cdp = page.context.new_cdp_session(page)
            cdp.send("Network.enable")
            sent: dict[str, tuple[str, str]] = {}
            statuses: dict[str, int] = {}
            cdp.on(
                "Network.requestWillBeSent",
                lambda e: sent.update(
                    {e["requestId"]: (e["request"]["method"], e["request"]["url"])}
                ),
            )
            cdp.on(
                "Network.responseReceivedExtraInfo",
                lambda e: statuses.update({e["requestId"]: e["statusCode"]}),
            )
            other_site = OtherSite(server.base)
            answer_url = f"{server.base}/requests/{request_id}/answer"
            with (
                other_site as other,
                page.expect_event(  # the simple POST's reply came, and was kept from the page
                    "requestfailed", lambda r: r.method == "POST" and r.url == answer_url
                ),
            ):
                page.goto(f"{other}/answer#{server.base} {request_id}")
                # Neither reply reaches the page: the JSON one is refused when the browser
                # asks first, and CORP blocks the simple one's reply.
                expect(page).to_have_title("json blocked, simple blocked")
            # The other site did receive the inbox's cookie (cookies ignore ports) ...
            assert f"{cookie['name']}={cookie['value']}" in " ".join(other_site.cookies)
            # ... and its page made the browser send it, which the Origin check refused.
            answered = [
                (sent[i][0], status)
                for i, status in statuses.items()
                if sent.get(i, ("", ""))[1] == answer_url
            ]
            assert ("POST", 403) in answered and all(status != 200 for _, status in answered)

            # A server that received the cookie sends its value as a token: not one (401).
            stranger = pw.request.new_context()  # no cookies: only what it sends
            answer = stranger.post(
                f"{server.base}/requests/{request_id}/answer",
                data={"ok": True},
                headers={"Authorization": f"Bearer {cookie['value']}"},
            )
            assert answer.status == 401
            stranger.dispose()
            pending = json.loads(page.request.get(f"{server.base}/requests").text())["requests"]
            assert [r["id"] for r in pending] == [request_id]
        finally:
            browser.close()


def test_reload_restart_and_a_declined_run_keep_telling_the_truth(tmp_path: Path) -> None:
    """The first click starts the example; the approval says which run asks and shows its
    data in words; a declined deposit is *declined*, not *done*, in words for people; a
    reload and a restarted server still show the run's steps. With ``SERVE_SCREENSHOTS``
    set to a folder, the main states are saved there (docs/serve.md shows them)."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    shots = os.environ.get("SERVE_SCREENSHOTS")

    def shoot(page: Any, name: str) -> None:
        if shots:
            page.screenshot(path=str(Path(shots) / f"serve-{name}.png"), full_page=True)

    store = tmp_path / "runs.sqlite"
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 900})
            with ServeProcess(store) as server:
                page.goto(server.url)
                expect(page.locator("#connection")).to_have_text("Live")
                box = page.get_by_label("What should the agent do?")
                example = box.get_attribute("placeholder")
                assert example and "Luigi's" in example
                page.get_by_role("button", name="Start run").click()  # the box left empty
                run = page.locator("#runs > li").first
                expect(run.locator(".prompt")).to_have_text(example)

                login = page.locator('#requests > li[data-kind="authorization"]')
                expect(login.locator(".meta")).to_contain_text(f"for “{example}”")
                login.get_by_role("button", name="Done, I logged in").click()
                # The prompt named Luigi's: only the party size is asked, and once.
                question = page.locator('#requests > li[data-kind="question"]')
                expect(question.get_by_text("For how many people?")).to_have_count(1)
                expect(question.get_by_text("Which restaurant?")).to_have_count(0)
                shoot(page, "question")
                question.get_by_role("radio", name="4", exact=True).check()
                question.get_by_role("button", name="Send answers").click()

                approval = page.locator('#requests > li[data-kind="approval"]')
                details = approval.locator(".details")
                expect(details.locator("dt")).to_have_text(["Amount (EUR)", "To", "Party size"])
                expect(details.locator("dd")).to_have_text(["40", "Luigi's", "4"])
                expect(approval.locator(".meta")).to_contain_text(f"for “{example}”")
                shoot(page, "approval")
                approval.get_by_role("button", name="Decline").click()

                def declined_run() -> None:
                    expect(run.locator(".status")).to_have_text("declined")
                    expect(run).to_have_attribute("data-status", "declined")
                    steps = run.locator(".steps > li")
                    expect(steps.locator(".tool")).to_have_text(
                        ["check_login", "question", "book_table"]
                    )
                    expect(steps.nth(2)).to_have_attribute("data-declined", "true")
                    expect(steps.nth(2).locator(".output")).to_have_text(" → declined")
                    expect(run.locator(".result")).to_contain_text("you declined the deposit")
                    expect(run).not_to_contain_text("declined/expired")

                declined_run()
                shoot(page, "declined")
                page.reload()  # the steps come back from GET /runs/{id}
                expect(page.locator("#connection")).to_have_text("Live")
                declined_run()
            with ServeProcess(store) as server:  # a new server (and token) on the same store
                page.goto(server.url)
                expect(page.locator("#connection")).to_have_text("Live")
                declined_run()
        finally:
            browser.close()


# A command a model led by a prompt injection may send: with its bidi controls drawn as
# the browser draws them, it reads "echo 'done # mitciv/. fr- mr ;' ; echo x".
BIDI_COMMAND = "echo 'done \u202e; rm -rf ./victim #\u202c' ; \u2067echo x\u2069"
BIDI_SHOWN = "echo 'done ⟨U+202E⟩; rm -rf ./victim #⟨U+202C⟩' ; ⟨U+2067⟩echo x⟨U+2069⟩"


class ActingInbox:
    """The page of an inbox over the real ``bash`` and ``apply_patch`` (tests/serve_acting.py),
    in Chromium, logged in; ``workspace`` is where those tools act (if approved)."""

    def __init__(self, tmp_path: Path) -> None:
        from toolnexus_async.serve import new_token

        self.workspace = tmp_path / "ws"
        self.workspace.mkdir()
        store = tmp_path / "runs.sqlite"
        command = [sys.executable, "-m", "tests.serve_acting", str(store)]
        self._server = ServeProcess(store, [*command, str(self.workspace), new_token()])

    def __enter__(self) -> ActingInbox:
        from playwright.sync_api import expect, sync_playwright

        self._pw_context = sync_playwright()
        self.server = self._server.__enter__()
        try:
            self._browser = launch(self._pw_context.__enter__())
            self.page = self._browser.new_page(viewport={"width": 900, "height": 900})
            self.page.goto(self.server.url)
            expect(self.page.locator("#connection")).to_have_text("Live")
        except BaseException:
            self.__exit__()
            raise
        self.approval = self.page.locator('#requests > li[data-kind="approval"]')
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if hasattr(self, "_browser"):
                self._browser.close()
            self._pw_context.__exit__(None, None, None)
        finally:
            self._server.__exit__()

    def ask(self, tool: str, arguments: dict[str, str]) -> dict[str, Any]:
        """Start a run that calls ``tool``; its one request, as GET /requests has it."""
        from playwright.sync_api import expect

        self.page.get_by_label("What should the agent do?").fill(
            json.dumps({"tool": tool, "arguments": arguments})
        )
        self.page.get_by_role("button", name="Start run").click()
        expect(self.approval).to_have_count(1)
        (request,) = json.loads(self.page.request.get(f"{self.server.base}/requests").text())[
            "requests"
        ]
        # The API carries the arguments exactly as the model sent them.
        assert request["data"]["arguments"] == arguments
        return dict(request)

    def row(self, label: str) -> Any:
        """The value of the approval's data row labelled ``label``."""
        return self.approval.locator(f'dt:text-is("{label}") + dd')

    def decline(self) -> None:
        from playwright.sync_api import expect

        self.approval.get_by_role("button", name="Decline").click()
        expect(self.approval).to_have_count(0)


def test_bidi_controls_show_as_escapes_with_a_warning(tmp_path: Path) -> None:
    """The bidi command shows its controls as visible ⟨U+…⟩ escapes in the prompt, the
    arguments and the command, and the card says how many there are."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect

    with ActingInbox(tmp_path) as inbox:
        inbox.ask("bash", {"command": BIDI_COMMAND})
        approval = inbox.approval
        expect(approval.locator(".warning")).to_have_text(
            "⚠ This request contains 12 invisible or direction-changing characters, shown as ⟨U+…⟩."
        )
        command = inbox.row("Command")
        expect(command).to_have_text(BIDI_SHOWN)
        assert "\u202e" not in (command.text_content() or "")
        expect(approval.locator(".prompt")).to_contain_text(BIDI_SHOWN)
        expect(inbox.row("Arguments")).to_contain_text(BIDI_SHOWN)
        escapes = approval.locator(".escape")
        expect(escapes).to_have_count(12)
        expect(escapes.first).to_be_visible()
        expect(escapes.first).to_have_attribute("title", "RIGHT-TO-LEFT OVERRIDE")
        inbox.decline()


def test_approving_on_the_page_names_the_digest_of_what_it_showed(tmp_path: Path) -> None:
    """The page's approval echoes the request's digest, so it approves exactly the call on
    the card; the server takes it and the command runs."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect

    with ActingInbox(tmp_path) as inbox:
        request = inbox.ask("bash", {"command": "echo approved"})
        with inbox.page.expect_request(lambda r: r.url.endswith("/answer")) as sent:
            inbox.approval.get_by_role("button", name="Approve").click()
        assert sent.value.post_data_json == {
            "ok": True,
            "data": {"digest": request["data"]["digest"]},
        }
        expect(inbox.approval).to_have_count(0)
        # The run's history says who answered (the page's session, by its handle) and
        # when; its audit trail has the digest the card showed.
        run = inbox.page.locator("#runs > li").first
        run.get_by_role("button", name="Details").click()
        answer = inbox.page.locator("#run-detail .answer")
        expect(answer).to_contain_text(re.compile(r"answered by session:[0-9a-f]{12} at "))
        detail = json.loads(
            inbox.page.request.get(f"{inbox.server.base}/runs/{request['run_id']}").text()
        )
        (record,) = detail["answers"]
        assert record["digest"] == request["data"]["digest"]
        assert record["answered_by"] in answer.inner_text()


def test_a_newline_in_a_command_shows_as_two_lines(tmp_path: Path) -> None:
    """``echo ok\\nrm -rf ./victim`` is two lines, one under the other, never the harmless
    looking ``echo ok rm -rf ./victim``."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect

    with ActingInbox(tmp_path) as inbox:
        inbox.ask("bash", {"command": "echo ok\nrm -rf ./victim"})
        expect(inbox.approval.locator(".warning")).to_have_count(0)
        lines = inbox.row("Command").locator(".line")
        expect(lines).to_have_text(["echo ok", "rm -rf ./victim"])
        first, second = lines.nth(0).bounding_box(), lines.nth(1).bounding_box()
        assert first is not None and second is not None
        assert second["y"] >= first["y"] + first["height"]
        inbox.decline()


def test_a_long_patch_shows_as_a_diff_and_all_of_it_is_reachable(tmp_path: Path) -> None:
    """A patch whose diff is past the prompt's 4,000-character cut: the diff row has one
    element per line, marked added or removed by class and gutter, cut at 200 lines with a
    button that shows the rest; then every line of data["diff"] is on the page."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect

    with ActingInbox(tmp_path) as inbox:
        notes = inbox.workspace / "notes.txt"
        notes.write_text("".join(f"old line {i} of the notes\n" for i in range(150)))
        edits = [f"-old line {i} of the notes" for i in range(150)]
        edits += [f"+new line {i} of the notes" for i in range(150)]
        patch = "\n".join(["*** Begin Patch", "*** Update File: notes.txt", "@@", *edits])
        request = inbox.ask("apply_patch", {"patchText": f"{patch}\n*** End Patch\n"})
        diff = request["data"]["diff"]
        assert len(diff) > 4000  # past the prompt's cut: the diff row is the full view
        approval = inbox.approval
        expect(approval.locator(".prompt")).to_contain_text("the diff goes on")
        rows = approval.locator(".diff-line")
        expect(rows).to_have_count(200)
        expect(rows.nth(3)).to_have_attribute("data-mark", "del")
        expect(rows.nth(3)).to_have_class("diff-line del")
        expect(rows.nth(3).locator(".gutter")).to_have_text("-")
        expect(rows.nth(3).locator(".code")).to_have_text("old line 0 of the notes")
        show_all = approval.get_by_role("button", name="Show all 303 lines (103 more)")
        show_all.click()
        expect(rows).to_have_count(303)
        expect(show_all).to_have_count(0)
        expect(approval.locator(".diff-line.add")).to_have_count(150)
        expect(approval.locator(".diff-line.del")).to_have_count(150)
        expect(rows.last.locator(".gutter")).to_have_text("+")
        assert rows.all_text_contents() == diff.rstrip("\n").split("\n")
        inbox.decline()
        assert notes.read_text().startswith("old line 0")
