"""toolnexus_async: the event loop's longest stall while hostile input is processed.

Run: ``python benchmarks/hostile.py [--runs N] [--quick]`` (or ``nox -s bench -- hostile``).

One event loop holds every parked run and the web service, so a tool or a validation step
that holds it for a second holds every approval and every wake-up for that second. This
parks ``--runs`` runs (10,000 by default) on an :class:`~toolnexus_async.Inbox`, starts a
heartbeat (``_stall.LoopWatch``: the lateness of a 1 ms sleep), then, one phase each,
hands the toolkit what a prompt-injected model or a hostile MCP server would send:

- ``validate``: arguments checked against a tool schema whose ``pattern`` is ``^(a+)+$``,
  with ``"a" * n + "!"`` for growing ``n`` (a backtracking engine needs 2**n steps);
- ``glob``: ``*a*a*a*a*a*a*a*a*a*a*b`` in a folder holding one file with a 40-character
  name, and ``**/`` eight times against a 30-deep path;
- ``grep``: ``(a+)+$`` over a file of long lines of ``a`` ending in ``!``;
- ``baseline``: the same time with nothing going on (the machine's own noise).

It prints each phase's longest stall; the target is under 50 ms in every phase. Then all
parked runs are answered and must finish (the stall cost nothing but time). The figure is
a stall in milliseconds, not a ratio: a stall is absolute (what a waiting request feels),
and the baseline phase, measured in the same run, shows the machine's floor.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
from _common import PROMPT, approval_model, expected_text
from _park_hot import make_tool, request_id
from _stall import LoopWatch

from toolnexus_async import Answer, Inbox, LlmClient, ToolContext, Toolkit, ToolResult

TARGET = 0.050  # seconds: the longest stall allowed in any phase


class Lookup:
    """A tool whose schema a hostile server wrote: a backtracking ``pattern``. (A plain
    class: a tool is anything with these attributes, as an MCP server's tool is.)"""

    name = "lookup"
    description = "Look an id up."
    source = "custom"
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^(a+)+$"}},
        "required": ["id"],
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        return ToolResult.ok(str(args["id"]))


def tree(root: Path) -> None:
    """A folder the file tools will search: one long name, one deep path, one grep bait."""
    (root / ("a" * 40)).write_text("x")
    deep = root.joinpath(*["d"] * 30)
    deep.mkdir(parents=True)
    (deep / "f.txt").write_text("x")
    (root / "bait.txt").write_text(("a" * 60 + "!\n") * 200)


async def main(runs: int, rounds: int) -> int:
    loop_watch = LoopWatch()
    inbox = Inbox()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        tree(root)
        async with (
            Toolkit.create(extra_tools=[make_tool(None), Lookup()], workdir=root) as toolkit,
            LlmClient.in_process(approval_model, wait_for=inbox) as client,
            anyio.create_task_group() as tg,
        ):

            async def one(n: int) -> None:
                result = await client.run(PROMPT.format(n=n), toolkit)
                assert result.text == expected_text(n), result.text

            started = time.perf_counter()
            for n in range(runs):
                tg.start_soon(one, n)
            while len(inbox) < runs:  # noqa: ASYNC110 (a count to reach, no event for it)
                await asyncio.sleep(0.01)
            print(f"{runs:,} runs parked in {time.perf_counter() - started:.2f} s")

            async with loop_watch:
                with loop_watch.phase("baseline"):
                    await asyncio.sleep(0.5)
                with loop_watch.phase("validate"):
                    for _ in range(rounds):
                        for n in (16, 20, 24, 28, 5000):
                            got = await toolkit.execute("lookup", {"id": "a" * n + "!"})
                            assert got.is_error, got.output
                        await asyncio.sleep(0)
                with loop_watch.phase("glob"):
                    for _ in range(rounds):
                        for pattern in ("*a*a*a*a*a*a*a*a*a*a*b", "**/" * 8 + "x"):
                            await toolkit.execute("glob", {"pattern": pattern})
                with loop_watch.phase("grep"):
                    for _ in range(rounds):
                        await toolkit.execute("grep", {"pattern": "(a+)+$"})

            answered = time.perf_counter()
            for n in range(runs):
                await inbox.answer(Answer(request_id(n), True))
        print(f"all answered and done in {time.perf_counter() - answered:.2f} s")
    worst = 0.0
    for phase in loop_watch.phases:
        print(phase.line())
        if phase.name != "baseline":
            worst = max(worst, phase.longest)
    met = "met" if worst < TARGET else "MISSED"
    print(f"target: longest stall under {TARGET * 1000:g} ms beside {runs:,} parked runs:")
    print(f"  {worst * 1000:.1f} ms   {met}")
    return 0


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="runs parked at once")
    parser.add_argument("--rounds", type=int, default=3, help="times each hostile input is sent")
    parser.add_argument("--quick", action="store_true", help="1,000 runs, one round")
    args = parser.parse_args()
    runs, rounds = (1_000, 1) if args.quick else (args.runs, args.rounds)
    sys.exit(anyio.run(main, runs, rounds))


if __name__ == "__main__":
    cli()
