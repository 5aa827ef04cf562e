"""``toolnexus-async``: the command line. ``demo`` runs the embedded agent in the terminal,
``serve`` the approval inbox.

Rule of this module: the arguments and what they start. The demo's terminal side is
``_cli_demo.py`` (its model and tools ``_demo.py``). ``serve`` picks the token
(``--token``, ``TOOLNEXUS_TOKEN``, or a new one, printed in the URL to open) and hands
everything else to ``toolnexus_async.serve``.
"""

from __future__ import annotations

import argparse
import errno
import functools
import ipaddress
import math
import os
import sys
from collections.abc import Sequence

import anyio

from ._cli_demo import run_demo
from ._core.errors import StoreError, UsageError
from ._core.secrets import redact_url
from ._core.version import __version__
from ._demo import DEMO_PROMPT
from ._engine.client import LlmClient
from ._engine.tracing import Tracing, require_otel

# ``serve --store``: a SQLite file by default; the variable keeps a DSN's password off the
# command line.
STORE_ENV = "TOOLNEXUS_STORE"
DEFAULT_STORE = "toolnexus-runs.sqlite"


def run_serve(args: argparse.Namespace) -> int:
    """``toolnexus-async serve``: the approval inbox on the demo model or a real endpoint."""
    from .serve import TOKEN_ENV, ServeInbox, new_token, open_store, run_server
    from .serve._server import serve_logging
    from .serve.demo import serve_demo_app

    style = args.style or "openai"
    url_env = "ANTHROPIC_BASE_URL" if style == "anthropic" else "OPENAI_BASE_URL"
    base_url = args.base_url or os.environ.get(url_env)
    model = args.model or os.environ.get("TOOLNEXUS_MODEL")
    if not base_url and (args.style or args.model):
        # Asked for a provider but not told where: the demo would look like it answered.
        asked = f"--style {args.style}" if args.style else f"--model {args.model}"
        print(
            f"toolnexus-async serve: {asked} needs --base-url (or {url_env}), the endpoint "
            f"to talk to; leave out --style and --model to run the demo model",
            file=sys.stderr,
        )
        return 2
    if args.trace_content and not args.tracing:
        print("toolnexus-async serve: --trace-content needs --tracing", file=sys.stderr)
        return 2
    tracing = None
    if args.tracing:
        try:
            require_otel("--tracing")
        except UsageError as exc:
            print(f"toolnexus-async serve: {exc}", file=sys.stderr)
            return 2
        # The global tracer provider: opentelemetry-instrument's, or the one the program
        # wrapping this set up; without one, the API's no-op provider.
        tracing = Tracing(capture_content=True if args.trace_content else None)
    make_client = None
    if base_url:
        if not model:
            print("--model (or TOOLNEXUS_MODEL) is needed with --base-url", file=sys.stderr)
            return 2

        def make_client(inbox: ServeInbox) -> LlmClient:
            return LlmClient(base_url, style=style, model=model, wait_for=inbox, tracing=tracing)

    if not 0 <= args.port <= 65535:
        print(f"toolnexus-async serve: --port must be 0 to 65535, got {args.port}", file=sys.stderr)
        return 2
    if not 0 <= args.grace < math.inf:
        print(
            f"toolnexus-async serve: --grace must be 0 or more seconds, got {args.grace}",
            file=sys.stderr,
        )
        return 2
    if not 0 < args.store_timeout < math.inf:
        print(
            "toolnexus-async serve: --store-timeout must be more than 0 seconds, got "
            f"{args.store_timeout}",
            file=sys.stderr,
        )
        return 2
    if args.max_active_runs < 1:
        print(
            "toolnexus-async serve: --max-active-runs must be 1 or more, got "
            f"{args.max_active_runs}",
            file=sys.stderr,
        )
        return 2
    if args.insecure_no_auth and args.token:
        print("--token and --insecure-no-auth do not go together", file=sys.stderr)
        return 2
    given = None if args.insecure_no_auth else (args.token or os.environ.get(TOKEN_ENV) or None)
    token = None if args.insecure_no_auth else (given or new_token())
    allowed = list(args.allowed_host)
    if args.host and not _is_ip(args.host):
        allowed.append(args.host)  # the name it listens on is one it answers to
    where = args.store or os.environ.get(STORE_ENV) or DEFAULT_STORE
    try:
        store = open_store(where, timeout=args.store_timeout)
        app = serve_demo_app(
            store,
            make_client=make_client,
            park_timeout=args.park_timeout,
            token=token,
            insecure_no_auth=args.insecure_no_auth,
            allowed_hosts=allowed,
            lease=args.lease,
            mcp=args.mcp,
            skills=args.skills or None,
            freeze_gc=args.freeze_gc,
            grace=args.grace,
            store_timeout=args.store_timeout,
            max_active_runs=args.max_active_runs,
            tracing=None if make_client is not None else tracing,
        )
    except UsageError as exc:
        print(f"toolnexus-async serve: {exc}", file=sys.stderr)
        return 2
    # A base URL may carry credentials (https://user:key@proxy/v1): shown without them.
    which = f"{style} model {model} at {redact_url(base_url)}" if base_url else "the demo model"
    kept = getattr(store, "where", where)  # a DSN's password is never printed
    print(f"toolnexus-async serve: {which}; every run kept in {kept}", flush=True)

    def ready(url: str) -> None:
        if token is None:
            print(
                "WARNING: --insecure-no-auth: no token is checked, so anyone who can reach "
                f"{url} can start runs and answer every request (approve payments). "
                "The host and origin checks and the security headers stay on.",
                flush=True,
            )
            print(f"Open the inbox: {url}/", flush=True)
        elif given is None:
            print(f"Open the inbox: {url}/?token={token}", flush=True)
        else:  # whoever gave the token knows it: it is not echoed into a log
            print(
                f"Open the inbox: {url}/?token=<the token from --token or {TOKEN_ENV}>", flush=True
            )
        print("API clients send: Authorization: Bearer <token>. Ctrl-C stops.", flush=True)

    # Open requests and busy runs share the grace, so that the whole stop fits in it.
    serving = functools.partial(
        run_server,
        app,
        host=args.host,
        port=args.port,
        on_ready=ready,
        shutdown_timeout=args.grace,
    )
    try:
        with serve_logging(sys.stderr, access=not args.quiet, fmt=args.log_format):
            anyio.run(serving)
    except OSError as exc:
        print(f"toolnexus-async serve: {_bind_failure(exc, args.host, args.port)}", file=sys.stderr)
        return 1
    except StoreError as exc:  # at startup: the store is down, or not one this can use
        print(f"toolnexus-async serve: {exc}", file=sys.stderr)
        return 1
    return 0


def _bind_failure(exc: OSError, host: str, port: int) -> str:
    """One line for a server that could not listen: a taken port says how to pick another."""
    taken = exc.errno == errno.EADDRINUSE or "address already in use" in str(exc).lower()
    if not taken:
        return str(exc)
    return (
        f"port {port} on {host} is already taken (another server is listening there); "
        f"pick another with --port, e.g. --port {port + 1 if port < 65535 else 8081}, "
        f"or --port 0 for any free one"
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="toolnexus-async",
        description="An asyncio agent runtime in which a tool can stop to ask a human.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="run an agent on the embedded model: it asks you for input and an approval",
    )
    demo.add_argument(
        "--yes", action="store_true", help="answer every request for you (scripts, CI)"
    )
    demo.add_argument("--prompt", default=DEMO_PROMPT, help="what to ask the agent")
    serve = commands.add_parser(
        "serve",
        help="the approval inbox: start runs over HTTP, answer them from a web page",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    serve.add_argument(
        "--store",
        help="where every run is kept as it goes: a SQLite file (default "
        "./toolnexus-runs.sqlite), or a postgresql:// URL of a database that several "
        f"servers share as one inbox (needs the postgres extra; default ${STORE_ENV}; prefer "
        "the variable for a URL with a password, as other users can see command lines)",
    )
    serve.add_argument(
        "--park-timeout",
        type=float,
        default=300.0,
        help="seconds a run waits in memory for an answer before it lets go of it (it stays "
        "in the store, and its answer resumes it; default 300)",
    )
    serve.add_argument(
        "--lease",
        type=float,
        default=30.0,
        help="seconds a run this server holds may go unrenewed before another server on the "
        "store, or this one restarted, takes it over (default 30)",
    )
    serve.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, how long runs busy in a tool (or waiting for the model) "
        "get to reach their next question or finish before they are cut and left to the "
        "next server on the store (default 30, Kubernetes' terminationGracePeriodSeconds)",
    )
    serve.add_argument(
        "--store-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long one store call may take, a held lock included, before it counts as "
        "the store being unavailable (503 with Retry-After until it is back; default 10)",
    )
    serve.add_argument(
        "--max-active-runs",
        type=int,
        default=10_000,
        metavar="N",
        help="the most runs started on this server that may be running or waiting in "
        "memory at once (about 9 to 15 KiB each); beyond it POST /runs answers 429 with "
        "Retry-After (default 10000)",
    )
    serve.add_argument(
        "--base-url", help="an OpenAI- or Anthropic-style endpoint instead of the demo model"
    )
    serve.add_argument(
        "--style",
        choices=("openai", "anthropic"),
        help="the API style of --base-url (default openai); needs --base-url",
    )
    serve.add_argument("--model", help="the model name at --base-url")
    serve.add_argument(
        "--mcp",
        metavar="FILE",
        help="an mcpServers JSON config: the tools of those MCP servers join every run, and "
        "their questions are requests on the page (needs the mcp extra; docs/mcp.md)",
    )
    serve.add_argument(
        "--skills",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder to search for Agent Skills (SKILL.md files): each skill's name and "
        "description join every run's instructions, and the model loads a skill with the "
        "skill tool (docs/skills.md); repeatable",
    )
    serve.add_argument(
        "--token",
        help="the token every request must carry (default: $TOOLNEXUS_TOKEN, else a new "
        "random one, printed in the URL to open); prefer the variable, as other users "
        "of this machine can see command lines",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the server answers to besides localhost and IP addresses "
        "(a reverse proxy's, say); repeatable",
    )
    serve.add_argument(
        "--freeze-gc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep parked runs out of Python's full garbage collections (a GcFreezer), so "
        "that many parked runs do not stop the server for one (the default; "
        "--no-freeze-gc leaves the collector alone); see docs/serve.md",
    )
    serve.add_argument(
        "--quiet",
        action="store_true",
        help="no access log: without it, each request is one line on stderr (client, "
        "method, path without its query, status, size, time; never a token)",
    )
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="the log on stderr: text lines (the default) or one JSON object per line (time, "
        "level, logger, message, and run_id, exception, trace_id and span_id when they "
        "apply), for a service's log pipeline",
    )
    serve.add_argument(
        "--tracing",
        action="store_true",
        help="make OpenTelemetry spans of every run, model request, tool call and wait for "
        "a person, sent to the global tracer provider (run under opentelemetry-instrument, "
        "or set one up with the SDK); needs the otel extra; docs/observability.md",
    )
    serve.add_argument(
        "--trace-content",
        action="store_true",
        help="with --tracing: put message contents on the spans (prompts, replies, tool "
        "arguments and results, what a person is asked); without it, as "
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT says (off by default)",
    )
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="check no token (tests, experiments on this machine only): anyone who can "
        "reach the port can approve requests",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return run_serve(args)
        return anyio.run(lambda: run_demo(assume_yes=args.yes, prompt=args.prompt))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
