"""The demo behind ``toolnexus-async serve``: its model, its tools, and the app built on them.

Kept out of :mod:`toolnexus_async.serve`'s namespace, which is the service itself: these
build the embedded example (a scripted model and tools that ask for a login, a question and
an approval) that the command runs on its defaults and the docs and tests use.

- :func:`serve_demo_app` builds the app on the demo model and tools and a store;
- :func:`demo_client`, :func:`serve_demo_model` and :func:`serve_demo_tools` are its parts.
"""

from ._demo import demo_client, serve_demo_app, serve_demo_model, serve_demo_tools

__all__ = ("demo_client", "serve_demo_app", "serve_demo_model", "serve_demo_tools")
