"""Serving the app: deadlines on every connection, a log without tokens, a graceful stop.

Rules of this module:

- A connection must deliver a complete request head (request line and headers) within
  ``header_timeout`` seconds of opening, or of the first byte of its next request, else it
  is closed. The deadline is fixed when it starts: trickling a byte at a time does not
  move it, so a client that sends half a request line, or nothing, is let go.
- A keep-alive connection idle for ``idle_timeout`` seconds between requests is closed.
- Neither applies while a request is handled, so a long-lived ``GET /events`` (which writes
  a keep-alive comment every 15 s) goes on; a request body has its own deadline
  (``_bodies.BODY_TIMEOUT``). Bytes that arrive while a request is handled (a pipelined
  next request) cannot be told from its body, so that next head falls under the idle
  timeout instead.
- The access log names the path without its query string, which can hold the token (see
  ``_guard``). A malformed request (a bad request line, say) is answered in JSON with the
  security headers and logged without the bytes received, which can hold it too.
- :func:`run_server` serves until SIGINT or SIGTERM (or a ``stop`` event), then shuts the
  app down in the same task, as ``web.run_app`` does: parked runs are saved, nothing is left
  running. The stop is bounded: requests still open get ``shutdown_timeout`` seconds
  (aiohttp's wait for them), and the app's busy runs get its ``grace``, counted from the
  same moment (see ``_app``), so ``serve`` passes ``--grace`` as both and the whole stop
  fits in it. It says so at INFO: one line when the stop begins (naming the signal), one
  when it is over (how long it took), so a log shows why a server went away.

How: aiohttp 3.14 has no header-read timeout, and ``web.run_app`` builds its own runner.
:class:`ServeRunner` is an ``AppRunner`` whose server makes :class:`_Connection` protocols,
a ``RequestHandler`` subclass that keeps the deadline through the asyncio protocol methods
it extends (``connection_made``, ``data_received``, ``connection_lost``) and ends a late
connection with ``force_close()``, as aiohttp's own keep-alive timer does. A request head is
complete when the server's request handler is called; ``BaseRequest.protocol`` names its
connection. The idle timeout is aiohttp's ``keepalive_timeout``. The one hook outside
aiohttp's documented API is ``AppRunner._make_server``, the factory method that every
``BaseRunner`` subclass implements: it runs as before, and its ``web.Server`` is re-created
from the same request handler and factory with this runner's keyword arguments. No private
attribute is read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http import HTTPStatus
from typing import Any, TextIO

import anyio
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from .._core.errors import UsageError
from ._guard import security_headers
from ._logformat import JsonFormatter

__all__ = ("HEADER_TIMEOUT", "IDLE_TIMEOUT", "NoQueryAccessLogger", "ServeRunner", "run_server")

log = logging.getLogger("toolnexus_async.serve")

# Seconds a client has to send a whole request head.
HEADER_TIMEOUT = 10.0
# Seconds a keep-alive connection may sit idle between requests (nginx's default too).
IDLE_TIMEOUT = 75.0


class NoQueryAccessLogger(AbstractAccessLogger):
    """One line per request: client, method, path (without its query), status, size, time."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info(
            '%s "%s %s" %s %s %.3fs',
            request.remote,
            request.method,
            request.rel_url.raw_path,  # still percent-encoded: one line, whatever was sent
            response.status,
            response.body_length,
            time,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


LOG_FORMATS = ("text", "json")


@contextlib.contextmanager
def serve_logging(stream: TextIO, *, access: bool = True, fmt: str = "text") -> Iterator[None]:
    """While the block runs, the log of ``toolnexus-async serve`` goes to ``stream``: one line
    per request (:class:`NoQueryAccessLogger` on ``aiohttp.access``) unless not ``access``,
    this package's INFO and above (the stop, a retried model call, a tool that raised, ...)
    and anything else's WARNING and above. ``fmt``: ``"text"`` (time, level, logger,
    message) or ``"json"`` (one object per line: ``_logformat.JsonFormatter``). The levels
    and handlers are as they were after it."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    loggers = [logging.getLogger("toolnexus_async"), logging.getLogger("aiohttp.access")]
    levels = [logger.level for logger in loggers]
    root = logging.getLogger()
    root.addHandler(handler)
    loggers[0].setLevel(logging.INFO)
    loggers[1].setLevel(logging.INFO if access else logging.WARNING)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


class _Connection(web.RequestHandler):
    """aiohttp's HTTP/1 protocol, with a deadline for each request head."""

    __slots__ = ("_head_deadline", "_head_timeout", "_in_request")

    def __init__(self, manager: web.Server, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._head_timeout = header_timeout
        self._head_deadline: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_deadline()

    def data_received(self, data: bytes) -> None:
        # Bytes between requests open the next head; those during one are its body.
        if data and not self._in_request and self._head_deadline is None:
            self._start_deadline()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def request_started(self) -> None:
        self._in_request = True
        self._cancel_deadline()

    def request_ended(self) -> None:
        self._in_request = False

    def _start_deadline(self) -> None:
        loop = asyncio.get_running_loop()
        self._head_deadline = loop.call_later(self._head_timeout, self._head_late)

    def _cancel_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_late(self) -> None:
        self._head_deadline = None
        if not self._in_request:
            log.debug("closed a connection that sent no request head in %gs", self._head_timeout)
            self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # Unlike aiohttp's own, this does not log the parser's message: it quotes the bytes
        # received, a login URL's token among them.
        if status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
        else:
            log.debug("refused a malformed request from %s (%d)", request.remote, status)
        if request.writer.output_size > 0:
            raise ConnectionError("the response was sent already: no error reply is possible")
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "error"
        response = web.json_response(
            {"error": phrase}, status=status, headers=security_headers(html=False)
        )
        response.force_close()
        return response


class _Server(web.Server):
    """A ``web.Server`` whose connections are :class:`_Connection` and know their requests."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Any],
        *,
        header_timeout: float,
        request_factory: Any,
        handler_cancellation: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            self._tracked,
            request_factory=request_factory,
            handler_cancellation=handler_cancellation,
        )
        self._app_handler = handler
        self._header_timeout = header_timeout
        self._connection_kwargs = kwargs

    def __call__(self) -> web.RequestHandler:
        return _Connection(
            self,
            header_timeout=self._header_timeout,
            loop=asyncio.get_running_loop(),
            **self._connection_kwargs,
        )

    async def _tracked(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        if isinstance(connection, _Connection):
            connection.request_started()
        try:
            response: web.StreamResponse = await self._app_handler(request)
        finally:
            if isinstance(connection, _Connection):
                connection.request_ended()
        return response


class ServeRunner(web.AppRunner):
    """An ``AppRunner`` with a request-head deadline and an idle timeout on every connection.

    Args:
        app: the application, from :func:`create_app` (or any other).
        header_timeout: seconds a client has to send a request head, from connecting or from
            the first byte of its next request; then the connection is closed.
        idle_timeout: seconds a keep-alive connection may wait for its next request.
        kwargs: the other ``AppRunner`` arguments; the access log is
            :class:`NoQueryAccessLogger` unless ``access_log_class`` says otherwise.
    """

    def __init__(
        self,
        app: web.Application,
        *,
        header_timeout: float = HEADER_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        handle_signals: bool = False,
        shutdown_timeout: float = 60.0,
        access_log_class: type[AbstractAccessLogger] = NoQueryAccessLogger,
        **kwargs: Any,
    ) -> None:
        if header_timeout <= 0 or idle_timeout <= 0:
            raise UsageError(
                f"timeouts must be > 0 seconds, got {header_timeout=} and {idle_timeout=}"
            )
        kwargs = {**kwargs, "keepalive_timeout": idle_timeout}
        super().__init__(
            app,
            handle_signals=handle_signals,
            shutdown_timeout=shutdown_timeout,
            access_log_class=access_log_class,
            **kwargs,
        )
        self._header_timeout = header_timeout
        self._server_kwargs = {**kwargs, "access_log_class": access_log_class}

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()  # starts the app up
        return _Server(
            plain.request_handler,
            header_timeout=self._header_timeout,
            request_factory=plain.request_factory,
            **self._server_kwargs,
        )


def base_url(address: Any) -> str:
    """``http://host:port`` for a listening socket's address (loopback for a wildcard)."""
    host, port = address[0], address[1]
    ip = ipaddress.ip_address(host)
    if ip.is_unspecified:
        host = "127.0.0.1" if ip.version == 4 else "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def run_server(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    on_ready: Callable[[str], object] | None = None,
    stop: anyio.Event | None = None,
    header_timeout: float = HEADER_TIMEOUT,
    idle_timeout: float = IDLE_TIMEOUT,
    shutdown_timeout: float = 60.0,
) -> None:
    """Serve ``app`` with a :class:`ServeRunner` until SIGINT, SIGTERM or ``stop`` is set.

    ``on_ready`` is called with the base URL (``http://127.0.0.1:8080``) once the server
    listens. Then the app shuts down as ``web.run_app`` would, in this task: requests
    still open get ``shutdown_timeout`` seconds to finish, then they are cancelled. Set
    ``stop`` rather than cancel the call: a cancelled shutdown cannot wait for parked runs
    to be saved (the app's task group lives in this task's cancel scopes).
    """
    if not 0 <= shutdown_timeout < math.inf:
        raise UsageError(f"shutdown_timeout must be 0 or more seconds, got {shutdown_timeout}")
    runner = ServeRunner(
        app,
        header_timeout=header_timeout,
        idle_timeout=idle_timeout,
        # aiohttp reads 0 as "wait for ever": the smallest wait it takes as a wait.
        shutdown_timeout=max(shutdown_timeout, 0.001),
    )
    serving = anyio.CancelScope()
    stopping_at: float | None = None
    failure: Exception | None = None
    # The signals stay ours until the cleanup is over: a second Ctrl-C while the server
    # stops would otherwise raise KeyboardInterrupt wherever the cleanup was (saving a
    # parked run, a store's thread) and could leave the process hanging there. The watch
    # is entered before the setup, so that the app's own task group (entered by the setup,
    # left by the cleanup) nests inside it.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as watch:
            watch.start_soon(_on_signals, signals, serving, shutdown_timeout)
            try:
                stopping_at = await _serve(
                    runner, host, port, on_ready, stop, serving, shutdown_timeout
                )
            except Exception as exc:  # raised below as itself, not in the watch's group
                failure = exc
            watch.cancel_scope.cancel()
    if failure is not None:
        raise failure  # e.g. the OSError of a taken port, which the CLI says in one line
    if stopping_at is not None:
        log.info("stopped in %.1f s", time.monotonic() - stopping_at)


async def _serve(
    runner: ServeRunner,
    host: str,
    port: int,
    on_ready: Callable[[str], object] | None,
    stop: anyio.Event | None,
    serving: anyio.CancelScope,
    shutdown_timeout: float,
) -> float:
    """Set up, serve until ``serving`` is cancelled or ``stop`` is set, clean up: when
    the stop began (``time.monotonic``)."""
    try:
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        if on_ready is not None:
            on_ready(base_url(runner.addresses[0]))
        with serving:
            if stop is None:
                await anyio.sleep_forever()
            else:
                await stop.wait()
                _stopping("asked to", shutdown_timeout)
                serving.cancel()  # a signal from now on is a second one
        return time.monotonic()
    finally:
        await runner.cleanup()


def _stopping(why: str, shutdown_timeout: float) -> None:
    log.info("%s: stopping; open requests get up to %g s to finish", why, shutdown_timeout)


async def _on_signals(
    signals: AsyncIterator[int], serving: anyio.CancelScope, shutdown_timeout: float
) -> None:
    """The first signal stops the server; any later one is said and changes nothing."""
    async for signum in signals:
        name = signal.Signals(signum).name
        if serving.cancel_called:
            log.info(
                "%s again: already stopping (open requests get up to %g s)", name, shutdown_timeout
            )
        else:
            _stopping(name, shutdown_timeout)
            serving.cancel()
