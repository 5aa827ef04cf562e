"""The page's layout under hostile text, at a phone's width and a desktop's, in Chromium.

150 requests wait, their runs' prompts and the requests' text hostile in turn: bidi
controls, a 3,000-character word, HTML, a line of hundreds of words, dozens of lines; six
runs are answered (and answered again, refused), so their details carry the audit trail's
"answered by" lines. What was broken, looked at in screenshots, and is checked here by text
and geometry (never pixels):

- a run's card in the list showed its whole prompt and final text: a 3,000-character
  prompt made one card several screens tall. The list shows the first 280 characters and
  8 lines, cut with "…"; the detail view shows all of it;
- on a phone, a run's prompt sat beside its status badge in a sliver a few words wide;
  it now goes under the badge when there is no room beside it (on a desktop, beside);
- on a phone, the facts of a card and of a run's history (arguments, what was asked, the
  answer and who gave it) were a second column beside their labels, as narrow; each label
  now stands above its value, which gets the whole width.

And nothing is wider than the screen. The server is ``tests/serve_page.py``, driven as
``tests/test_serve_page.py`` drives it.
"""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path
from typing import Any

from tests.test_serve_page import Api, chip, inbox

BIDI = "done \u202e; rm -rf ./victim #\u202c \u2067x\u2069"
LONG = "A" * 3000
HTML = "<img src=x onerror=alert(1)><b>bold</b><script>alert(2)</script>"
WORDS = ("a very long line of words " * 60).strip()
LINES = "Supplier\nwith\nmany\nlines\n" * 5
HOSTILE = [BIDI, LONG, HTML, WORDS, LINES, None]
COUNT = 150
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


def prompt_of(i: int) -> str:
    """Run ``i``'s prompt: a pay call, indented (several lines), and for every sixth run
    (the plain supplier) thirty more lines after it."""
    to = HOSTILE[i % 6] or f"Supplier {i}"
    text = json.dumps({"tool": "pay", "arguments": {"invoice": i, "to": to}}, indent=1)
    return text + "\n " * 30 if HOSTILE[i % 6] is None else text


def answer_twice(api: Api, run_id: str) -> None:
    """Approve the run's request (taken), then answer it again (refused, kept in the trail)."""
    (request,) = api.call("GET", f"/requests?run={run_id}")["requests"]
    path = f"/requests/{request['id']}/answer"
    api.call("POST", path, {"ok": True, "data": {"digest": request["data"]["digest"]}})
    try:
        api.call("POST", path, {"ok": False})
    except urllib.error.HTTPError as refused:
        assert refused.code == 409
    else:
        raise AssertionError("a second answer was taken")


def lines_of(locator: Any) -> list[str]:
    """The lines a shown text draws (one element per line)."""
    lines: list[str] = locator.evaluate("(e) => [...e.children].map((c) => c.textContent)")
    return lines


def box(locator: Any) -> dict[str, float]:
    found = locator.bounding_box()
    assert found is not None
    return dict(found)


def test_hostile_text_keeps_the_page_within_the_screen(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with inbox(tmp_path) as (page, api, _):
        started = [api.call("POST", "/runs", {"prompt": prompt_of(i)})["id"] for i in range(COUNT)]
        expect(chip(page, "requests", "All").locator(".count")).to_have_text(
            str(COUNT), timeout=30_000
        )
        answered = started[-6:]  # one of each kind of hostile text, newest: on the runs page
        for run_id in answered:
            answer_twice(api, run_id)
        for run_id in answered:
            print(run_id, api.call("GET", f"/runs/{run_id}")["status"])
        long_id, lines_id = answered[1], answered[5]
        assert prompt_of(COUNT - 5).count("A") == 3000 and prompt_of(COUNT - 1).count("\n") > 30

        for viewport in (PHONE, DESKTOP):
            page.set_viewport_size(viewport)
            page.reload()
            expect(page.locator("#connection")).to_have_text("Live")
            for run_id in answered:
                card = page.locator(f'#runs > li[data-run="{run_id}"]')
                # A loaded machine may take seconds to draw 150 cards of each list.
                expect(card).to_have_attribute("data-status", "done", timeout=20_000)
            expect(page.locator("#requests > li")).to_have_count(100)  # a page of them
            # Nothing wider than the screen, whatever the text.
            width = page.evaluate("document.documentElement.clientWidth")
            assert page.evaluate("document.documentElement.scrollWidth") <= width

            # The long prompt, cut in the list: its card fits in the screen.
            long_card = page.locator(f'#runs > li[data-run="{long_id}"]')
            shown = lines_of(long_card.locator(".run-head .prompt"))
            assert shown[:2] == ["{", ' "tool": "pay",'], shown
            assert shown[-1].endswith("…") and len("".join(shown)) <= 281 + len(shown)
            assert box(long_card)["height"] < viewport["height"] * 0.8
            # Many lines: the first 8, cut.
            many = lines_of(page.locator(f'#runs > li[data-run="{lines_id}"] .run-head .prompt'))
            assert len(many) == 8 and many[-1].endswith("…"), many

            # The prompt beside its badge on a desktop; on a phone beside a short badge and
            # under a long one ("waiting for an answer"): never a sliver.
            waiting = page.locator(f'#runs > li[data-run="{started[-7]}"]')
            expect(waiting).to_have_attribute("data-status", "pending")
            for card in (long_card, waiting):
                head = card.locator(".run-head")
                badge, prompt = box(head.locator(".status")), box(head.locator(".prompt"))
                assert prompt["width"] >= box(head)["width"] * 0.6, (viewport, badge, prompt)
                beside = prompt["x"] >= badge["x"] + badge["width"]
                assert beside == (viewport is DESKTOP or card is long_card), (viewport, prompt)
                if not beside:
                    assert prompt["y"] >= badge["y"] + badge["height"] - 1

            # The detail view: the whole prompt, and who answered, at the width of the view.
            long_card.get_by_role("button", name="Details").click()
            detail = page.locator("#run-detail")
            expect(detail.locator(".run-head .prompt")).to_contain_text(LONG)
            answer = detail.locator(".history dd.answer")
            expect(answer).to_contain_text("Answered: yes · answered by api at ")
            expect(detail.locator(".refused-answers li")).to_contain_text(
                "already answered (call c1) · from api · at "
            )
            facts = box(detail.locator(".history dl.details").first)
            value = box(answer)
            if viewport is PHONE:  # the label above: the value has the whole width
                label = box(detail.locator('.history dt:text-is("Answer")'))
                assert value["y"] >= label["y"] + label["height"] - 1
                assert value["width"] >= facts["width"] * 0.95
            else:  # beside its label, as before
                assert value["x"] > facts["x"] + 50
            detail.get_by_role("button", name="Close").click()
            expect(detail).to_be_hidden()

            # A request card of the long word: every character there, within the card.
            request = page.locator("#requests > li", has_text="Pay invoice 1 to").first
            request.scroll_into_view_if_needed()
            assert LONG in (request.locator(".prompt").text_content() or "")
            card_box = box(request)
            assert box(request.locator(".prompt"))["width"] <= card_box["width"]
            arguments = request.locator('dt:text-is("Arguments") + dd')
            assert (
                box(arguments)["x"] + box(arguments)["width"] <= card_box["x"] + card_box["width"]
            )
            # HTML is text, never markup.
            html = page.locator("#requests > li", has_text="Pay invoice 2 to").first
            expect(html.locator(".prompt")).to_contain_text("<b>bold</b><script>")
            expect(page.locator("#requests b, #runs b, #requests img")).to_have_count(0)
