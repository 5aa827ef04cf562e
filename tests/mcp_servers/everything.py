"""The reference MCP server ``@modelcontextprotocol/server-everything``, from npm.

It is installed into tests/node/ by ``npm ci`` (.ci/run does it). Without it the tests
that use it are skipped on a developer's machine and fail under ``CI=true``, as the
browser and PostgreSQL tests do.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
ENTRY = (
    NODE_DIR / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
)


def require_everything() -> str:
    """The path of node, when node and the server are installed; else skip (fail on CI)."""
    node = shutil.which("node")
    if node is not None and ENTRY.is_file():
        return node
    why = (
        "@modelcontextprotocol/server-everything is not installed: "
        f"run `npm ci` in {NODE_DIR} (and install Node.js)"
    )
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def stdio_everything() -> dict[str, Any]:
    """The config of the server over stdio."""
    return {"command": [require_everything(), str(ENTRY), "stdio"]}


def free_port() -> int:
    """A loopback port free now. The server takes its port from PORT and does not say
    which one it got when given 0, so the port is chosen here."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def http_everything(mode: str = "streamableHttp", port: int | None = None) -> Iterator[HttpServer]:
    """The server over HTTP (``streamableHttp``, or ``sse``: the legacy transport) on
    loopback, started now and stopped on leaving; yields its handle."""
    server = HttpServer(require_everything(), mode, port or free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


class HttpServer:
    """One server-everything HTTP process, which a test may kill and start again."""

    def __init__(self, node: str, mode: str, port: int) -> None:
        self.node, self.mode, self.port = node, mode, port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{'sse' if self.mode == 'sse' else 'mcp'}"

    def start(self) -> None:
        process = subprocess.Popen(
            [self.node, str(ENTRY), self.mode],
            env={**os.environ, "PORT": str(self.port)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.process = process
        assert process.stderr is not None
        for line in process.stderr:  # it says on stderr once it listens (or why not)
            if b"port" in line and b"in use" not in line:
                break
        else:
            raise AssertionError(f"server-everything ({self.mode}) did not start")
        # Keep reading what it logs, so a full pipe never stalls it.
        threading.Thread(target=process.stderr.read, daemon=True).start()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            if self.process.stderr is not None:
                self.process.stderr.close()
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            if self.process.stderr is not None:
                self.process.stderr.close()
            self.process = None
