"""A connection that cannot be opened for want of file descriptors is a TransportError that
says so.

For real: a child process lowers its ``RLIMIT_NOFILE``, uses up every descriptor left, and
then sends, streams and runs against a loopback server of the test process; each fails
with ``EMFILE`` in the connect. The child reports what it caught as JSON on stdout.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")

KEY = "sk-resources-test-key-0123456789"

CHILD = r"""
import asyncio, json, os, resource, sys

from toolnexus_async import AiohttpTransport, HttpRequest, LlmClient, RetryPolicy, Toolkit

KEY, URL = sys.argv[1], sys.argv[2]


def caught(exc):
    cause = exc.__cause__
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "cause": None if cause is None else [type(cause).__name__, cause.errno, cause.strerror],
        "cause_traceback": None if cause is None else cause.__traceback__ is not None,
        "context": exc.__context__ is not None,
    }


async def main():
    transport = AiohttpTransport(max_connections=50)
    headers = {"Authorization": KEY}
    request = HttpRequest("POST", URL + "/chat/completions", headers, b"{}", 10.0, 1 << 20)
    client = LlmClient(URL, model="m", api_key=KEY, retry=RetryPolicy(retries=0))
    toolkit = Toolkit.create(builtins=False)
    soft = len(os.listdir("/proc/self/fd")) + 8 if os.path.isdir("/proc/self/fd") else 64
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    held = []
    while True:  # every descriptor left, taken
        try:
            held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    out = {"soft": soft}
    try:
        await transport.send(request)
    except Exception as exc:
        out["send"] = caught(exc)
    try:
        async for _ in transport.stream(request):
            pass
    except Exception as exc:
        out["stream"] = caught(exc)
    try:
        await client.run("hi", toolkit)
    except Exception as exc:
        out["run"] = caught(exc)
    for fd in held:
        os.close(fd)
    await transport.aclose()
    await client.aclose()
    print(json.dumps(out))


asyncio.run(main())
"""


@pytest.fixture
async def loopback() -> AsyncIterator[str]:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "x"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    await runner.cleanup()


async def test_emfile_on_connect_is_a_transport_error_naming_the_cause(loopback: str):
    """send, stream and a whole run each raise TransportError whose message names EMFILE,
    the soft limit and the two ways out; the cause is a bare OSError (errno 24, no
    traceback), nothing of aiohttp's travels along, and the key is nowhere."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        KEY,
        loopback,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, stderr.decode()
    out = json.loads(stdout)
    for path in ("send", "stream", "run"):
        got = out[path]
        assert got["type"] == "TransportError", (path, got)
        message = got["message"]
        assert message.startswith(f"POST {loopback}/chat/completions failed: cannot open"), message
        assert "too many open files (EMFILE)" in message
        assert f"soft limit {out['soft']}" in message
        assert "lower max_connections" in message and "raise ulimit -n" in message
        assert KEY not in message and KEY not in stderr.decode()
        assert got["cause"][:2] == ["OSError", 24], (path, got)
        assert got["cause_traceback"] is False and got["context"] is False
    assert "(now 50)" in out["send"]["message"]
    assert "(now 1000)" in out["run"]["message"]  # the client's default transport
