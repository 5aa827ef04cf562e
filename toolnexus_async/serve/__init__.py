"""The approval inbox web service: runs started over HTTP park until a person answers.

Rule of this package: it is a host built only on the public runtime (``LlmClient.stream``,
``Inbox``, ``RunStore``); ``toolnexus-async serve`` runs the demo app
(:mod:`toolnexus_async.serve.demo`) with :func:`run_server`, and ``docs/serve.md``
describes the HTTP API, the event stream, the lock (token, hosts, origins, headers,
timeouts) and restart behaviour.

- :func:`create_app` builds the aiohttp application from a client factory, a toolkit and
  a run store, locked with a token; :class:`InlineQuestions` brings older MCP servers'
  inline questions to its page;
- :func:`open_store` opens the run store a path or a PostgreSQL DSN names (several
  servers may share a database); the demo app of ``toolnexus-async serve`` is in
  :mod:`toolnexus_async.serve.demo`;
- :class:`ServeRunner` and :func:`run_server` serve it with deadlines on every connection
  and an access log that never shows a token.

The app also speaks AG-UI and the AI SDK's UI message stream to front-ends
(``POST /ag-ui``, ``POST /ai-sdk/chat``; docs/ui-protocols.md), and
:mod:`toolnexus_async.serve.asgi` offers the same endpoints as an ASGI application for a
FastAPI or Starlette service (the ``asgi`` extra; it is not imported here, so serve does
not need Starlette).
"""

from ._app import MakeClient, create_app
from ._demo import open_store
from ._guard import TOKEN_ENV
from ._inline import InlineQuestions
from ._runs import ServeInbox
from ._server import NoQueryAccessLogger, ServeRunner, run_server
from ._sessions import new_token

__all__ = (
    "create_app",
    "open_store",
    "MakeClient",
    "ServeInbox",
    "InlineQuestions",
    "TOKEN_ENV",
    "new_token",
    "ServeRunner",
    "NoQueryAccessLogger",
    "run_server",
)
