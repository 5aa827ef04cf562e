"""Two workers' pages show the same run the same way, without a reload (issue 34).

Two ``serve`` workers (child processes, :mod:`tests.serve_worker`) on one real PostgreSQL
database (tests/pg.py), and Debian's Chromium driven by Playwright (as in
tests/test_serve_browser.py) with a tab open on each, each logged in through its worker's
``/?token=`` address. A run started through worker A's API parks on an approval: both
pages show the request and the run waiting, with its prompt. A person approves it on B's
page; both pages then show the run done, its step's output, no request left and the same
counts, and A's detail view of the run says the answer came through worker B. A run
started on B after both pages opened shows on A as well. Neither page is ever reloaded
(each loads once).

Nothing sleeps to synchronise: the test waits on the pages' state with Playwright's
``expect`` (:data:`SHOWN` is a guard against a hang, not a pace).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.test_serve_browser import CHROMIUM, CHROMIUM_ARGS, MISSING
from tests.test_serve_crash import TOKEN, Server
from tests.test_serve_one_inbox import two_workers

LIMIT = 120  # seconds for the whole test: two workers, a browser, two pages
SHOWN = 20_000  # milliseconds a page may take to show what happened elsewhere


async def open_page(context: Any, worker: Server) -> tuple[Any, list[str]]:
    """A tab logged in to ``worker`` as a person would (its printed address with the
    token), once its event stream is live; and the problems it will report (page errors,
    and any load after the first: the test never reloads)."""
    from playwright.async_api import expect

    async with worker.session.get("/runs?limit=1") as reply:
        base = str(reply.url.origin())
    page = await context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"{worker.name}: page error: {exc}"))

    def loaded(frame: Any) -> None:
        if frame == page.main_frame:
            problems.append(f"{worker.name}: loaded again: {frame.url}")

    await page.goto(f"{base}/?token={TOKEN}")  # 303 to "/": one load, with the cookie
    page.on("framenavigated", loaded)  # from here on, any load is a reload
    await expect(page.locator("#connection")).to_have_text("Live", timeout=SHOWN)
    return page, problems


async def shows_waiting(page: Any, run_id: str, prompt: str, asked: str) -> None:
    """``page`` shows ``run_id`` waiting, with its prompt, and its request."""
    from playwright.async_api import expect

    card = page.locator(f'#requests > li[data-run="{run_id}"]')
    await expect(card).to_have_count(1, timeout=SHOWN)
    await expect(card).to_contain_text(asked, timeout=SHOWN)
    run = page.locator(f'#runs > li[data-run="{run_id}"]')
    await expect(run).to_have_attribute("data-status", "pending", timeout=SHOWN)
    await expect(run.locator(".status")).to_have_text("waiting for an answer", timeout=SHOWN)
    await expect(run.locator(".run-head .prompt")).to_have_text(prompt, timeout=SHOWN)


def count(page: Any, section: str, label: str) -> Any:
    """The count on the chip ``label`` of ``section`` ("requests" or "runs")."""
    chip = page.locator(f"#{section}-chips .chip", has=page.locator(".chip-label", has_text=label))
    return chip.locator(".count")


async def test_one_run_on_two_workers_pages_shows_the_same_truth_without_a_reload(
    pg_dsn: str, tmp_path: Path
) -> None:
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.async_api import async_playwright, expect

    with anyio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            a, b = await two_workers(stack, pg_dsn, tmp_path)
            pw = await stack.enter_async_context(async_playwright())
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            stack.push_async_callback(browser.close)
            # One person, two tabs: the login cookie's name carries the port, so each tab
            # keeps its own worker's session.
            context = await browser.new_context(viewport={"width": 1000, "height": 900})
            page_a, problems_a = await open_page(context, a)
            page_b, problems_b = await open_page(context, b)

            # Started through A's API; it parks on its approval.
            run_id = await a.start_run("pay 5")
            for page in (page_a, page_b):
                await shows_waiting(page, run_id, "pay 5", "Pay 5 EUR?")

            # Approved on B's page, with a click.
            card_b = page_b.locator(f'#requests > li[data-run="{run_id}"]')
            async with page_b.expect_response(
                lambda r: r.url.endswith("/answer") and r.request.method == "POST"
            ) as sent:
                await card_b.get_by_role("button", name="Approve").click()
            assert (await sent.value).status == 200

            # Both pages: the run done with its step and text, no request left.
            for page in (page_a, page_b):
                run = page.locator(f'#runs > li[data-run="{run_id}"]')
                await expect(run).to_have_attribute("data-status", "done", timeout=SHOWN)
                await expect(run.locator(".status")).to_have_text("done", timeout=SHOWN)
                await expect(run.locator(".result")).to_have_text("pay=paid 5", timeout=SHOWN)
                step = run.locator(".steps > li")
                await expect(step.locator(".tool")).to_have_text(["pay"], timeout=SHOWN)
                await expect(step.locator(".output")).to_have_text("→ paid 5", timeout=SHOWN)
                await expect(page.locator("#requests > li")).to_have_count(0, timeout=SHOWN)
                await expect(page.locator("#requests-empty")).to_be_visible(timeout=SHOWN)
                await expect(count(page, "runs", "done")).to_have_text("1", timeout=SHOWN)
                await expect(count(page, "requests", "All")).to_have_text("0", timeout=SHOWN)

            # A's detail view: the answer, and that it came through worker B.
            [step_b] = (await b.run(run_id))["steps"]
            through = step_b["answer"]["worker"]
            assert f":{b.process.pid}:" in through, step_b
            await (
                page_a.locator(f'#runs > li[data-run="{run_id}"]')
                .get_by_role("button", name="Details")
                .click()
            )
            detail = page_a.locator("#run-detail")
            await expect(detail).to_be_visible(timeout=SHOWN)
            await expect(detail.locator(".run-head .status")).to_have_text("done", timeout=SHOWN)
            answer = detail.locator(".history .answer")
            await expect(answer).to_contain_text("Answered: yes", timeout=SHOWN)
            await expect(answer).to_contain_text(f"through {through}", timeout=SHOWN)
            await expect(detail.locator(".history .output")).to_have_text("paid 5", timeout=SHOWN)
            await page_a.keyboard.press("Escape")
            await expect(detail).to_be_hidden(timeout=SHOWN)

            # A run started on B after both pages opened: A's page shows it too.
            later = await b.start_run("pay 6")
            for page in (page_a, page_b):
                await shows_waiting(page, later, "pay 6", "Pay 6 EUR?")
                await expect(count(page, "requests", "Approvals")).to_have_text("1", timeout=SHOWN)
                await expect(count(page, "runs", "waiting")).to_have_text("1", timeout=SHOWN)

            assert problems_a == [] and problems_b == []
