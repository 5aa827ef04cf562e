"""The inbox page for an operator with many requests waiting, in Debian's Chromium.

The server is ``tests/serve_page.py`` in a child process (the real ``create_app`` and
``run_server`` on a SQLite store, a scripted model): a run's prompt names the one tool it
calls, so a test asks for exactly the requests it needs, started over the HTTP API as an
API client would. The page is driven as ``tests/test_serve_browser.py`` drives it
(its ``ServeProcess`` and ``launch``): counts, filters, search and paging of the lists; a
question's answers shown as fields in the run's steps and its detail view; a page left
open across a restart (a new token) saying it is logged out; the display rules on
question options, form labels, a run's prompt and its step outputs; the editor of an
approval's arguments sending what was typed. Timings of 1,000 waiting requests are the
page benchmark's (benchmarks/serve_page.py), not a test's.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.test_serve_browser import MISSING, ServeProcess, launch

BIDI = "\u202e"
BIDI_SHOWN = "⟨U+202E⟩"


def page_server(store: Path, token: str, port: int = 0) -> ServeProcess:
    command = [sys.executable, "-m", "tests.serve_page", str(store), token, str(port)]
    return ServeProcess(store, command)


class Api:
    """The inbox's HTTP API as a client with the token sees it."""

    def __init__(self, base: str, token: str) -> None:
        self.base, self.token = base, token

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read() or b"null")

    def start(self, tool: str, arguments: dict[str, Any]) -> str:
        prompt = json.dumps({"tool": tool, "arguments": arguments}, ensure_ascii=False)
        run_id: str = self.call("POST", "/runs", {"prompt": prompt})["id"]
        return run_id

    def start_many(self, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(lambda call: self.start(*call), calls))


@contextmanager
def inbox(tmp_path: Path, port: int = 0) -> Iterator[tuple[Any, Api, ServeProcess]]:
    """The page logged in to a fresh serve_page server: (page, api, server)."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    from toolnexus_async.serve import new_token

    token = new_token()
    with page_server(tmp_path / "runs.sqlite", token, port) as server, sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.goto(server.url)
            expect(page.locator("#connection")).to_have_text("Live")
            yield page, Api(server.base, token), server
            assert problems == []
        finally:
            browser.close()


def chip(page: Any, section: str, label: str) -> Any:
    return page.locator(f"#{section}-chips .chip", has=page.locator(".chip-label", has_text=label))


def test_counts_filters_search_and_paging(tmp_path: Path) -> None:
    """135 requests wait: the counts per kind, a first page of 100 and "Show more" for the
    rest (each request once); a kind filter and a search ask the server and show only what
    matches; an answer given elsewhere leaves the page and the counts; the keyboard moves
    between cards and selects; a selection is declined at once, after a confirmation."""
    from playwright.sync_api import expect

    with inbox(tmp_path) as (page, api, _):
        calls: list[tuple[str, dict[str, Any]]] = [
            ("pay", {"invoice": i, "to": "ACME" if i % 2 else "Globex"}) for i in range(130)
        ]
        questions = [{"question": "Which room?", "options": ["Red", "Blue"]}]
        calls += [("question", {"questions": questions})] * 3
        calls += [
            ("form", {"schema": {"type": "object", "properties": {"name": {"type": "string"}}}})
        ] * 2
        api.start_many(calls)
        expect(chip(page, "requests", "All").locator(".count")).to_have_text("135", timeout=20_000)
        page.reload()  # a fresh page: the first page of the listing, and the counts
        cards = page.locator("#requests > li")
        expect(cards).to_have_count(100)
        expect(chip(page, "requests", "Approvals").locator(".count")).to_have_text("130")
        expect(chip(page, "requests", "Questions").locator(".count")).to_have_text("3")
        expect(chip(page, "requests", "Forms").locator(".count")).to_have_text("2")
        expect(page.locator("#requests-summary")).to_have_text("Showing 100 of 135")
        more = page.get_by_role("button", name="Show more requests (35 more)")
        # Pressed, not clicked: the cards use content-visibility, so those scrolled into
        # view with the button are laid out only then and can move it from under a pointer
        # aimed a frame before (a click that fell beside it, 4 runs in 17 under load).
        with page.expect_request(lambda r: "/requests?" in r.url and "cursor=" in r.url):
            more.press("Enter")
        expect(cards).to_have_count(135)
        expect(page.locator("#requests-more")).to_be_hidden()  # by id: its name changed
        ids = [cards.nth(i).get_attribute("data-request") for i in range(135)]
        assert len(set(ids)) == 135
        listed = api.call("GET", "/requests?limit=500")["requests"]
        assert ids == [r["id"] for r in listed]  # the server's order, oldest first

        # A kind: asked of the server, and only that kind shows.
        with page.expect_request(lambda r: "/requests?" in r.url and "kind=question" in r.url):
            chip(page, "requests", "Questions").click()
        expect(cards).to_have_count(3)
        expect(page.locator('#requests > li:not([data-kind="question"])')).to_have_count(0)
        expect(chip(page, "requests", "Questions")).to_have_attribute("aria-pressed", "true")
        chip(page, "requests", "All").click()
        expect(cards).to_have_count(100)

        # A search, case-insensitive, of what is asked.
        with page.expect_request(lambda r: "/requests?" in r.url and "q=INVOICE+17" in r.url):
            page.get_by_placeholder("Search what is asked").fill("INVOICE 17")
        expect(cards).to_have_count(1)
        expect(cards.first.locator(".prompt")).to_have_text("Pay invoice 17 to ACME?")
        page.get_by_placeholder("Search what is asked").fill("")
        expect(cards).to_have_count(100)

        # Answered through the API: the card leaves this page, and the count drops.
        first = listed[0]
        api.call(
            "POST",
            f"/requests/{first['id']}/answer",
            {"ok": True, "data": {"digest": first["data"]["digest"]}},
        )
        expect(page.locator(f'#requests > li[data-request="{first["id"]}"]')).to_have_count(0)
        expect(chip(page, "requests", "Approvals").locator(".count")).to_have_text("129")

        # The keyboard: j to the first card, j to the next, x selects it.
        page.locator("h1").click()
        page.keyboard.press("j")
        expect(cards.nth(0)).to_be_focused()
        page.keyboard.press("j")
        expect(cards.nth(1)).to_be_focused()
        page.keyboard.press("x")
        expect(cards.nth(1).locator(".select")).to_be_checked()
        page.keyboard.press("x")
        expect(cards.nth(1).locator(".select")).not_to_be_checked()

        # Several at once: the questions, declined together after a confirmation.
        chip(page, "requests", "Questions").click()
        expect(cards).to_have_count(3)
        page.get_by_role("button", name="Select all shown").click()
        page.get_by_role("button", name="Decline selected (3)").click()
        expect(page.locator("#bulk-question")).to_contain_text("Decline 3 requests?")
        page.get_by_role("button", name="Yes, decline them").click()
        expect(page.locator("#bulk-status")).to_have_text("Declined 3.")
        expect(cards).to_have_count(0)
        expect(chip(page, "requests", "All").locator(".count")).to_have_text("131")
        # No approve-all: approvals are given one by one, each on its card.
        expect(page.get_by_role("button", name="Approve selected")).to_have_count(0)

        # The runs: counts per status, a status filter and a search of the prompts.
        expect(chip(page, "runs", "waiting").locator(".count")).to_have_text("131")
        with page.expect_request(lambda r: "/runs?" in r.url and "status=done" in r.url):
            chip(page, "runs", "done").click()
        runs = page.locator("#runs > li")
        expect(runs).to_have_count(4)  # the paid one and the three declined questions
        expect(page.locator('#runs > li[data-status="running"]')).to_have_count(0)
        chip(page, "runs", "All").click()
        page.get_by_placeholder("Search prompts").fill('"invoice": 42,')
        expect(runs).to_have_count(1)
        expect(runs.first.locator(".prompt")).to_contain_text('"invoice": 42')


def test_answers_show_as_fields(tmp_path: Path) -> None:
    """A question answered on the page: the run's step and its detail view show each
    answer beside its question, never the answer's JSON."""
    from playwright.sync_api import expect

    questions = [
        {"question": "Which restaurant?", "header": "Restaurant", "options": ["Luigi's", "Sakura"]},
        {"question": "For how many people?", "options": ["2", "4"]},
    ]
    with inbox(tmp_path) as (page, api, _):
        run_id = api.start("question", {"questions": questions})
        card = page.locator('#requests > li[data-kind="question"]')
        card.get_by_role("radio", name="Sakura", exact=True).check()
        card.get_by_role("radio", name="2", exact=True).check()
        card.get_by_role("button", name="Send answers").click()
        run = page.locator(f'#runs > li[data-run="{run_id}"]')
        expect(run.locator(".status")).to_have_text("done")
        step = run.locator(".steps > li").first
        expect(step.locator(".answer-label")).to_have_text(
            ["Restaurant: ", "For how many people?: "]
        )
        expect(step.locator(".answer-value")).to_have_text(["Sakura", "2"])
        expect(run.locator(".steps")).not_to_contain_text('{"answers"')

        run.get_by_role("button", name="Details").click()
        detail = page.locator("#run-detail")
        expect(detail).to_be_visible()
        fields = detail.locator(".history .answer-fields")
        expect(fields.locator("dt")).to_have_text(["Restaurant", "For how many people?"])
        expect(fields.locator("dd")).to_have_text(["Sakura", "2"])
        expect(detail.locator(".history")).not_to_contain_text('{"answers"')
        page.keyboard.press("Escape")
        expect(detail).to_be_hidden()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_a_page_left_open_across_a_restart_says_it_is_logged_out(tmp_path: Path) -> None:
    """The server stops and a new one starts on the same port and store with a new token:
    the page, never reloaded, learns it from its event stream (whose 401 EventSource hides,
    so the page asks an API call) and says how to log in again."""
    if MISSING is not None:
        pytest.fail(f"CI must install the browser test's tools: {MISSING}", pytrace=False)
    from playwright.sync_api import expect, sync_playwright

    from toolnexus_async.serve import new_token

    store, port = tmp_path / "runs.sqlite", free_port()
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page()
            with page_server(store, new_token(), port) as server:
                page.goto(server.url)
                expect(page.locator("#connection")).to_have_text("Live")
                banner = page.locator("#logged-out")
                expect(banner).to_be_hidden()
            with (
                page_server(store, new_token(), port),
                page.expect_response(
                    lambda r: r.url.endswith("/runs?limit=1") and r.status == 401, timeout=30_000
                ),
            ):
                pass
            expect(banner).to_be_visible()
            expect(banner).to_contain_text("Logged out")
            expect(banner).to_contain_text("?token=")
            expect(page.locator("#connection")).to_contain_text("Not logged in")
        finally:
            browser.close()


def test_display_rules_on_options_forms_prompts_and_outputs(tmp_path: Path) -> None:
    """A bidi override in a question's option and its description, in a form's label and
    hint, in a run's prompt and in a step's output and final text: each is shown as a
    visible escape with a warning line, never raw; an option's value sent is the option as
    it was; line breaks in an output stay separate lines."""
    from playwright.sync_api import expect

    with inbox(tmp_path) as (page, api, _):
        option = {"label": f"Sakura{BIDI}", "description": f"sushi {BIDI}bar"}
        api.start(
            "question",
            {"questions": [{"question": f"Where{BIDI}?", "options": [option, "Luigi's"]}]},
        )
        question = page.locator('#requests > li[data-kind="question"]')
        expect(question.locator("legend")).to_have_text(f"Where{BIDI_SHOWN}?")
        label = question.locator("label.option").first
        expect(label).to_have_text(f"Sakura{BIDI_SHOWN} sushi {BIDI_SHOWN}bar")
        assert BIDI not in (question.text_content() or "")
        expect(question.locator(".warning:not(.run-warning)")).to_have_text(
            "⚠ This request contains 3 invisible or direction-changing characters, shown as ⟨U+…⟩."
        )
        # The asking run's prompt (the tool call's JSON, with the same characters) too.
        expect(question.locator(".run-prompt .escape").first).to_have_text(BIDI_SHOWN)
        expect(question.locator(".run-warning")).to_contain_text("The asking run's prompt contains")
        with page.expect_request(lambda r: r.url.endswith("/answer")) as sent:
            label.locator("input").check()
            question.get_by_role("button", name="Send answers").click()
        assert sent.value.post_data_json == {"ok": True, "data": {"answers": [f"Sakura{BIDI}"]}}

        schema = {
            "type": "object",
            "properties": {
                "who": {
                    "type": "string",
                    "title": "Na\u200bme",
                    "description": f"as{BIDI} on the card",
                }
            },
            "required": ["who"],
        }
        api.start("form", {"schema": schema})
        form = page.locator('#requests > li[data-kind="input"]')
        expect(form.locator(".field label")).to_have_text("Na⟨U+200B⟩me *")
        expect(form.locator(".field .hint")).to_have_text(f"as{BIDI_SHOWN} on the card")
        expect(form.locator(".warning:not(.run-warning)")).to_contain_text("contains 2 invisible")
        assert BIDI not in (form.text_content() or "") and "\u200b" not in (
            form.text_content() or ""
        )
        form.get_by_role("button", name="Decline").click()

        run_id = api.start("echo", {"text": f"first line {BIDI}\nsecond line"})
        run = page.locator(f'#runs > li[data-run="{run_id}"]')
        expect(run.locator(".status")).to_have_text("done")
        expect(run.locator(".run-head .prompt")).to_contain_text(BIDI_SHOWN)  # the prompt
        output = run.locator(".steps > li .output")
        expect(output.locator(".line")).to_have_text([f"first line {BIDI_SHOWN}", "second line"])
        expect(run.locator(".result .line")).to_have_text(
            [f"echo: first line {BIDI_SHOWN}", "second line"]
        )
        expect(run.locator(".warning")).to_contain_text("This run's text contains")
        assert BIDI not in (run.text_content() or "")
        escape = output.locator(".escape").first
        expect(escape).to_be_visible()
        expect(escape).to_have_attribute("title", "RIGHT-TO-LEFT OVERRIDE")

        run.get_by_role("button", name="Details").click()
        detail = page.locator("#run-detail")
        expect(detail.locator(".history .output .line")).to_have_text(
            [f"first line {BIDI_SHOWN}", "second line"]
        )
        expect(detail.locator(".warning").first).to_contain_text("This run's history contains")
        assert BIDI not in (detail.text_content() or "")


def test_the_arguments_editor_sends_the_edited_arguments(tmp_path: Path) -> None:
    """An approval whose request says ``editable``: "Edit arguments" opens its arguments as
    JSON (a hidden character written as a \\u escape, the preview showing it by the display
    rules); "Approve with these arguments" names the request's digest and the edited
    arguments, and the tool runs with them. An approval that is not editable has no editor."""
    from playwright.sync_api import expect

    with inbox(tmp_path) as (page, api, _):
        api.start("pay", {"invoice": 7, "to": "ACME"})
        plain = page.locator('#requests > li[data-kind="approval"]')
        expect(plain).to_have_count(1)
        expect(plain.get_by_role("button", name="Edit arguments")).to_have_count(0)
        plain.get_by_role("button", name="Decline").click()

        run_id = api.start("act", {"command": f"echo hi {BIDI}"})
        card = page.locator('#requests > li[data-kind="approval"]')
        expect(card).to_have_count(1)
        (request,) = api.call("GET", "/requests")["requests"]
        assert request["data"]["editable"] is True
        card.get_by_role("button", name="Edit arguments").click()
        box = card.get_by_label("Arguments (JSON)")
        expect(box).to_be_focused()
        assert json.loads(box.input_value()) == {"command": f"echo hi {BIDI}"}
        assert "\\u202E" in box.input_value() and BIDI not in box.input_value()
        preview = card.locator(".preview")
        expect(preview.locator(".escape")).to_have_text([BIDI_SHOWN])
        expect(preview.locator(".warning")).to_contain_text("contains 1 invisible")

        box.fill('{"command": "echo changed"}')
        expect(preview).to_contain_text('"echo changed"')
        expect(preview.locator(".escape")).to_have_count(0)
        box.fill('{"command": ')
        expect(card.locator(".editor .error")).to_contain_text("Not JSON")
        expect(card.get_by_role("button", name="Approve with these arguments")).to_be_disabled()
        box.fill('{"command": "echo changed"}')
        with page.expect_request(lambda r: r.url.endswith("/answer")) as sent:
            card.get_by_role("button", name="Approve with these arguments").click()
        assert sent.value.post_data_json == {
            "ok": True,
            "data": {"digest": request["data"]["digest"], "arguments": {"command": "echo changed"}},
        }
        run = page.locator(f'#runs > li[data-run="{run_id}"]')
        expect(run.locator(".result")).to_have_text('act: act ran with {"command": "echo changed"}')
