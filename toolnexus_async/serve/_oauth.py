"""serve's ``GET /oauth/callback``: where an authorization server sends a person back after
signing in to a remote MCP server (docs/mcp.md, Sign-in).

Rules of this module:

- The route needs no serve token (``_guard`` exempts it, for ``GET`` only): the browser
  arrives from the authorization server, a navigation from another site, which does not
  carry the ``SameSite=Strict`` session cookie. The ``state`` in the query is the
  credential: 256 random bits made for one request, kept in the toolkit's token store, and
  good once (the first code recorded for it wins; the retry that exchanges it removes it).
- The redirect becomes the answer to its request (:func:`toolnexus_async.mcp.sign_in_answer`)
  and is handed to the durable host as ``POST /requests/{id}/answer`` hands its answer
  (``_app.hand_over``, one mapping of refusals for both): the run wakes here or on
  whichever server holds it, or goes on after a restart.
- Outcomes are short pages for a person: 200 signed in; 400 a state no sign-in under way
  has (unknown, or used already); 404 a request no run waits for; 409 a request answered
  or gone already; 503 while the server stops. No page shows the code or the state.
"""

from __future__ import annotations

import html

from aiohttp import web

from .._core.errors import UsageError
from ..mcp import sign_in_answer
from ._bodies import ApiError
from ._state import SERVE, hand_over

__all__ = ("CALLBACK", "oauth_callback")

CALLBACK = "/oauth/callback"


def _page(status: int, title: str, text: str) -> web.Response:
    body = "<!doctype html><meta charset=utf-8><title>{0}</title><h1>{0}</h1><p>{1}</p>".format(
        html.escape(title), html.escape(text)
    )
    return web.Response(
        status=status, text=body, content_type="text/html", headers={"Cache-Control": "no-store"}
    )


async def oauth_callback(request: web.Request) -> web.Response:
    """``GET /oauth/callback?code=...&state=...``: the sign-in's answer to its request."""
    serve = request.app[SERVE]
    try:
        answer = await sign_in_answer(serve.toolkit, str(request.rel_url))
    except UsageError as exc:
        return _page(400, "Sign-in refused", str(exc))
    try:
        await hand_over(serve, answer)
    except ApiError as exc:
        if exc.status == 503:
            return _page(503, "Try again", "the server is shutting down; sign in again later")
        return _page(exc.status, "Sign-in refused", str(exc))
    if not answer.ok:
        return _page(200, "Sign-in declined", "the run is told; you can close this page")
    return _page(200, "Signed in", "the run goes on; you can close this page")
