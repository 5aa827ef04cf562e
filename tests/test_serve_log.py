"""What ``toolnexus-async serve`` tells its operator, from a real child process: one access
line per request on stderr (none with ``--quiet``), never the token nor the session, however
the request carried them; a line when a stop begins and one when it is over; and a
``--store`` in a folder that does not exist is one line and exit status 2."""

from __future__ import annotations

import signal
import sys
from http.cookies import SimpleCookie
from pathlib import Path

import aiohttp
import anyio
import pytest
from yarl import URL

from tests.test_cli import Served, serve_process

LIMIT = 30


async def visit(served: Served) -> tuple[str, str, list[str]]:
    """Log in with the printed URL, then call the API every way a token or session can come:
    in the query, as a Bearer header, in the login cookie. The token, the session id and
    the request lines sent, as the access log should show them."""
    url = URL((await served.line_with("Open the inbox: ")).removeprefix("Open the inbox: "))
    token = url.query["token"]
    base = url.with_query(None).with_path("")
    async with aiohttp.ClientSession() as http:
        async with http.get(url, allow_redirects=False) as reply:  # GET /?token=...
            assert reply.status == 303
            session = next(iter(SimpleCookie(reply.headers["Set-Cookie"]).values())).value
        cookie = {"Cookie": f"toolnexus_session_{base.port}={session}"}
        async with http.get(base / "requests", headers=cookie) as reply:
            assert reply.status == 200
        bearer = {"Authorization": f"Bearer {token}"}
        async with http.get(base / "runs", headers=bearer) as reply:
            assert reply.status == 200
        async with http.get(base.with_path("/runs").with_query(token=token)) as reply:
            assert reply.status == 401  # the query logs in on GET / only
    sent = ['"GET /" 303', '"GET /requests" 200', '"GET /runs" 200', '"GET /runs" 401']
    return token, session, sent


def access_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if " aiohttp.access: " in line]


async def test_serve_logs_one_line_per_request_without_the_token(tmp_path: Path) -> None:
    with anyio.fail_after(LIMIT):
        async with serve_process(tmp_path) as served:
            token, session, sent = await visit(served)
            code, out, err = await served.stop(signal.SIGTERM)
    assert code == 0, err
    logged = access_lines(err)
    assert len(logged) == len(sent), err
    for line, request in zip(logged, sent, strict=True):
        assert line.endswith("s") and f"127.0.0.1 {request} " in line, line
    assert token not in err and session not in err
    assert "token=" not in err and "Bearer" not in err
    assert out.count(token) == 1  # the printed URL, nowhere else


async def test_serve_logs_its_stop_and_quiet_leaves_out_the_access_log(tmp_path: Path) -> None:
    with anyio.fail_after(LIMIT):
        async with serve_process(tmp_path, "--quiet", "--grace", "7") as served:
            token, _, _ = await visit(served)
            code, _, err = await served.stop(signal.SIGINT)
    assert code == 0, err
    assert access_lines(err) == [] and token not in err
    lines = err.splitlines()
    assert [line.split(" INFO ", 1)[1] for line in lines] == [
        "toolnexus_async.serve: SIGINT: stopping; open requests get up to 7 s to finish",
        lines[1].split(" INFO ", 1)[1],
    ]
    assert lines[1].endswith(" s") and "toolnexus_async.serve: stopped in " in lines[1]


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (
            "no/such/runs.sqlite",
            "{store}: the folder {dir}/no/such does not exist; create it, or name a file in a "
            "folder that exists",
        ),
        (
            ".",
            "{dir} is a folder, not a file: name a file in it, such as {dir}/toolnexus-runs.sqlite",
        ),
        ("a-file/runs.sqlite", "{store}: {dir}/a-file is a file, not a folder"),
    ],
)
async def test_serve_with_a_store_path_that_cannot_be_one_says_so_in_one_line(
    tmp_path: Path, where: str, message: str
) -> None:
    """Nothing is printed but the line, nothing is made, and no server starts."""
    (tmp_path / "a-file").write_text("")
    store = tmp_path if where == "." else tmp_path / where
    command = [sys.executable, "-m", "toolnexus_async", "serve", "--port", "0"]
    with anyio.fail_after(LIMIT):
        done = await anyio.run_process([*command, "--store", str(store)], check=False)
    assert (done.returncode, done.stdout) == (2, b"")
    said = message.format(dir=tmp_path, store=store)
    assert done.stderr.decode().splitlines() == [f"toolnexus-async serve: run store {said}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
