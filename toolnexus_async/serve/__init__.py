"""The approval inbox web service: runs started over HTTP park until a person answers.

Rule of this package: it is a host built only on the public runtime (``LlmClient.stream``,
``Inbox``, ``RunStore``); ``toolnexus-async serve`` runs :func:`serve_demo_app`, and
``docs/serve.md`` describes the HTTP API, the event stream and restart behaviour.

- :func:`create_app` builds the aiohttp application from a client factory, a toolkit and
  a run store;
- :func:`serve_demo_app` builds it on the embedded demo model and tools and a SQLite file.
"""

from ._app import MakeClient, create_app
from ._demo import demo_client, serve_demo_app, serve_demo_model, serve_demo_tools
from ._runs import ServeInbox

__all__ = (
    "create_app",
    "serve_demo_app",
    "MakeClient",
    "ServeInbox",
    "demo_client",
    "serve_demo_model",
    "serve_demo_tools",
)
