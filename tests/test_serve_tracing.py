"""``serve`` turns tracing on: ``toolnexus-async serve --tracing`` (and ``serve_demo_app(
tracing=...)``) makes the spans of every run it drives, to the global tracer provider.

The command runs in a child process (the global provider is process-wide state): a small
wrapper sets an SDK provider with an in-memory exporter as the global one, as
``opentelemetry-instrument`` or a program's own setup would, then runs the command; on its
stop it writes the spans it holds to a file. Where OpenTelemetry is not installed, the flag
is refused at once, in one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from yarl import URL

from tests.test_cli import Served
from tests.test_serve_api import TOKEN, Events, events, post, serving
from toolnexus_async import Tracing, UsageError
from toolnexus_async.durable import MemoryRunStore
from toolnexus_async.serve import TOKEN_ENV
from toolnexus_async.serve.demo import demo_client, serve_demo_app

LIMIT = 60  # a fresh interpreter imports aiohttp and OpenTelemetry
ROOT = str(Path(__file__).resolve().parents[1])

# The global provider first, then the command, then what it exported, to argv[1].
WRAPPER = """
import json, sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from toolnexus_async._cli import main

code = main(sys.argv[2:])
spans = [
    {
        "name": s.name,
        "trace_id": s.context.trace_id,
        "span_id": s.context.span_id,
        "parent": s.parent.span_id if s.parent else None,
        "attributes": dict(s.attributes),
    }
    for s in exporter.get_finished_spans()
]
with open(sys.argv[1], "w") as out:
    json.dump(spans, out)
sys.exit(code)
"""

# Imports of OpenTelemetry fail, as where it is not installed.
NO_OTEL = """
import sys


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, NotInstalled())
from toolnexus_async._cli import main

sys.exit(main(sys.argv[1:]))
"""


def env() -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return {**kept, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}


def demo_run(answers: list[dict[str, Any]]) -> Any:
    """A coroutine function: start a demo run over ``http``, answer its requests in turn
    with ``answers`` as they come on /events, and return its run id and ``done`` event."""

    async def run(http: Any, stream: Any) -> tuple[str, dict[str, Any]]:
        status, started = await post(http, "/runs", {"prompt": "Dinner at Sakura"})
        assert status == 202
        run_id = started["id"]
        for body in answers:
            pending = await stream.until("pending", run_id=run_id)
            request_id = pending["request"]["id"]
            assert (await post(http, f"/requests/{request_id}/answer", body))[0] == 200
        return run_id, await stream.until("done", run_id=run_id)

    return run


def check_spans(spans: list[dict[str, Any]], run_id: str, content: bool) -> None:
    (run,) = [s for s in spans if s["name"] == "invoke_agent"]
    assert run["attributes"]["toolnexus.run.id"] == run_id
    assert run["attributes"]["toolnexus.run.status"] == "done"
    (wait,) = [s for s in spans if s["name"] == "wait authorization"]
    assert wait["attributes"]["toolnexus.wait.outcome"] == "declined"
    assert wait["attributes"]["toolnexus.tool.name"] == "check_login"
    chats = [s for s in spans if s["name"] == "chat serve-demo"]
    assert len(chats) == 2
    assert {s["parent"] for s in spans if s is not run} == {run["span_id"]}
    assert {s["trace_id"] for s in spans} == {run["trace_id"]}
    captured = "gen_ai.input.messages" in chats[0]["attributes"]
    assert captured is content
    assert TOKEN not in json.dumps(spans)


@pytest.mark.parametrize("flags", [["--tracing"], ["--tracing", "--trace-content"]])
async def test_serve_with_tracing_sends_its_runs_spans_to_the_global_provider(
    tmp_path: Path, flags: list[str]
) -> None:
    (tmp_path / "wrapper.py").write_text(WRAPPER)
    dump = tmp_path / "spans.json"
    command = [sys.executable, str(tmp_path / "wrapper.py"), str(dump), "serve", "--port", "0"]
    command += ["--store", str(tmp_path / "runs.sqlite"), "--quiet", *flags]
    with anyio.fail_after(LIMIT):
        async with await anyio.open_process(command, env=env()) as process:
            served = Served(process)
            line = await served.line_with("Open the inbox: ")
            url = URL(line.removeprefix("Open the inbox: "))
            token = url.query["token"]
            base = str(url.with_query(None).with_path(""))
            auth = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(base, headers=auth) as http:
                async with http.get("/events") as response:
                    run_id, done = await demo_run([{"ok": False}])(http, Events(response))
            assert done["status"] == "done"
            code, _, err = await served.stop(signal.SIGTERM)
    assert code == 0, err
    spans = json.loads(dump.read_text())
    check_spans(spans, run_id, content="--trace-content" in flags)
    assert token not in json.dumps(spans)


async def test_serve_demo_app_traces_its_runs_with_tracing() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = serve_demo_app(MemoryRunStore(), token=TOKEN, tracing=Tracing(tracer_provider=provider))
    with anyio.fail_after(LIMIT):
        async with serving(app) as http, events(http) as stream:
            run_id, done = await demo_run([{"ok": False}])(http, stream)
    assert done["status"] == "done"
    spans = [
        {
            "name": s.name,
            "trace_id": s.context.trace_id,
            "span_id": s.context.span_id,
            "parent": s.parent.span_id if s.parent else None,
            "attributes": dict(s.attributes or {}),
        }
        for s in exporter.get_finished_spans()
    ]
    check_spans(spans, run_id, content=False)
    provider.shutdown()


def test_serve_demo_app_refuses_tracing_it_cannot_apply() -> None:
    with pytest.raises(UsageError, match="build your LlmClient with tracing= instead"):
        serve_demo_app(MemoryRunStore(), make_client=demo_client, tracing=Tracing())
    with pytest.raises(UsageError, match="tracing must be a Tracing, got bool"):
        serve_demo_app(MemoryRunStore(), tracing=True)  # type: ignore[arg-type]


def test_serve_tracing_without_opentelemetry_is_refused_in_one_line(tmp_path: Path) -> None:
    store = str(tmp_path / "runs.sqlite")
    done = subprocess.run(
        [sys.executable, "-c", NO_OTEL, "serve", "--port", "0", "--store", store, "--tracing"],
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
        env=env(),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "toolnexus-async serve: --tracing needs OpenTelemetry's API (No module named"
    )
    assert "pip install -e '.[otel]'" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert not Path(store).exists()  # refused before anything was opened


def test_trace_content_needs_tracing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from toolnexus_async._cli import main

    store = str(tmp_path / "runs.sqlite")
    assert main(["serve", "--port", "0", "--store", store, "--trace-content"]) == 2
    assert capsys.readouterr().err == "toolnexus-async serve: --trace-content needs --tracing\n"
