"""The serve page in a real browser: Debian's Chromium, driven by Playwright.

The embedded demo server runs on 127.0.0.1 (port 0) on its own event loop in a thread, so
Playwright's sync API can drive the page from the test's thread. The test starts a run from
the page and answers, on the page, all the demo asks (a login link, a question, an
approval), then sees the run's final answer appear.

Needs ``/usr/bin/chromium`` (Debian's ``chromium`` package) and ``pip install playwright``;
never ``playwright install``: no browser is downloaded. Without them the test is skipped,
or fails when the ``CI`` environment variable is set (CI installs both).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import threading
from pathlib import Path

import pytest
from aiohttp import web

from toolnexus_async.serve import serve_demo_app
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


class DemoServer:
    """The demo app on 127.0.0.1, served by its own event loop in a background thread."""

    def __init__(self, store_path: Path) -> None:
        self.store_path = store_path
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="serve-demo", daemon=True)

    def __enter__(self) -> DemoServer:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the demo server did not start within 15 s")
        if self._error is not None:
            raise RuntimeError("the demo server failed to start") from self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the demo server did not stop within 30 s"
        if self._error is not None:
            raise RuntimeError("the demo server failed") from self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        # Startup and cleanup in one task: the app's lifespan holds an anyio task group.
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        runner = web.AppRunner(serve_demo_app(self.store_path))
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()


def test_a_run_is_started_answered_and_finished_on_the_page(tmp_path: Path) -> None:
    """Start a run on the page; log in, pick from the question form and approve the deposit
    there; the run's final answer (the server's own text) appears, the inbox empties."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import ConsoleMessage, expect, sync_playwright

    prompt = "Book a table for <b>tonight</b>"  # markup in data must show as plain text
    with DemoServer(tmp_path / "runs.sqlite") as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 900})
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))

            def note_console_error(message: ConsoleMessage) -> None:
                if message.type == "error":
                    problems.append(f"console: {message.text}")

            page.on("console", note_console_error)
            page.goto(server.url)
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
            runs = json.loads(page.request.get(f"{server.url}/runs").text())["runs"]
            assert runs[0]["status"] == "done"
            expect(result).to_have_text(runs[0]["text"])
            expect(page.locator("#requests-empty")).to_be_visible()
            expect(page.locator("#runs b")).to_have_count(0)  # the prompt was not parsed

            page.screenshot(path=str(SCREENSHOT), full_page=True)
            assert problems == []
        finally:
            browser.close()
