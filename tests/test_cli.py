"""The command line: ``demo`` scripted (``--yes``), answered through stdin and at EOF; ``serve``.

Answers are piped by replacing ``sys.stdin``, so the real ``input()`` path (in a worker
thread) runs exactly as it does in a terminal. ``serve`` runs for real in a child process:
the tests read the URL it prints, use it, and stop it with a signal, as a person would.
"""

from __future__ import annotations

import io
import os
import signal
import socket
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
from toolnexus_async._cli import main
from toolnexus_async._cli_demo import run_demo
from toolnexus_async._demo import DEMO_PROMPT
from toolnexus_async.serve import TOKEN_ENV

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


@pytest.mark.parametrize(
    ("freeze", "frozen"), [([], True), (["--freeze-gc"], True), (["--no-freeze-gc"], False)]
)
def test_serve_runs_the_demo_app_with_the_given_flags(
    monkeypatch, tmp_path, capsys, freeze, frozen
):
    """serve builds the locked demo app and hands it, host and port to run_server."""
    from aiohttp import web

    import toolnexus_async.serve as serve
    from toolnexus_async.serve._app import SERVE
    from toolnexus_async.serve._guard import GUARD

    seen: dict[str, Any] = {}

    async def fake_run_server(app: web.Application, **kwargs: Any) -> None:
        seen["app"] = app
        seen.update(kwargs)
        kwargs["on_ready"](f"http://{kwargs['host']}:{kwargs['port']}")

    monkeypatch.setattr(serve, "run_server", fake_run_server)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    store = tmp_path / "runs.sqlite"
    code = main(
        ["serve", "--host", "inbox.lan", "--port", "9999", "--store", str(store),
         "--park-timeout", "7", "--allowed-host", "proxy.example", *freeze]
    )  # fmt: skip
    assert code == 0
    assert seen["host"] == "inbox.lan" and seen["port"] == 9999
    assert seen["app"][SERVE].freeze_gc is frozen  # a GcFreezer unless told not to
    guard = seen["app"][GUARD]
    assert {"inbox.lan", "proxy.example", "localhost"} <= guard.allowed_hosts
    assert guard.token is not None and len(guard.token) >= 40
    out = capsys.readouterr().out
    assert f"Open the inbox: http://inbox.lan:9999/?token={guard.token}\n" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--style", "anthropic"], "--style anthropic needs --base-url (or ANTHROPIC_BASE_URL)"),
        (["--model", "gpt-4o"], "--model gpt-4o needs --base-url (or OPENAI_BASE_URL)"),
    ],
)
def test_serve_with_a_provider_but_no_endpoint_is_refused_not_the_demo(
    capsys, monkeypatch, tmp_path, argv, message
):
    """Asking for a provider without saying where must not silently run the demo model."""
    import toolnexus_async.serve as serve

    def must_not_serve(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("served the demo model")

    monkeypatch.setattr(serve, "run_server", must_not_serve)
    for name in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["serve", "--store", str(tmp_path / "runs.sqlite"), *argv]) == 2
    out, err = capsys.readouterr()
    assert message in err and "demo" in err
    assert "demo model" not in out and not (tmp_path / "runs.sqlite").exists()


async def test_serve_on_a_taken_port_says_so_in_one_line(tmp_path):
    """The real command on a port another socket holds: one line, how to pick another, a
    non-zero exit and no traceback."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        command = [sys.executable, "-m", "toolnexus_async", "serve", "--port", str(port)]
        command += ["--store", str(tmp_path / "runs.sqlite")]
        with anyio.fail_after(60):
            done = await anyio.run_process(command, check=False)
    err = done.stderr.decode()
    assert done.returncode == 1
    assert err.splitlines() == [
        f"toolnexus-async serve: port {port} on 127.0.0.1 is already taken (another server "
        f"is listening there); pick another with --port, e.g. --port {port + 1}, or --port 0 "
        "for any free one"
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--token", "0123456789abcdef0123", "--insecure-no-auth"], "do not go together"),
        (["--token", "short"], "16 to 512"),
        (["--allowed-host", "inbox.example:8080"], "without a port"),
    ],
)
def test_serve_refuses_bad_lock_flags(capsys, monkeypatch, tmp_path, argv, message):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(["serve", "--store", str(tmp_path / "runs.sqlite"), *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lease", "0"], "lease must be > 0 seconds, got 0.0"),
        (["--lease", "-5"], "lease must be > 0 seconds, got -5.0"),
        (["--lease", "nan"], "lease must be > 0 seconds, got nan"),
        (["--park-timeout", "0"], "park_timeout must be > 0 seconds, got 0.0"),
        (["--port", "70000"], "--port must be 0 to 65535, got 70000"),
        (["--port", "-1"], "--port must be 0 to 65535, got -1"),
        (["--grace", "-1"], "--grace must be 0 or more seconds, got -1.0"),
        (["--grace", "nan"], "--grace must be 0 or more seconds, got nan"),
        (["--grace", "inf"], "--grace must be 0 or more seconds, got inf"),
        (["--store-timeout", "0"], "--store-timeout must be more than 0 seconds, got 0.0"),
        (["--store-timeout", "-2"], "--store-timeout must be more than 0 seconds, got -2.0"),
        (["--store-timeout", "nan"], "--store-timeout must be more than 0 seconds, got nan"),
        (["--store-timeout", "inf"], "--store-timeout must be more than 0 seconds, got inf"),
    ],
)
def test_serve_refuses_bad_numbers_in_one_line(capsys, monkeypatch, tmp_path, argv, message):
    """A number out of range is one line and exit 2, before anything listens."""
    import toolnexus_async.serve as serve

    def must_not_serve(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("served")

    monkeypatch.setattr(serve, "run_server", must_not_serve)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(["serve", "--store", str(tmp_path / "runs.sqlite"), *argv]) == 2
    assert capsys.readouterr().err == f"toolnexus-async serve: {message}\n"
    assert not (tmp_path / "runs.sqlite").exists()


def test_serve_prints_its_endpoint_without_the_credentials_in_it(capsys, monkeypatch, tmp_path):
    """A base URL may hold a proxy's user and key: the startup line leaves them out."""
    import toolnexus_async.serve as serve

    async def fake_run_server(app: Any, **kwargs: Any) -> None:
        pass

    monkeypatch.setattr(serve, "run_server", fake_run_server)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    secret = "sk-live-SECRET-0123456789"
    base_url = f"https://proxyuser:{secret}@127.0.0.1:9/v1"
    argv = ["serve", "--store", str(tmp_path / "runs.sqlite"), "--base-url", base_url]
    assert main([*argv, "--model", "m"]) == 0
    out, err = capsys.readouterr()
    assert secret not in out + err and "proxyuser" not in out + err
    assert "openai model m at https://" in out and "127.0.0.1:9/v1" in out


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
    environment = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    async with await anyio.open_process(command, env={**environment, **(env or {})}) as process:
        try:
            yield Served(process)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_serve_prints_a_url_with_a_token_that_opens_the_inbox(tmp_path):
    """The real command: the printed URL logs a browser in; the token opens the API; Ctrl-C
    (SIGINT) shuts it down cleanly, exit status 0."""
    with anyio.fail_after(30):
        async with serve_process(tmp_path) as served:
            line = await served.line_with("Open the inbox: ")
            url = URL(line.removeprefix("Open the inbox: "))
            token = url.query["token"]
            assert url.path == "/" and len(token) >= 40
            base = url.with_query(None).with_path("")
            async with aiohttp.ClientSession() as session:
                async with session.get(base / "requests") as reply:
                    assert reply.status == 401
                auth = {"Authorization": f"Bearer {token}"}
                async with session.get(base / "requests", headers=auth) as reply:
                    assert (reply.status, (await reply.json())["requests"]) == (200, [])
                async with session.get(url, allow_redirects=False) as reply:
                    assert (reply.status, reply.headers["Location"]) == (303, "/")
            code, out, err = await served.stop(signal.SIGINT)
    assert code == 0, err
    assert "Traceback" not in err
    assert out.count(token) == 1  # printed once, in the URL


async def test_serve_stopping_with_a_parked_run_takes_a_second_ctrl_c_without_hanging(tmp_path):
    """Ctrl-C twice: the second lands while the server saves its parked run and closes the
    store. It is logged and changes nothing (it used to raise KeyboardInterrupt inside the
    shutdown: exit status 130, or a process that never ended)."""
    with anyio.fail_after(30):
        async with serve_process(tmp_path) as served:
            url = URL((await served.line_with("Open the inbox: ")).split(": ", 1)[1])
            base = url.with_query(None).with_path("")
            auth = {"Authorization": f"Bearer {url.query['token']}"}
            async with aiohttp.ClientSession(headers=auth) as session:
                async with session.post(base / "runs", json={"prompt": "Book for 2"}) as reply:
                    assert reply.status == 202
                listed: list[Any] = []
                while not listed:  # each look is a round trip: no pause needed
                    async with session.get(base / "requests") as reply:
                        listed = (await reply.json())["requests"]
            process = served.process
            assert process.stderr is not None
            process.send_signal(signal.SIGINT)
            err = b""
            while b"SIGINT: stopping" not in err:
                err += await process.stderr.receive()
            process.send_signal(signal.SIGINT)  # while it stops (about 0.2 s here)
            err += b"".join([chunk async for chunk in process.stderr])
            code = await process.wait()
    log = err.decode()
    assert code == 0, log
    assert "SIGINT again: already stopping" in log and "stopped in" in log
    assert "Traceback" not in log and "interrupted" not in log


async def test_serve_insecure_no_auth_says_what_it_disables(tmp_path):
    with anyio.fail_after(30):
        async with serve_process(tmp_path, "--insecure-no-auth") as served:
            warning = await served.line_with("WARNING")
            assert "no token is checked" in warning and "host and origin checks" in warning
            url = URL((await served.line_with("Open the inbox: ")).split(": ", 1)[1])
            assert not url.query
            async with aiohttp.ClientSession() as session:
                async with session.get(url / "requests") as reply:
                    assert reply.status == 200
                async with session.get(url / "requests", headers={"Host": "evil.test"}) as reply:
                    assert reply.status == 403
            code, _, err = await served.stop(signal.SIGTERM)
    assert code == 0, err


async def test_serve_takes_the_token_from_the_environment_and_does_not_print_it(tmp_path):
    token = "from-the-environment-0123456789"
    with anyio.fail_after(30):
        async with serve_process(tmp_path, env={TOKEN_ENV: token}) as served:
            line = await served.line_with("Open the inbox: ")
            assert TOKEN_ENV in line
            base = URL(line.split(": ", 1)[1].split("/?", 1)[0])
            async with aiohttp.ClientSession() as session:
                auth = {"Authorization": f"Bearer {token}"}
                async with session.get(base / "runs", headers=auth) as reply:
                    assert reply.status == 200
            code, out, err = await served.stop(signal.SIGTERM)
    assert code == 0, err
    assert token not in out + err
