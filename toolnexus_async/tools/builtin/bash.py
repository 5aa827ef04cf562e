"""The ``bash`` built-in: run one shell command and hand back what it printed.

Rules of this module:

- It runs code, so it asks first (:mod:`._approval`): under the default ``"ask"`` policy the
  first call suspends with an approval request showing the command and the real working
  directory, and the command runs only on the approved retry, if the working directory
  still resolves to the one shown.
- Every command gets a session and process group of its own (``start_new_session=True``)
  and, on Linux, is a child subreaper, so that the processes it starts stay in its tree
  even when they ``setsid`` or double-fork (:mod:`._proctree`). When a call ends any way
  other than the command finishing (its timeout, or the awaiting task being cancelled), the
  whole tree is stopped and SIGKILLed (descendants, the group, and whoever holds the output
  pipe), the shell is reaped, and ``execute`` returns (or re-raises the cancellation) only
  once none of them is alive, within a bound. Where ``/proc`` or ``prctl`` is missing, less
  is found: see :mod:`._proctree`; without ``/proc`` only the process group is killed.
- When the shell exits but background processes keep the output open, they too are killed
  after a short grace, so ``cmd &`` does not stall the call until its timeout. A background
  process with its output redirected elsewhere is left alone, as it would be in a terminal.
- The start is shielded: a cancellation cannot land between the fork and the moment the
  handle needed to kill the tree is held.
- stdout and stderr are one stream, in the order written. Only a bounded head and tail are
  kept in memory, so a command printing gigabytes costs ``max_output`` bytes, and the result
  says how much was cut.
- The working directory obeys the workspace's confinement; the command does not. ``bash`` is
  not a sandbox: the approval is what stands between a model and the machine.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import anyio

from ..._core.types import ToolContext, ToolResult
from ._approval import ActingTool, ApprovalPolicy, Preview, digest_of
from ._proctree import end_tree, pipe_id, preexec_fn, wait_gone
from ._workspace import ArgumentError, Workspace, optional_str, required_str

__all__ = ("DEFAULT_TIMEOUT_MS", "MAX_OUTPUT", "BashTool")

DEFAULT_TIMEOUT_MS = 60_000
MAX_OUTPUT = 30_000
_CHUNK = 65_536
# How long cleanup may wait for a killed group to vanish. SIGKILL cannot be ignored, so this
# only bounds the pathological case of a member stuck in uninterruptible sleep.
_CLEANUP_LIMIT_S = 2.0
# How long output may stay open after the shell exited before the holders count as stray
# background processes and are killed.
_LINGER_S = 0.5

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The shell command to run (bash -c)."},
        "workdir": {
            "type": "string",
            "description": "Directory to run it in; defaults to the workspace root.",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": f"Time limit in milliseconds (default {DEFAULT_TIMEOUT_MS}).",
        },
        "description": {
            "type": "string",
            "description": "What the command does, in five to ten words, for the user.",
        },
    },
    "required": ["command"],
}


class _Capture:
    """The first and last bytes of a stream, within ``limit`` bytes, and its total length."""

    def __init__(self, limit: int) -> None:
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            excess = len(self._tail) - self._tail_limit
            if excess > 0:
                del self._tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + len(self._tail)

    def text(self) -> str:
        if not self.truncated:
            return (self._head + self._tail).decode("utf-8", "replace")
        # Decoded apart: a multi-byte character split at either cut becomes one U+FFFD.
        head = self._head.decode("utf-8", "replace")
        tail = self._tail.decode("utf-8", "replace")
        omitted = self.total - len(self._head) - len(self._tail)
        return (
            f"{head}\n\n[... output truncated: {omitted} of {self.total} bytes omitted; "
            f"showing the first {len(self._head)} and the last {len(self._tail)} ...]\n\n{tail}"
        )


def _timeout_ms(args: dict[str, Any]) -> float:
    value = args.get("timeout")
    if value is None:
        return DEFAULT_TIMEOUT_MS
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentError(f"'timeout' must be a number of milliseconds, got {value!r}")
    if not value > 0:
        raise ArgumentError(f"'timeout' must be more than 0 milliseconds, got {value!r}")
    return float(value)


class _Collector(asyncio.SubprocessProtocol):
    """Feeds the command's output into a capture and reports exit and end of output.

    A protocol rather than ``asyncio.subprocess.Process``: on Python 3.11 ``Process.wait()``
    returns only once every pipe is closed, so a background child holding the output would
    hide that the shell itself has exited.
    """

    def __init__(self, capture: _Capture) -> None:
        self.capture = capture
        self.exited = anyio.Event()
        self.output_closed = anyio.Event()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.capture.feed(data.encode() if isinstance(data, str) else data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.output_closed.set()

    def process_exited(self) -> None:
        self.exited.set()


async def _end_tree(pid: int, pipe: str | None, collector: _Collector) -> None:
    """Kill the command's whole process tree and wait until it is gone, shielded."""
    with anyio.CancelScope(shield=True):
        shell_alive = not collector.exited.is_set()
        killed = await anyio.to_thread.run_sync(end_tree, pid, pipe, shell_alive)
        with anyio.move_on_after(_CLEANUP_LIMIT_S):
            await collector.exited.wait()
            # What the dying processes wrote last is often the most useful part.
            await collector.output_closed.wait()
        # SIGKILL is delivered asynchronously: a member may still be running for a moment.
        await anyio.to_thread.run_sync(wait_gone, killed, pid, _CLEANUP_LIMIT_S)


def _preview(command: str, cwd: Path) -> Preview:
    return Preview(
        prompt=f"Allow bash to run this command in {cwd}?\n\n{command}",
        details={"command": command, "workdir": str(cwd)},
        digest=digest_of("bash", command, str(cwd)),
        subject="the working directory",
    )


def _output_pipe(transport: asyncio.SubprocessTransport) -> str | None:
    reader = transport.get_pipe_transport(1)
    stream = reader.get_extra_info("pipe") if reader is not None else None
    return pipe_id(stream.fileno()) if stream is not None else None


class BashTool(ActingTool):
    """Run a shell command in the workspace, once approved, with a time limit and capped
    output."""

    name = "bash"
    description = (
        "Run a shell command with bash -c and return its combined stdout and stderr. "
        "Runs in the workspace root unless 'workdir' is given; 'timeout' is in milliseconds "
        f"(default {DEFAULT_TIMEOUT_MS}). A non-zero exit status is reported as an error. "
        "Output longer than the cap is cut in the middle."
    )
    input_schema = _SCHEMA

    def __init__(
        self,
        workspace: Workspace | None = None,
        *,
        max_output: int = MAX_OUTPUT,
        approve: ApprovalPolicy = "ask",
    ) -> None:
        super().__init__(workspace, approve=approve)
        self.max_output = max_output
        self._shell = shutil.which("bash") or "/bin/sh"

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            command = required_str(args, "command")
            workdir = optional_str(args, "workdir")
            timeout_ms = _timeout_ms(args)
            optional_str(args, "description")  # only checked: it is for the humans watching
        except ArgumentError as exc:
            return ToolResult.error(f"bash: {exc}")
        decision = self.approval.decide(self.name, args, ctx)
        if isinstance(decision, ToolResult):
            return decision
        try:
            cwd = await anyio.to_thread.run_sync(self.workspace.resolve_dir, workdir)
        except ValueError as exc:
            return ToolResult.error(f"bash: workdir: {exc}")
        if decision.needs_preview:
            stop = decision.check(self.name, args, _preview(command, cwd))
            if stop is not None:
                return stop

        capture = _Capture(self.max_output)
        collector = _Collector(capture)
        # Shielded so that a cancellation cannot land between the fork and the moment we hold
        # the handle we need to kill the tree.
        with anyio.CancelScope(shield=True):
            try:
                transport, _ = await asyncio.get_running_loop().subprocess_exec(
                    lambda: collector,
                    self._shell,
                    "-c",
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    start_new_session=True,
                    preexec_fn=preexec_fn(),
                )
            except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the command
                return ToolResult.error(f"bash: could not start {self._shell}: {exc}")
            pipe = _output_pipe(transport)

        exited = stray_output = False
        try:
            with anyio.move_on_after(timeout_ms / 1000):
                await collector.exited.wait()
                exited = True
                # Output still open after the shell ended belongs to a background child;
                # waiting for it would stall the call until the timeout.
                with anyio.move_on_after(_LINGER_S):
                    await collector.output_closed.wait()
        finally:
            stray_output = exited and not collector.output_closed.is_set()
            if not exited or stray_output:
                await _end_tree(transport.get_pid(), pipe, collector)
            transport.close()

        text = capture.text()
        code = transport.get_returncode()
        meta: dict[str, Any] = {"exit_code": code, "truncated": capture.truncated}
        if not exited:
            meta["timed_out"] = True
            limit = int(timeout_ms) if timeout_ms.is_integer() else timeout_ms
            return ToolResult.error(
                f"bash: command timed out after {limit} ms; its process tree was "
                f"killed\n{text}".rstrip(),
                meta,
            )
        if stray_output:
            meta["killed_background"] = True
            text += (
                "\n(background processes that kept this output open after the command ended "
                "were killed; redirect their output, e.g. '> log 2>&1', to keep them running)"
            )
        assert code is not None
        if code < 0:
            try:
                what = signal.Signals(-code).name
            except ValueError:
                what = f"signal {-code}"
            return ToolResult.error(f"bash: command was killed by {what}\n{text}".rstrip(), meta)
        if code != 0:
            return ToolResult.error(
                f"bash: command failed with exit code {code}\n{text}".rstrip(), meta
            )
        return ToolResult.ok(text if text else "(no output)", meta)
