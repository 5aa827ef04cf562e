"""The mock OpenAI-style provider of the benchmarks, in a process of its own.

Not a benchmark itself: ``overhead.py`` and ``_park_http.py`` (``park.py --model http``)
import it. It serves two scenarios on one port:

- ``/v1/chat/completions``, ``overhead.py``'s: turn 1 asks for ``get_weather(city)`` and
  ``add(a, b)``, turn 2 answers with a text built from the tool results;
- ``/park/v1/chat/completions``, ``park.py --model http``'s: the one-approval scenario of
  ``_common.approval_model`` (turn 1 calls ``pay_invoice`` with the number in the prompt,
  turn 2 reports the tool's result), the same replies over HTTP, streamed when the
  request asks (``serve`` streams its runs);
- ``/pay/{invoice}``, ``gc_soak.py``'s payment API: a POST is one payment, counted (the
  pipe's ``"paid"`` question reads the count), and answered ``invoice <n> paid``.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing.connection
import time

from _common import ChildServer, invoice_of, serve_over_pipe
from aiohttp import web

__all__ = ("API_KEY", "MODEL", "MockServer")

MODEL = "bench-model"
API_KEY = "sk-bench-not-a-secret"


# The overhead scenario.
#
# It runs in its own *process* (``_common.ChildServer``), not in a thread, so that the
# requests it parses and answers do not steal the measured event loop's GIL in proportion
# to the request rate and blur the very overhead this file measures. Its own cost still
# shows up in every run's wall time, alike for both contenders; it is kept small (no access
# log, canned replies) and its CPU use is printed for the throughput part, so a saturated
# mock would be visible.

LATENCY_KEY = web.AppKey("latency_s", float)

_TOOL_CALLS_REPLY = json.dumps(
    {
        "id": "chatcmpl-bench-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_weather",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": json.dumps({"city": "Paris"}),
                            },
                        },
                        {
                            "id": "call_add",
                            "type": "function",
                            "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})},
                        },
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 60, "completion_tokens": 30, "total_tokens": 90},
    },
    separators=(",", ":"),
).encode()


def _final_reply(text: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bench-2",
            "object": "chat.completion",
            "created": 1700000000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "usage": {"prompt_tokens": 110, "completion_tokens": 12, "total_tokens": 122},
        },
        separators=(",", ":"),
    ).encode()


async def _chat_completions(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    outputs = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    latency = request.app[LATENCY_KEY]
    if latency > 0:
        await asyncio.sleep(latency)  # the model "thinking": simulated provider latency
    reply = _final_reply(" | ".join(outputs)) if outputs else _TOOL_CALLS_REPLY
    return web.Response(body=reply, content_type="application/json")


# The one-approval scenario of park.py --model http. Each reply is built per request (the
# invoice number is in it), compact, with no latency: the client's cost is what is measured.


def _completion(message: dict[str, object], finish: str) -> bytes:
    reply = {
        "id": "chatcmpl-park",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50},
    }
    return json.dumps(reply, separators=(",", ":")).encode()


def _chunk(choices: list[dict[str, object]], usage: dict[str, int] | None = None) -> bytes:
    chunk: dict[str, object] = {
        "id": "chatcmpl-park",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def _streamed(message: dict[str, object], finish: str) -> bytes:
    """The same reply as server-sent events, as ``stream: true`` asks (``serve`` streams):
    the whole message in one delta, the finish reason, the usage chunk, ``[DONE]``."""
    delta = dict(message)
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    return b"".join(
        (
            _chunk([{"index": 0, "delta": delta, "finish_reason": None}]),
            _chunk([{"index": 0, "delta": {}, "finish_reason": finish}]),
            _chunk([], {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50}),
            b"data: [DONE]\n\n",
        )
    )


async def _park_completions(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    last = body["messages"][-1]
    message: dict[str, object]
    if last["role"] == "tool":
        message, finish = {"role": "assistant", "content": f"Done: {last['content']}."}, "stop"
    else:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {
                "name": "pay_invoice",
                "arguments": json.dumps({"invoice": invoice_of(last["content"])}),
            },
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    if body.get("stream"):
        return web.Response(body=_streamed(message, finish), content_type="text/event-stream")
    return web.Response(body=_completion(message, finish), content_type="application/json")


PAID = web.AppKey("paid", list)


async def _pay(request: web.Request) -> web.Response:
    await request.read()
    request.app[PAID][0] += 1
    return web.Response(text=f"invoice {request.match_info['invoice']} paid")


async def _serve(conn: multiprocessing.connection.Connection, latency_s: float) -> None:
    app = web.Application()
    app[LATENCY_KEY] = latency_s
    app[PAID] = [0]
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/park/v1/chat/completions", _park_completions)
    app.router.add_post("/pay/{invoice}", _pay)

    def reply(message: str) -> float:
        # "cpu": CPU seconds so far; "paid": payments made so far
        return float(app[PAID][0]) if message == "paid" else time.process_time()

    await serve_over_pipe(conn, app, reply)


def _server_main(conn: multiprocessing.connection.Connection, latency_s: float) -> None:
    asyncio.run(_serve(conn, latency_s))


class MockServer(ChildServer):
    """The mock provider in a child process; a context manager that starts and stops it."""

    def __init__(self, latency_ms: float) -> None:
        super().__init__("mock server", _server_main, latency_ms / 1000)
        self.latency_ms = latency_ms

    @property
    def base_url(self) -> str:
        """The overhead scenario's base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def park_url(self) -> str:
        """The one-approval scenario's base URL."""
        return f"http://127.0.0.1:{self.port}/park/v1"

    @property
    def pay_url(self) -> str:
        """The payment API's URL template (``{invoice}`` is the invoice number)."""
        return f"http://127.0.0.1:{self.port}/pay/{{invoice}}"

    def paid(self) -> int:
        """Payments made so far (``/pay`` POSTs answered)."""
        return int(self.ask("paid"))

    def cpu_seconds(self) -> float:
        """CPU time the mock process has used so far (asked between measurements only)."""
        seconds: float = self.ask("cpu")
        return seconds
