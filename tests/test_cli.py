"""The command line: ``demo`` scripted (``--yes``), answered through stdin and at EOF; ``serve``.

Answers are piped by replacing ``sys.stdin``, so the real ``input()`` path (in a worker
thread) runs exactly as it does in a terminal. ``serve`` runs for real in a child process:
the tests read the URL it prints, use it, and stop it with a signal, as a person would.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
import pytest
from yarl import URL

from tests.conftest import assert_no_leaks
from toolnexus_async._cli import main, run_demo
from toolnexus_async._demo import DEMO_PROMPT

LIMIT = 10


async def demo_with_stdin(monkeypatch: pytest.MonkeyPatch, typed: str) -> tuple[int, str]:
    """Run the interactive demo with ``typed`` as the terminal's input; (status, narration)."""
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    out = io.StringIO()
    with anyio.fail_after(LIMIT):
        code = await run_demo(assume_yes=False, prompt=DEMO_PROMPT, out=out)
    return code, out.getvalue()


def test_demo_yes_prints_each_step_and_the_final_answer(capsys: pytest.CaptureFixture[str]) -> None:
    """``demo --yes`` exits 0 and narrates the prompt, every call, both requests, the answer."""
    assert main(["demo", "--yes"]) == 0
    out = capsys.readouterr().out

    expected_in_order = [
        f"you: {DEMO_PROMPT}",
        "-> check_availability(",
        "<- check_availability: Luigi's has a free table at 19:30.",
        ".. ask_party_size waits for a human: input",
        "[input] How many people are coming?",
        '<- ask_party_size: {"party_size": 2}',
        ".. book_table waits for a human: approval",
        "[approval] Pay a 20 EUR deposit to Luigi's for 2 at 19:30?",
        "<- book_table: Booked Luigi's for 2 at 19:30",
        "status: done after 3 model turns, 3 tool calls",
        "answer: All set. Booked Luigi's for 2 at 19:30; deposit of 20 EUR paid",
    ]
    position = 0
    for piece in expected_in_order:
        found = out.find(piece, position)
        assert found >= 0, f"{piece!r} missing (or out of order) in:\n{out}"
        position = found + len(piece)


def test_demo_prompt_option_reaches_the_agent(capsys: pytest.CaptureFixture[str]) -> None:
    """``--prompt`` is what the agent is asked."""
    assert main(["demo", "--yes", "--prompt", "Dinner for us, please"]) == 0
    assert "you: Dinner for us, please" in capsys.readouterr().out


async def test_demo_approve_path_with_piped_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Typed "4" then "y": the party size reaches the booking and the deposit is paid."""
    code, out = await demo_with_stdin(monkeypatch, "4\ny\n")

    assert code == 0
    assert "[approval] Pay a 40 EUR deposit to Luigi's for 4 at 19:30?" in out
    assert "status: done after 3 model turns, 3 tool calls" in out
    assert "answer: All set. Booked Luigi's for 4 at 19:30; deposit of 40 EUR paid" in out
    assert_no_leaks()


async def test_demo_decline_path_with_piped_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Typed "3" then "n": the booking is declined and the model reports it; no payment."""
    code, out = await demo_with_stdin(monkeypatch, "3\nn\n")

    assert code == 0
    assert "[approval] Pay a 30 EUR deposit to Luigi's for 3 at 19:30?" in out
    assert "Booked" not in out
    assert (
        "answer: I did not book the table: declined/expired: "
        "Pay a 30 EUR deposit to Luigi's for 3 at 19:30?"
    ) in out
    assert_no_leaks()


async def test_demo_asks_again_after_input_that_is_not_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A party size that is not an integer is asked again; the next valid one is used."""
    code, out = await demo_with_stdin(monkeypatch, "many\n5\ny\n")

    assert code == 0
    assert "please enter a" in out
    assert "Booked Luigi's for 5 at 19:30" in out
    assert_no_leaks()


@pytest.mark.parametrize(
    ("typed", "answer"),
    [
        ("", "answer: I could not book: I need the party size (declined/expired: How many"),
        ("2\n", "answer: I did not book the table: declined/expired: Pay a 20 EUR deposit"),
    ],
    ids=["eof-at-the-input", "eof-at-the-approval"],
)
async def test_demo_eof_on_input_cancels_and_the_run_ends_cleanly(
    monkeypatch: pytest.MonkeyPatch, typed: str, answer: str
) -> None:
    """EOF on stdin: the request is treated as cancelled; the run still ends with an answer."""
    code, out = await demo_with_stdin(monkeypatch, typed)

    assert "(no terminal input: treated as cancelled)" in out
    assert answer in out
    assert "status: done" in out
    assert code == 0
    assert "Booked" not in out
    assert_no_leaks()


def test_serve_needs_a_model_with_a_base_url(capsys, monkeypatch):
    """--base-url without --model (or TOOLNEXUS_MODEL) is refused before anything starts."""
    monkeypatch.delenv("TOOLNEXUS_MODEL", raising=False)
    assert main(["serve", "--base-url", "http://127.0.0.1:9/v1"]) == 2
    assert "--model" in capsys.readouterr().err


def test_serve_runs_the_demo_app_with_the_given_flags(monkeypatch, tmp_path, capsys):
    """serve builds the demo app and hands it, host and port to run_server."""
    from aiohttp import web

    import toolnexus_async.serve as serve

    seen: dict[str, Any] = {}

    async def fake_run_server(app: web.Application, **kwargs: Any) -> None:
        seen["app"] = app
        seen.update(kwargs)
        kwargs["on_ready"](f"http://{kwargs['host']}:{kwargs['port']}")

    monkeypatch.setattr(serve, "run_server", fake_run_server)
    store = tmp_path / "runs.sqlite"
    code = main(
        ["serve", "--host", "127.0.0.2", "--port", "9999", "--store", str(store),
         "--park-timeout", "7"]
    )  # fmt: skip
    assert code == 0
    assert seen["host"] == "127.0.0.2" and seen["port"] == 9999
    assert isinstance(seen["app"], web.Application)
    assert "Open the inbox: http://127.0.0.2:9999/\n" in capsys.readouterr().out


class Served:
    """``toolnexus-async serve`` in a child process: its output so far, and its URL."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.out = b""

    async def line_with(self, marker: str) -> str:
        """The first line of output holding ``marker`` (read as the server prints)."""
        assert self.process.stdout is not None
        while (at := self.out.find(marker.encode())) < 0 or b"\n" not in self.out[at:]:
            self.out += await self.process.stdout.receive()
        start = self.out.rfind(b"\n", 0, at) + 1
        return self.out[start : self.out.index(b"\n", at)].decode()

    async def stop(self, signum: signal.Signals) -> tuple[int, str, str]:
        """Send ``signum``; the exit status and all the output once the process ended."""
        assert self.process.stdout is not None and self.process.stderr is not None
        self.process.send_signal(signum)
        rest = [chunk async for chunk in self.process.stdout]
        err = b"".join([chunk async for chunk in self.process.stderr])
        return await self.process.wait(), (self.out + b"".join(rest)).decode(), err.decode()


@asynccontextmanager
async def serve_process(tmp_path: Path, *flags: str, env: dict[str, str] | None = None):
    command = [sys.executable, "-m", "toolnexus_async", "serve", "--port", "0"]
    command += ["--store", str(tmp_path / "runs.sqlite"), *flags]
    environment = {**os.environ, **(env or {})}
    async with await anyio.open_process(command, env=environment) as process:
        try:
            yield Served(process)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_serve_prints_its_url_and_stops_cleanly_on_ctrl_c(tmp_path):
    """The real command: it prints the URL it listens on, serves there, and SIGINT (Ctrl-C)
    shuts it down cleanly, exit status 0; SIGTERM too."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        with anyio.fail_after(30):
            async with serve_process(tmp_path) as served:
                url = URL((await served.line_with("Open the inbox: ")).split(": ", 1)[1])
                async with aiohttp.ClientSession() as session:
                    async with session.get(url / "requests") as reply:
                        assert (reply.status, await reply.json()) == (200, {"requests": []})
                code, _, err = await served.stop(signum)
        assert code == 0, err
        assert "Traceback" not in err
