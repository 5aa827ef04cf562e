"""A web service whose handlers await agent runs, and whose people answer them over HTTP.

    python examples/web_service.py [--port 8081]

- ``POST /runs`` with ``{"prompt": "refund order A17"}`` runs the agent and replies with
  the result when the run ends (the handler simply awaits it).
- ``GET /requests/next`` replies with the first request waiting for a person, waiting for
  one if there is none yet; it names the run the request belongs to.
- ``POST /requests/{id}`` with ``{"ok": true}`` (or ``false``) answers it.

No key is needed: the model is the stand-in of ``_refund.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from aiohttp import web

from _refund import model, refund
from toolnexus_async import Answer, AnswerError, Inbox, LlmClient, Toolkit

INBOX = web.AppKey("inbox", Inbox)
CLIENT = web.AppKey("client", LlmClient)
TOOLKIT = web.AppKey("toolkit", Toolkit)


async def start_run(request: web.Request) -> web.Response:
    body = await request.json()
    # The run parks on the inbox while it waits for a person: this handler just awaits,
    # holding no thread, so thousands of such requests can be open at once.
    result = await request.app[CLIENT].run(str(body["prompt"]), request.app[TOOLKIT])
    return web.json_response(
        {"run_id": result.run_id, "status": result.status, "text": result.text}
    )


async def next_request(request: web.Request) -> web.Response:
    inbox = request.app[INBOX]
    arrivals = inbox.requests()
    async with contextlib.aclosing(arrivals):
        # No await between looking at what is parked and subscribing to what parks next,
        # so a request that arrives in between cannot be missed.
        waiting = inbox.pending()
        parked = waiting[0] if waiting else await anext(arrivals)
    return web.json_response({**parked.to_dict(), "run_id": inbox.run_of(parked.id)})


async def answer(request: web.Request) -> web.Response:
    request_id = request.match_info["id"]
    try:
        body = await request.json()
        await request.app[INBOX].answer(Answer.from_dict({**body, "id": request_id}))
    except ValueError as error:  # not JSON, or not an answer (PayloadError)
        return web.json_response({"error": str(error)}, status=422)
    except AnswerError as error:  # unknown, already answered or expired
        return web.json_response({"error": str(error)}, status=409)
    return web.json_response({"answered": request_id})


async def serve(port: int) -> None:
    inbox = Inbox()
    async with (
        Toolkit.create(builtins=False, extra_tools=[refund]) as toolkit,
        LlmClient.in_process(model, wait_for=inbox) as client,
    ):
        app = web.Application()
        app[INBOX], app[CLIENT], app[TOOLKIT] = inbox, client, toolkit
        app.router.add_post("/runs", start_run)
        app.router.add_get("/requests/next", next_request)
        app.router.add_post("/requests/{id}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", port)
            await site.start()
            host, bound = runner.addresses[0][:2]
            print(f"listening on http://{host}:{bound}", flush=True)
            await asyncio.Event().wait()  # serve until interrupted
        finally:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description="a web service that answers agent runs")
    parser.add_argument("--port", type=int, default=8081, help="0 picks a free port")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
