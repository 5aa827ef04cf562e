"""The approval inbox web service: runs started over HTTP park until a person answers.

Rule of this package: it is a host built only on the public runtime (``LlmClient.stream``,
``Inbox``, ``RunStore``); ``toolnexus-async serve`` runs :func:`serve_demo_app` with
:func:`run_server`, and ``docs/serve.md`` describes the HTTP API, the event stream, the
lock (token, hosts, origins, headers, timeouts) and restart behaviour.

- :func:`create_app` builds the aiohttp application from a client factory, a toolkit and
  a run store, locked with a token;
- :func:`serve_demo_app` builds it on the embedded demo model and tools and a SQLite file
  (or a PostgreSQL database shared by several servers: :func:`open_store`);
- :class:`ServeRunner` and :func:`run_server` serve it with deadlines on every connection
  and an access log that never shows a token.
"""

from ._app import MakeClient, create_app
from ._demo import demo_client, open_store, serve_demo_app, serve_demo_model, serve_demo_tools
from ._guard import TOKEN_ENV, new_token
from ._runs import ServeInbox
from ._server import NoQueryAccessLogger, ServeRunner, run_server

__all__ = (
    "create_app",
    "serve_demo_app",
    "open_store",
    "MakeClient",
    "ServeInbox",
    "demo_client",
    "serve_demo_model",
    "serve_demo_tools",
    "TOKEN_ENV",
    "new_token",
    "ServeRunner",
    "NoQueryAccessLogger",
    "run_server",
)
