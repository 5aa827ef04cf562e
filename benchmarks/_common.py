"""What the benchmarks share: statistics, the report's header, memory readings, the child server.

Not a benchmark itself. ``overhead.py``, ``park.py``, ``serve_load.py`` and ``workers.py``
are run as scripts (``python benchmarks/<name>.py``, which ``nox -s bench`` does too), so
their own directory is on ``sys.path`` and they import this module as ``_common``;
multiprocessing's spawn hands that ``sys.path`` to the child processes, so those import it
alike.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import json
import math
import os
import platform
import shlex
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from toolnexus_async import (
    AssistantMessage,
    Message,
    Request,
    Tool,
    ToolCall,
    ToolReturn,
    UserMessage,
)

# Imported where used, not here: park.py has no server, and what it imports is resident
# memory before its first run, which it reports.
if TYPE_CHECKING:
    import multiprocessing.connection

    import aiohttp
    from aiohttp import web

# --------------------------------------------------------------------------------------
# serve's paged lists.


async def get_every_page(
    http: aiohttp.ClientSession, path: str, key: str, page: int = 500
) -> tuple[list[Any], int, float]:
    """Every item of serve's paged list ``path`` (``GET /requests``, ``GET /runs``), its
    pages followed by their ``next`` cursor as a client of the API must: the items, the
    bytes read and the seconds it took. A server that does not page (the benchmarks'
    floors) answers once with no ``next``.

    Raises:
        RuntimeError: a page answered other than 200.
    """
    from urllib.parse import quote

    items: list[Any] = []
    size, start, cursor = 0, time.perf_counter(), None
    while True:
        url = f"{path}?limit={page}" + (f"&cursor={quote(cursor)}" if cursor else "")
        async with http.get(url) as reply:
            raw = await reply.read()
            if reply.status != 200:
                raise RuntimeError(f"GET {url}: {reply.status} {raw[:200]!r}")
        body = json.loads(raw)
        items.extend(body[key])
        size += len(raw)
        cursor = body.get("next")
        if not cursor:
            return items, size, time.perf_counter() - start


# --------------------------------------------------------------------------------------
# Statistics and verdicts.


def add_postgres_options(parser: argparse.ArgumentParser, store: str) -> None:
    """``--fsync``, ``--pool`` and ``--command-timeout``: the throwaway PostgreSQL server's
    and ``store``'s (which PostgresRunStore the figures are of) settings."""
    parser.add_argument(
        "--fsync",
        choices=("on", "off"),
        default="on",
        help="the throwaway PostgreSQL server's fsync (default on: committed means on disk)",
    )
    parser.add_argument(
        "--pool", type=int, default=10, help=f"connections of {store}'s pool (default 10)"
    )
    parser.add_argument(
        "--command-timeout",
        type=float,
        default=30.0,
        help=f"{store}'s command_timeout: how long one statement may take (default 30 s, the"
        " store's own; a write waits for a free connection as long as it takes)",
    )


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# --------------------------------------------------------------------------------------
# The report's first lines and its last: enough to tell two runs' conditions apart.


def dist_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:  # e.g. run from a checkout on PYTHONPATH
        return "(not installed)"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_header(*packages: str, database: str | None = None) -> None:
    """The command, the versions and the machine, then a blank line.

    ``packages`` are distribution names, printed in order with their installed versions,
    ``toolnexus-async`` last; ``"SQLite"`` stands for the library ``sqlite3`` is linked to
    (it is no distribution). ``database``, if given, is a line of its own (a server's
    version and settings). Call it on the running event loop: its class is printed.
    """
    versions = [
        f"{name} {sqlite3.sqlite_version if name == 'SQLite' else dist_version(name)}"
        for name in (*packages, "toolnexus-async")
    ]
    print(f"command:   {shlex.join(sys.orig_argv)}")
    print(
        f"versions:  Python {platform.python_version()} ({platform.python_implementation()}), "
        + ", ".join(versions)
    )
    print(
        f"machine:   {platform.platform()}, {os.cpu_count()} CPUs, "
        f"load average {load_average()}; event loop: {type(asyncio.get_running_loop()).__name__}"
    )
    if database is not None:
        print(f"database:  {database}")
    print()


def print_footer() -> None:
    print()
    print(f"load average at the end: {load_average()}")


# --------------------------------------------------------------------------------------
# Memory: the resident set size, read cheaply (no tracemalloc), from a lean heap.

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_SIZE


_libc: Any = None


def malloc_trim() -> None:
    """Give freed heap back to the system (glibc), so that the RSS reads what is in use."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name) if name else False
    if _libc and hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)


# --------------------------------------------------------------------------------------
# A server in its own process.
#
# A process (multiprocessing, spawn), not a thread: a thread would share the measured
# process's GIL, and every request it answers would steal time from the event loop being
# measured. On a 2-core machine the measured process keeps one core and the server gets the
# other. The parent asks it questions (its CPU time, its memory) over a Pipe, between
# measurements only.


async def serve_over_pipe(
    conn: multiprocessing.connection.Connection,
    app: web.Application,
    reply: Callable[[str], object],
) -> None:
    """In the child: serve ``app`` on a free port of 127.0.0.1 and send the port on ``conn``.

    Then every message but ``"stop"`` is answered with ``reply(message)``, from the event
    loop itself (so an answer sees the app between two of its callbacks), until ``"stop"``
    comes or the parent goes away.
    """
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # A deep backlog: hundreds of connections open at once, and a dropped SYN costs a
    # one-second retransmit that would dwarf everything measured.
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port: int = runner.addresses[0][1]
    stop = asyncio.Event()

    def on_message() -> None:
        try:
            message = conn.recv()
        except EOFError:  # the parent went away
            stop.set()
            return
        if message == "stop":
            stop.set()
        else:
            conn.send(reply(message))

    loop = asyncio.get_running_loop()
    loop.add_reader(conn.fileno(), on_message)
    conn.send(port)
    try:
        await stop.wait()
    finally:
        loop.remove_reader(conn.fileno())
        await runner.cleanup()


class GcWatch:
    """Counts the cyclic collector's runs and the time they take (via ``gc.callbacks``).

    With many runs parked, one full (generation 2) collection walks every tracked object of
    every parked run, and CPython starts one each time the long-lived objects grew by 25%;
    these pauses are a large part of what parking costs, so the benchmarks report them.
    """

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest_full = 0.0  # seconds: the longest full collection so far
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            generation = info["generation"]
            took = time.perf_counter() - self._started
            self.counts[generation] += 1
            self.seconds[generation] += took
            if generation == 2:
                self.longest_full = max(self.longest_full, took)

    def mark(self) -> GcSpan:
        return GcSpan(self.counts[2], sum(self.seconds), self.seconds[2])

    def since(self, mark: GcSpan) -> GcSpan:
        now = self.mark()
        return GcSpan(now.full - mark.full, now.seconds - mark.seconds, now.full_s - mark.full_s)


@dataclass(frozen=True)
class GcSpan:
    full: int  # full collections
    seconds: float  # time in all collections
    full_s: float  # time in the full ones

    def text(self) -> str:
        return f"gc {self.seconds:.3f} s, of which {self.full} full collections {self.full_s:.3f} s"


class ChildServer:
    """The parent's side: a context manager that starts the child and stops it.

    ``target(conn, *args)`` runs in the child; it must be a module-level function (spawn
    pickles it by name) that ends up in :func:`serve_over_pipe`.
    """

    def __init__(self, name: str, target: Callable[..., None], *args: object) -> None:
        import multiprocessing

        self.name = name  # for the message if it does not start
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(target=target, args=(child_conn, *args), daemon=True)
        self.port = 0

    def __enter__(self) -> Self:
        self._process.start()
        try:
            if not self._conn.poll(60):
                raise EOFError
            self.port = self._conn.recv()
        except EOFError:
            self._process.kill()
            raise SystemExit(f"the {self.name} did not start (see its traceback above)") from None
        return self

    def ask(self, message: str) -> Any:
        """What the child's ``reply`` answers to ``message``."""
        self._conn.send(message)
        if not self._conn.poll(120):
            raise SystemExit(f"the {self.name} stopped answering on its pipe")
        return self._conn.recv()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._conn.send("stop")
        except OSError:
            pass
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()


# --------------------------------------------------------------------------------------
# The one-approval scenario of park.py and serve_load.py: an in-process model that calls
# ``pay_invoice`` once with the number in the prompt, then reports the tool's result. (Each
# script has its own ``pay_invoice``: they differ in how the request is named and noted.)

PROMPT = "Pay invoice {n}."


def expected_text(n: int) -> str:
    return f"Done: invoice {n} paid."


def invoice_approval(invoice: int) -> Request:
    """What ``pay_invoice`` asks before paying, in the servers' scenarios: an approval,
    its id generated, naming the invoice in its data (so a crossed answer shows)."""
    return Request("", "approval", f"Pay invoice {invoice}?", data={"invoice": invoice})


def invoice_of(prompt: str) -> int:
    return int(prompt.rsplit(" ", 1)[1].rstrip("."))


def approval_model(messages: list[Message], tools: list[Tool]) -> AssistantMessage:
    """Turn 1: call ``pay_invoice`` with the number in the prompt. Turn 2: report."""
    last = messages[-1]
    if isinstance(last, UserMessage):
        invoice = invoice_of(last.text)
        return AssistantMessage(None, (ToolCall("call_1", "pay_invoice", {"invoice": invoice}),))
    if isinstance(last, ToolReturn):
        return AssistantMessage(f"Done: {last.output}.")
    raise AssertionError(f"unexpected transcript end: {last!r}")
