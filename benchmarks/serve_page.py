"""The inbox page with 1,000 requests waiting: how long it takes to draw, page, filter and search.

Run it with ``nox -s bench`` or ``python benchmarks/serve_page.py`` (``--help`` for the
knobs, ``--quick`` for 200 requests). Needs Debian's Chromium at ``/usr/bin/chromium`` and
Playwright (``pip install playwright``; no browser is downloaded), as the page's tests do.

The server is ``tests/serve_page.py`` in a child process (the real ``create_app`` and
``run_server`` on a SQLite store in a temporary folder, a scripted model). ``--requests``
runs (default 1,000) are started over the HTTP API and each parks on one request: 70 %
approvals (``Pay invoice <n> to <whom>?``), 20 % questions with two options, 10 % forms
of one field. Then the page is opened in headless Chromium, logged in, and timed in the
page itself (``performance.now()`` from the action until the page shows its result, checked
at every animation frame, so to about 17 ms):

- first page: from navigation until the first page of cards and the counts are drawn;
- all: "Show more" clicked until every request has its card (a page of 100 per click);
- a filter (the questions), back to all, and a search that one request matches;
- a keypress (``j``) moving the focus to the next card with every card on the page.

Beside each, the longest main-thread task Chromium reported meanwhile (a ``longtask``
PerformanceObserver: the longest the page did not respond to input), and a floor: the
same listing fetched by the same page through the same API (the same pages, cursor and
filters) and drawn as one plain ``<li>`` of text per request, the least any page could
do with that data. The ratio is page / floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from _common import print_footer, print_header

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]

# Installed before the page's own script: the longest main-thread task since the last reset.
LONG_TASKS = """
window.__longest = 0;
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    window.__longest = Math.max(window.__longest, entry.duration);
  }
}).observe({ type: "longtask", buffered: true });
"""

# Fetch a listing as the page does (pages of 100 through the cursor) and draw it plainly.
FLOOR = """async (path) => {
  const t0 = performance.now();
  const list = document.createElement("ul");
  document.body.append(list);
  let cursor = null, shown = 0;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const url = `${path}${sep}limit=100` + (cursor ? `&cursor=${encodeURIComponent(cursor)}` : "");
    const page = await (await fetch(url)).json();
    for (const r of page.requests) {
      const li = document.createElement("li");
      li.textContent = r.prompt;
      list.append(li);
      shown += 1;
    }
    cursor = page.next ?? null;
  } while (cursor);
  await new Promise((r) => requestAnimationFrame(r));
  const took = performance.now() - t0;
  list.remove();
  return [took, shown];
}"""


def timed(act: str, until: str, setup: str = "") -> str:
    """The source of a function run in the page: ``setup``, then ``act`` in a task of its own
    (so that a long one counts as a long task, as a click would), then wait for ``until``."""
    return f"""async () => {{
      {setup};
      window.__longest = 0;
      const t0 = performance.now();
      setTimeout(() => {{ {act}; }}, 0);
      const deadline = t0 + 120000;
      while (!({until})) {{
        if (performance.now() > deadline) throw new Error("timed out: {until}");
        await new Promise((r) => requestAnimationFrame(r));
      }}
      return [performance.now() - t0, window.__longest];
    }}"""


CARDS = "document.querySelectorAll('#requests > li').length"
ALL_COUNT = "document.querySelector('#requests-chips .chip .count')?.textContent"


async def start_server(store: Path, token: str) -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.serve_page",
        str(store),
        token,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    while True:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        if not line:
            raise SystemExit("the inbox server ended before it listened")
        if line.startswith("Open the inbox: "):
            return process, line.removeprefix("Open the inbox: ").strip()


def calls(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        if i % 10 < 7:
            out.append({"tool": "pay", "arguments": {"invoice": i, "to": f"Supplier {i % 13}"}})
        elif i % 10 < 9:
            question = {"question": f"Which room for meeting {i}?", "options": ["Red", "Blue"]}
            out.append({"tool": "question", "arguments": {"questions": [question]}})
        else:
            schema = {"type": "object", "properties": {"name": {"type": "string"}}}
            out.append({"tool": "form", "arguments": {"schema": schema}})
    return out


async def start_runs(base: str, token: str, n: int) -> float:
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(base, headers=headers) as http:
        queue = calls(n)

        async def worker() -> None:
            while queue:
                prompt = json.dumps(queue.pop())
                async with http.post("/runs", json={"prompt": prompt}) as reply:
                    assert reply.status == 202, await reply.text()

        await asyncio.gather(*(worker() for _ in range(16)))
        while True:  # each run parks on its request a moment after its 202
            async with http.get("/requests?limit=1") as reply:
                page = await reply.json()
            waiting = page.get("total", len(page["requests"]))
            if waiting >= n:
                return time.perf_counter() - started
            await asyncio.sleep(0.05)


def row(name: str, took: float, longest: float, floor: float | None) -> None:
    ratio = f"{took / floor:6.1f}" if floor else "     -"
    base = f"{floor:8.0f}" if floor else "       -"
    # Chromium reports tasks of 50 ms or more only.
    worst = f"{longest:12.0f}" if longest else f"{'< 50':>12}"
    print(f"{name:<34} {took:8.0f} {base} {ratio} {worst}")


async def main(n: int) -> int:
    from playwright.async_api import async_playwright

    from toolnexus_async.serve import new_token

    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"{CHROMIUM} is missing (apt-get install chromium)")
    print_header("aiohttp", "playwright")
    token = new_token()
    with tempfile.TemporaryDirectory() as folder:
        process, url = await start_server(Path(folder) / "runs.sqlite", token)
        base = url.split("/?", 1)[0]
        try:
            took = await start_runs(base, token, n)
            print(
                f"{n:,} requests waiting ({n * 7 // 10:,} approvals, {n * 2 // 10:,} questions, "
                f"{n - n * 7 // 10 - n * 2 // 10:,} forms), started in {took:.1f} s"
            )
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    # Playwright polls its wait_for_function by eval, which the page's CSP forbids.
                    page = await browser.new_page(
                        viewport={"width": 1000, "height": 900}, bypass_csp=True
                    )
                    await page.add_init_script(LONG_TASKS)
                    await figures(page, url, base, n)
                finally:
                    await browser.close()
        finally:
            process.terminate()
            await process.wait()
    print_footer()
    return 0


async def figures(page: Any, url: str, base: str, n: int) -> None:
    questions = n * 2 // 10
    print()
    print(f"{'ms (in the page)':<34} {'page':>8} {'floor':>8} {'ratio':>6} {'longest task':>12}")
    await page.goto(url)
    # performance.now() counts from the navigation: the moment the first page showed.
    drawn = f"{CARDS} > 0 && {ALL_COUNT} === {json.dumps(f'{n:,}')}"
    handle = await page.wait_for_function(f"({drawn}) && performance.now()", polling="raf")
    first_load = float(await handle.json_value())
    first_longest = float(await page.evaluate("window.__longest"))
    first_page = await page.evaluate(CARDS)
    floor_first = await page.evaluate(
        FLOOR.replace("} while (cursor);", "} while (false);"), "/requests"
    )
    # From the navigation: the page, its modules and its first two fetches; the floor is
    # one fetch of the first page, drawn.
    row(f"open, first page ({first_page} cards)", first_load, first_longest, floor_first[0])

    more = "document.getElementById('requests-more')"
    took, longest = 0.0, 0.0
    while await page.evaluate(f"!{more}.hidden"):
        one = await page.evaluate(
            timed(f"{more}.click()", f"{CARDS} > before", f"const before = {CARDS}")
        )
        took += one[0]
        longest = max(longest, one[1])
    shown = await page.evaluate(CARDS)
    assert shown == n, f"{shown} cards of {n}"
    floor_all = await page.evaluate(FLOOR, "/requests")
    row(f"show more until all {n:,}", took, longest, floor_all[0])

    chip = "[...document.querySelectorAll('#requests-chips .chip')]"
    question_chip = f"{chip}.find((c) => c.dataset.value === 'question')"
    kinds = "[...document.querySelectorAll('#requests > li')].map((c) => c.dataset.kind)"
    only = f"{kinds}.every((k) => k === 'question') && {CARDS} === {min(questions, 100)}"
    one = await page.evaluate(timed(f"{question_chip}.click()", only))
    floor = await page.evaluate(
        FLOOR.replace("} while (cursor);", "} while (false);"), "/requests?kind=question"
    )
    row(f"filter: questions ({questions:,})", one[0], one[1], floor[0])
    all_chip = f"{chip}.find((c) => c.dataset.value === '')"
    # Back to all: a first page that is not all questions.
    back = f"{CARDS} === 100 && !{kinds}.every((k) => k === 'question')"
    one = await page.evaluate(timed(f"{all_chip}.click()", back))
    floor = await page.evaluate(FLOOR.replace("} while (cursor);", "} while (false);"), "/requests")
    row("filter: all again (first page)", one[0], one[1], floor[0])
    search = (
        "const box = document.getElementById('requests-search'); box.value = 'invoice 16 to';"
        "box.dispatchEvent(new Event('input'))"
    )
    one = await page.evaluate(timed(search, f"{CARDS} === 1"))
    floor = await page.evaluate(FLOOR, "/requests?q=invoice+16+to")
    # The search waits 250 ms after the last keystroke before it asks: counted in "page".
    row("search: 'invoice 16 to' (1)", one[0], one[1], floor[0])

    clear = (
        "const box = document.getElementById('requests-search'); box.value = '';"
        "box.dispatchEvent(new Event('input'))"
    )
    await page.evaluate(timed(clear, f"{CARDS} === 100"))
    while await page.evaluate(f"!{more}.hidden"):
        await page.evaluate(
            timed(f"{more}.click()", f"{CARDS} > before", f"const before = {CARDS}")
        )
    await page.evaluate(f"document.querySelectorAll('#requests > li')[{n // 2}].focus()")
    key = timed(
        "was.dispatchEvent(new KeyboardEvent('keydown', {key: 'j', bubbles: true}))",
        "document.activeElement !== was",
        "const was = document.activeElement",
    )
    one = await page.evaluate(key)
    row(f"j: next card, {n:,} on the page", one[0], one[1], None)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000, help="requests waiting at once")
    parser.add_argument("--quick", action="store_true", help="200 requests")
    args = parser.parse_args()
    n = 200 if args.quick else args.requests
    if n < 100:
        parser.error("--requests must be at least 100 (a page of cards)")
    raise SystemExit(asyncio.run(main(n)))


if __name__ == "__main__":
    cli()
