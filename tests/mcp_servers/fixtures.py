"""Starting the demo MCP server for a test: its config over stdio, or a live HTTP process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parents[2])
MODULE = "tests.mcp_servers.demo"
KEY = "k" * 40  # the request-state key the restart tests share between server processes


def stdio_server(**env: str) -> dict[str, Any]:
    """The config of the demo server over stdio, with ``env`` set for it."""
    return {
        "command": [sys.executable, "-m", MODULE],
        "env": {"PYTHONPATH": ROOT, **env},
        "cwd": ROOT,
    }


def config(**servers: Mapping[str, Any]) -> dict[str, Any]:
    return {"mcpServers": dict(servers)}


def child_pids() -> set[int]:
    """The pids of this process's living children (from /proc; psutil is not a dependency)."""
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after it.
        fields = stat.rsplit(")", 1)[1].split()
        state, parent = fields[0], fields[1]
        if parent == me and state != "Z":
            found.add(int(entry.name))
    return found


_LISTENING = re.compile(rb"Uvicorn running on http://127\.0\.0\.1:(\d+)")


@contextmanager
def http_server(**env: str) -> Iterator[str]:
    """The demo server over streamable HTTP on a free loopback port: yields its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", MODULE, "--http", "0"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        port = None
        for line in process.stderr:  # uvicorn says where it listens once it does
            found = _LISTENING.search(line)
            if found:
                port = int(found.group(1))
                break
        assert port is not None, "the MCP HTTP server did not start"
        # Keep reading what it logs, so a full pipe never stalls it.
        threading.Thread(target=process.stderr.read, daemon=True).start()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)
        if process.stderr is not None:
            process.stderr.close()
