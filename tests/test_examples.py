"""Each script in examples/ runs as a user would start it, in its own process, on
127.0.0.1 only and within a time bound; what it prints (or serves) is checked."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LIMIT = 60  # seconds any one step may take before the test fails


def run_example(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    return done.stdout


def call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(url, data=data, timeout=LIMIT) as reply:
        return json.loads(reply.read())


def test_queue_bot_answers_every_run_from_the_chat():
    out = run_example("queue_bot.py")
    assert "run A17: done: Done: refunded order A17" in out
    assert "run B42: done: Done: refunded order B42" in out
    assert 2 == out.count("bot: Refund order")  # each request posted once


def test_queue_bot_declined():
    out = run_example("queue_bot.py", "--decline")
    assert "refunded" not in out


def test_halt_in_one_process_resume_in_another(tmp_path):
    db = tmp_path / "runs.db"
    halted = run_example("halt_resume.py", "start", str(db), "refund order A17")
    assert "waits for request" in halted
    run_id = halted.split()[1]
    request_id = halted.split()[5].rstrip(":")
    done = run_example("halt_resume.py", "answer", str(db), request_id, "yes")
    assert f"run {run_id}: done: Done: refunded order A17" in done
    again = subprocess.run(
        [sys.executable, str(EXAMPLES / "halt_resume.py"), "answer", str(db), request_id, "no"],
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )
    assert 0 != again.returncode
    assert "AlreadyAnsweredError" in again.stderr  # nobody is asked twice


def test_web_service_runs_and_answers_over_http():
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "web_service.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # printed once the port is bound
        assert line.startswith("listening on http://127.0.0.1:"), server.stderr
        url = line.split()[-1]
        with ThreadPoolExecutor(1) as pool:
            # The POST returns only when the run ends, so it waits in a thread.
            run = pool.submit(call, f"{url}/runs", {"prompt": "refund order A17"})
            request = call(f"{url}/requests/next")  # waits until the run parks
            assert request["prompt"] == "Refund order A17?"
            assert call(f"{url}/requests/{request['id']}", {"ok": True}) == {
                "answered": request["id"]
            }
            result = run.result(timeout=LIMIT)
        assert result == {
            "run_id": request["run_id"],
            "status": "done",
            "text": "Done: refunded order A17",
        }
    finally:
        server.terminate()
        server.communicate(timeout=LIMIT)
