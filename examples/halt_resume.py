"""Halt a run in one process and finish it in another, days later if need be.

    python examples/halt_resume.py start runs.db "refund order A17"
    python examples/halt_resume.py answer runs.db REQUEST_ID yes

``start`` runs with no ``wait_for``: when the tool asks for approval the run halts
(``status == "pending"``), is kept in the SQLite file, and the process exits. ``answer``
(any process, any time later) gives the answer to the stored run, which goes on from where
it stopped and finishes; the file keeps the outcome. Nobody is asked twice: a second answer
to the same request is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio

from _refund import model, refund
from toolnexus_async import Answer, LlmClient, Toolkit
from toolnexus_async.durable import SqliteRunStore, resume_stored


async def start(db: Path, prompt: str) -> None:
    async with (
        SqliteRunStore(db) as store,
        Toolkit.create(builtins=False, extra_tools=[refund]) as toolkit,
        LlmClient.in_process(model) as client,  # no wait_for: a suspension halts the run
    ):
        halted = await client.run(prompt, toolkit)
        assert halted.pending is not None, halted.status
        await store.save(halted)
    print(f"run {halted.run_id} waits for request {halted.pending.id}: {halted.pending.prompt}")


async def answer(db: Path, request_id: str, reply: str) -> None:
    async with (
        SqliteRunStore(db) as store,
        Toolkit.create(builtins=False, extra_tools=[refund]) as toolkit,
        LlmClient.in_process(model) as client,
    ):
        # The store knows which run waits on the request; the run goes on from its state
        # as kept, and every step is kept again as it happens.
        done = await resume_stored(client, toolkit, store, Answer(request_id, ok=reply == "yes"))
    print(f"run {done.run_id}: {done.status}: {done.text}")


def main() -> None:
    parser = argparse.ArgumentParser(description="halt a run, resume it in another process")
    commands = parser.add_subparsers(dest="command", required=True)
    begin = commands.add_parser("start", help="run until the run asks; keep it in DB")
    begin.add_argument("db", type=Path)
    begin.add_argument("prompt")
    reply = commands.add_parser("answer", help="answer a stored run's request")
    reply.add_argument("db", type=Path)
    reply.add_argument("request_id")
    reply.add_argument("reply", choices=["yes", "no"])
    args = parser.parse_args()
    if args.command == "start":
        anyio.run(start, args.db, args.prompt)
    else:
        anyio.run(answer, args.db, args.request_id, args.reply)


if __name__ == "__main__":
    main()
