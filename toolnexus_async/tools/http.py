"""HTTP tools: one HTTP endpoint described once becomes a :class:`~toolnexus_async.Tool`.

Rules of this module:

- Arguments are routed, in this order: a ``{placeholder}`` in the URL takes the argument of
  that name (URL-quoted), a name listed in ``query`` goes to the query string, and what is
  left is the body (``json``, ``form``, or ``raw``: the ``body`` argument sent as is). An
  argument used in the URL or the query string is not sent in the body.
- Header values are secrets (:mod:`._headers`). ``${NAME}`` in a header value is read from
  the environment at call time; a missing variable is an error result that names the
  variable only. No header value is ever logged, shown in a ``repr``, or put in a result or
  an exception, and every header value is scrubbed from the reply text before the model
  sees it (a server that echoes the request headers must not hand the model a key); only
  the literal values of descriptive headers such as ``Content-Type`` are left alone.
- Every failure is an error result, never an exception: a non-2xx reply is
  ``HTTP <status>: <body excerpt>`` with a bounded excerpt; a refused address, a
  connection failure or a timeout says so. Only cancellation propagates.
- Guarded like ``webfetch`` (``tools/_egress.py``): only public addresses are reached unless
  ``allow_hosts`` names more, and the template's own host is no exception. Redirects are
  followed by the guard, each hop checked; a header whose value is a secret is never sent
  to another origin than the one it was meant for.
- Calls share one aiohttp session: a :class:`SharedSession` passed in (the toolkit's, which
  its owner closes) or one the tool creates on first use and closes in :meth:`aclose`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import aiohttp
import anyio

from .._core.errors import BODY_EXCERPT_LIMIT, UsageError
from .._core.types import ToolContext, ToolResult, check_tool_name
from ._egress import MAX_REDIRECTS, EgressPolicy, EgressRefused, guarded_request
from ._headers import expand_headers, scrub_secrets
from ._session import SharedSession

__all__ = ("HttpTool", "http_tool")

log = logging.getLogger("toolnexus_async.tools.http")

BodyMode = Literal["json", "form", "raw"]
ResultMode = Literal["text", "json", "status+text"]

MAX_BYTES = 5 * 1024 * 1024
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CHUNK = 64 * 1024


def _scalar(value: object) -> str:
    """An argument as it appears in a URL, a query string or a form: JSON-like, not Python."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _pairs(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Query-string or form pairs; a list repeats its key, ``None`` is left out."""
    pairs: list[tuple[str, str]] = []
    for key, value in values.items():
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        pairs.extend((key, _scalar(item)) for item in items if item is not None)
    return pairs


class HttpTool:
    """A tool that calls one HTTP endpoint; build it with :func:`http_tool`."""

    source = "http"

    def __init__(
        self,
        *,
        name: str,
        description: str,
        method: str,
        url: str,
        input_schema: Mapping[str, Any],
        headers: Mapping[str, str],
        query: tuple[str, ...],
        body: BodyMode,
        timeout: float,
        result: ResultMode,
        session: SharedSession | None,
        allow_hosts: Iterable[str] = (),
        max_redirects: int = MAX_REDIRECTS,
    ) -> None:
        self.name = name
        self.description = description
        self.input_schema = input_schema
        self._method = method
        self._url = url
        self._headers = dict(headers)
        self._query = query
        self._placeholders = tuple(dict.fromkeys(_PLACEHOLDER.findall(url)))
        self._body = body
        self._timeout = timeout
        self._result = result
        try:
            self._egress = EgressPolicy(allow_hosts)
        except UsageError as exc:
            raise UsageError(f"http tool {name!r}: {exc}") from None
        if (
            isinstance(max_redirects, bool)
            or not isinstance(max_redirects, int)
            or max_redirects < 0
        ):
            raise UsageError(f"http tool {name!r}: max_redirects must be an int >= 0")
        self._max_redirects = max_redirects
        self._owns_session = session is None
        self._session = session if session is not None else SharedSession()

    @property
    def method(self) -> str:
        """The HTTP method, upper case."""
        return self._method

    @property
    def url(self) -> str:
        """The URL template, ``{placeholders}`` included."""
        return self._url

    @property
    def allow_hosts(self) -> tuple[str, ...]:
        """The allow-list, canonical and sorted; empty means public addresses only."""
        return self._egress.allow_hosts

    def __repr__(self) -> str:
        # Header names only: their values are secrets. Allowed hosts are no secret.
        allowed = f", allow_hosts={list(self.allow_hosts)!r}" if self.allow_hosts else ""
        return (
            f"HttpTool(name={self.name!r}, method={self.method!r}, url={self.url!r}, "
            f"headers={sorted(self._headers)!r}, body={self._body!r}, result={self._result!r}"
            f"{allowed})"
        )

    async def aclose(self) -> None:
        """Close the session this tool created; a borrowed one is its owner's to close."""
        if self._owns_session:
            await self._session.aclose()

    def _expand_headers(self) -> tuple[dict[str, str], list[str], list[str]] | str:
        """(headers to send, secrets to scrub, names of the secret headers), or the error
        naming a missing variable."""
        return expand_headers(self._headers)

    def _route(self, args: Mapping[str, Any]) -> tuple[str, list[tuple[str, str]], Any] | str:
        """(url, query pairs, body or None), or the problem with the arguments."""
        missing = [p for p in self._placeholders if args.get(p) is None]
        if missing:
            return f"missing argument {missing[0]!r} (it is part of the URL)"
        url = _PLACEHOLDER.sub(lambda m: quote(_scalar(args[m.group(1)]), safe=""), self._url)
        used = set(self._placeholders) | set(self._query)
        query = _pairs({k: args[k] for k in self._query if k in args})
        rest = {k: v for k, v in args.items() if k not in used}
        if self._body == "raw":
            raw = rest.get("body")
            data: Any = None if raw is None else (raw if isinstance(raw, str) else _scalar(raw))
        elif self._body == "form":
            data = _pairs(rest) or None
        else:
            data = rest or None
        return url, query, data

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        # Typed as object: a tool called directly may be handed anything.
        given: object = args
        if not isinstance(given, dict):
            return ToolResult.error(f"{self.name}: arguments must be an object")
        expanded = self._expand_headers()
        if isinstance(expanded, str):
            return ToolResult.error(f"{self.name}: {expanded}")
        headers, secrets, secret_names = expanded
        routed = self._route(args)
        if isinstance(routed, str):
            return ToolResult.error(f"{self.name}: {routed}")
        url, query, data = routed
        try:
            reply = await self._send(url, query, data, headers, secret_names)
        except EgressRefused as exc:
            problem = scrub_secrets(str(exc), secrets)
            log.debug("http tool %r: %s %s refused: %s", self.name, self.method, url, problem)
            return ToolResult.error(f"{self.name}: {self.method} {url}: {problem}")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, UsageError) as exc:
            # The message is built from aiohttp's text, which could in theory quote a header.
            problem = scrub_secrets(f"{type(exc).__name__}: {exc}", secrets)
            log.debug("http tool %r: %s %s failed: %s", self.name, self.method, url, problem)
            return ToolResult.error(f"{self.name}: {self.method} {url} failed: {problem}")
        if reply is None:
            log.debug("http tool %r: %s %s timed out", self.name, self.method, url)
            return ToolResult.error(
                f"{self.name}: {self.method} {url} timed out after {self._timeout:g} s"
            )
        status, text, cut = reply
        log.debug("http tool %r: %s %s -> %d", self.name, self.method, url, status)
        return self._result_of(status, scrub_secrets(text, secrets), cut)

    async def _send(
        self,
        url: str,
        query: list[tuple[str, str]],
        data: Any,
        headers: dict[str, str],
        secret_names: list[str],
    ) -> tuple[int, str, bool] | None:
        """(status, body text, cut) of the reply, or None when the deadline passed."""
        as_json = self._body == "json"
        with anyio.move_on_after(self._timeout):
            async with guarded_request(
                self._session,
                self._egress,
                self.method,
                url,
                headers=headers,
                secret_headers=secret_names,
                params=query or None,
                json=data if as_json else None,
                data=None if as_json else data,
                max_redirects=self._max_redirects,
            ) as response:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_chunked(_CHUNK):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_BYTES:
                        break
                body = b"".join(chunks)
                text = _decode(body[:MAX_BYTES], response.charset)
                return response.status, text, len(body) > MAX_BYTES
        return None

    def _result_of(self, status: int, text: str, cut: bool) -> ToolResult:
        meta: dict[str, Any] = {"status": status}
        if cut:
            meta["truncated"] = True
        if not 200 <= status < 300:
            excerpt = text[:BODY_EXCERPT_LIMIT] + ("..." if len(text) > BODY_EXCERPT_LIMIT else "")
            return ToolResult.error(f"HTTP {status}: {excerpt}", meta)
        note = f"\n\n[the reply was cut at {MAX_BYTES} bytes]" if cut else ""
        if self._result == "json":
            if not text.strip():
                return ToolResult.ok("", meta)
            try:
                parsed = json.loads(text)
            except ValueError:
                excerpt = text[:BODY_EXCERPT_LIMIT]
                return ToolResult.error(f"HTTP {status} but the reply is not JSON: {excerpt}", meta)
            return ToolResult.ok(json.dumps(parsed, indent=2, ensure_ascii=False), meta)
        if self._result == "status+text":
            return ToolResult.ok(f"{status}\n{text}{note}", meta)
        return ToolResult.ok(text + note, meta)


def _decode(body: bytes, charset: str | None) -> str:
    try:
        return body.decode(charset or "utf-8", "replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", "replace")


def http_tool(
    name: str,
    description: str,
    method: str,
    url: str,
    input_schema: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    query: Iterable[str] = (),
    body: BodyMode = "json",
    timeout: float = 30,
    result: ResultMode = "text",
    session: SharedSession | None = None,
    *,
    allow_hosts: Iterable[str] = (),
    max_redirects: int = MAX_REDIRECTS,
) -> HttpTool:
    """A tool that calls ``method url`` with the model's arguments.

    Args:
        name: the tool name the model calls.
        description: what the endpoint does, for the model.
        method: the HTTP method (GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS).
        url: the endpoint; ``{name}`` is replaced by the argument ``name``, URL-quoted.
        input_schema: the JSON Schema of the arguments.
        headers: sent with every call; ``${VAR}`` in a value is read from the environment
            at call time. Values are never logged or shown.
        query: argument names sent in the query string instead of the body.
        body: ``"json"`` (the remaining arguments as a JSON object), ``"form"`` (as
            ``application/x-www-form-urlencoded``) or ``"raw"`` (the ``body`` argument as is).
        timeout: seconds for the whole call, reading the reply included.
        result: ``"text"`` (the body), ``"json"`` (the body pretty-printed) or
            ``"status+text"`` (the status on the first line, then the body).
        session: a :class:`SharedSession` to borrow (the toolkit's); without one the tool
            creates its own on first use and closes it in ``aclose()``.
        allow_hosts: host names, IP addresses and networks (``"10.0.0.0/8"``) beyond the
            public internet that the tool may reach. Empty by default: loopback, private,
            link-local and other non-public addresses are refused, the URL's own host
            included, so an endpoint on ``127.0.0.1`` needs ``allow_hosts=["127.0.0.1"]``.
        max_redirects: how many redirects to follow, each checked like the first request.

    >>> weather = http_tool(
    ...     "weather", "Current weather for a city.", "GET",
    ...     "https://api.example.com/weather/{city}",
    ...     {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    ...     headers={"Authorization": "Bearer ${WEATHER_KEY}"},
    ... )
    >>> weather
    HttpTool(name='weather', method='GET', url='https://api.example.com/weather/{city}', \
headers=['Authorization'], body='json', result='text')
    """
    check_tool_name(name)
    verb = str(method).upper()
    if verb not in _METHODS:
        raise UsageError(f"http tool {name!r}: method {method!r} is not one of {sorted(_METHODS)}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"http tool {name!r}: url must be an http:// or https:// URL")
    if not isinstance(input_schema, Mapping):
        raise UsageError(f"http tool {name!r}: input_schema must be a JSON Schema object")
    if body not in ("json", "form", "raw"):
        raise UsageError(f"http tool {name!r}: body must be 'json', 'form' or 'raw'")
    if result not in ("text", "json", "status+text"):
        raise UsageError(f"http tool {name!r}: result must be 'text', 'json' or 'status+text'")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise UsageError(f"http tool {name!r}: timeout must be a positive number of seconds")
    query = (query,) if isinstance(query, str) else tuple(query)
    header_map = dict(headers or {})
    for key, value in header_map.items():
        if not isinstance(key, str) or not isinstance(value, str):
            # The value is deliberately not shown: it may be a secret.
            raise UsageError(f"http tool {name!r}: header {key!r} must map a str to a str")
    properties = input_schema.get("properties")
    if isinstance(properties, Mapping):
        for arg in (*_PLACEHOLDER.findall(url), *query):
            if arg not in properties:
                raise UsageError(
                    f"http tool {name!r}: {arg!r} is used in the URL or query but is not "
                    "a property of input_schema"
                )
    return HttpTool(
        name=name,
        description=description,
        method=verb,
        url=url,
        input_schema=input_schema,
        headers=header_map,
        query=query,
        body=body,
        timeout=float(timeout),
        result=result,
        session=session,
        allow_hosts=allow_hosts,
        max_redirects=max_redirects,
    )
