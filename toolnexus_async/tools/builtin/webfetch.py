"""The ``webfetch`` built-in: fetch one http(s) URL and return it as markdown, text or HTML.

Rules of this module:

- Every failure is an error result, never an exception: a URL that is not http(s), an
  address the egress rule refuses, a connection error, a non-2xx reply (the result starts
  with ``HTTP <status>``), a timeout. Only cancellation propagates.
- Guarded by default: only public addresses are reached, unless ``allow_hosts`` names more
  (see ``tools/_egress.py``). Redirects are followed by the guard, each hop checked.
- At most ``max_bytes`` (default :data:`MAX_BYTES`) of a body is read; a longer body is cut
  and the result says so.
- A body is decoded as a browser decodes it: a byte order mark, else the Content-Type
  header's charset, else (HTML only) a ``<meta>`` charset near the top, else UTF-8. An
  unknown charset name counts as none; bytes that do not decode become U+FFFD.
- HTML becomes markdown or text with the standard library's ``html.parser`` only: headings,
  paragraphs, links as ``[text](href)``, lists, code and ``pre``; scripts and styles are
  dropped. Other textual types are returned as sent; ``format="html"`` returns the page as
  sent. A large page is converted in a worker thread so the event loop keeps running.
- The aiohttp session comes from a :class:`SharedSession`: a borrowed one (the toolkit's)
  is closed by its owner; without one the tool makes its own and closes it in ``aclose``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

import aiohttp
import anyio
import anyio.to_thread
from w3lib.encoding import (
    html_body_declared_encoding,
    http_content_type_encoding,
    read_bom,
    to_unicode,
)

from ..._core.errors import UsageError
from ..._core.types import ToolContext, ToolResult
from .._egress import MAX_REDIRECTS, EgressPolicy, EgressRefused, guarded_request
from .._session import SharedSession
from ._html import html_to_markdown, html_to_text

__all__ = ("MAX_BYTES", "WebFetchTool", "html_to_markdown", "html_to_text")

MAX_BYTES = 5 * 1024 * 1024
DEFAULT_TIMEOUT = 30
MAX_TIMEOUT = 120
# Converting a page of this size takes milliseconds; above it, a worker thread keeps the
# loop free for the other runs sharing it.
_INLINE_CONVERT_BYTES = 256 * 1024
_CHUNK = 64 * 1024

Format = Literal["text", "markdown", "html"]
_FORMATS: tuple[Format, ...] = ("text", "markdown", "html")

_ACCEPT: dict[str, str] = {
    "markdown": "text/markdown;q=1.0, text/html;q=0.9, text/plain;q=0.8, */*;q=0.1",
    "text": "text/plain;q=1.0, text/html;q=0.9, text/markdown;q=0.8, */*;q=0.1",
    "html": "text/html;q=1.0, application/xhtml+xml;q=0.9, text/plain;q=0.8, */*;q=0.1",
}

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "url": {"type": "string", "description": "The http:// or https:// URL to fetch."},
        "format": {
            "type": "string",
            "enum": list(_FORMATS),
            "description": "How to return the page: markdown (default), text or html.",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_TIMEOUT,
            "description": "Seconds to wait for the whole fetch (default 30, at most 120).",
        },
    },
    "required": ["url"],
    "additionalProperties": False,
}


def _is_html(content_type: str, head: str) -> bool:
    """Declared HTML, or untyped and starting like HTML (``head``: the body's first chars)."""
    if content_type in ("text/html", "application/xhtml+xml"):
        return True
    if content_type in ("", "application/octet-stream"):
        return head[:512].lstrip("\ufeff \t\r\n").lower().startswith(("<!doctype html", "<html"))
    return False


def _is_textual(content_type: str) -> bool:
    return (
        not content_type
        or content_type.startswith("text/")
        or content_type.endswith(("+json", "+xml", "/json", "/xml", "/javascript"))
        or content_type in ("application/octet-stream", "application/x-www-form-urlencoded")
    )


def _decode(body: bytes, content_type: str, header: str | None) -> str:
    """The body as a browser decodes it: a byte order mark first, then the Content-Type
    header's charset, then for HTML a ``<meta charset>`` or ``<meta http-equiv>`` near the
    top, then UTF-8; bytes that do not decode become U+FFFD.

    w3lib names the encodings as the WHATWG Encoding Standard does (``latin1`` is
    windows-1252, as in every browser), and an unknown or unsafe name (``utf-7``) counts as
    no name at all.
    """
    bom_encoding, bom = read_bom(body)
    if bom_encoding is not None and bom is not None:
        return to_unicode(body[len(bom) :], bom_encoding)
    encoding = http_content_type_encoding(header)
    if encoding is None and _is_html(content_type, body[:512].decode("latin-1")):
        encoding = html_body_declared_encoding(body)
    if encoding in ("utf-16", "utf-32"):
        encoding += "-be"  # no BOM: the standard's default byte order
    return to_unicode(body, encoding or "utf-8")


def _parse_args(args: object) -> tuple[str, Format, float] | str:
    """(url, format, timeout), or the problem with the arguments."""
    if not isinstance(args, dict):
        return "arguments must be an object"
    url = args.get("url")
    if not isinstance(url, str) or not url.strip():
        return "'url' must be a non-empty string"
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return f"only http:// and https:// URLs can be fetched, got {url!r}"
    fmt = args.get("format", "markdown")
    if fmt not in _FORMATS:
        return f"'format' must be one of {', '.join(_FORMATS)}, got {fmt!r}"
    timeout = args.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        return f"'timeout' must be a positive number of seconds, got {timeout!r}"
    return url, fmt, min(float(timeout), MAX_TIMEOUT)


class _Page(NamedTuple):
    body: bytes
    status: int
    content_type: str
    header: str | None  # Content-Type as sent, for its charset
    url: str
    cut: bool


class WebFetchTool:
    """Fetch a web page (http or https) and return it as markdown, plain text or HTML."""

    name = "webfetch"
    description = (
        "Fetch the content of a URL (http or https). Returns markdown by default, or plain "
        "text or the raw HTML. Bodies over 5 MB are cut. Use it to read documentation or "
        "web pages; it does not run JavaScript."
    )
    input_schema = _SCHEMA
    source = "builtin"

    def __init__(
        self,
        session: SharedSession | None = None,
        *,
        allow_hosts: Iterable[str] = (),
        max_bytes: int = MAX_BYTES,
        max_redirects: int = MAX_REDIRECTS,
    ) -> None:
        """``allow_hosts``: names, addresses and networks beyond the public internet that
        the tool may reach (``["127.0.0.1"]``, ``["10.0.0.0/8"]``, ``["wiki.internal"]``).
        """
        for label, value, least in (
            ("max_bytes", max_bytes, 1),
            ("max_redirects", max_redirects, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UsageError(f"webfetch: {label} must be an int >= {least}, got {value!r}")
        try:
            self._egress = EgressPolicy(allow_hosts)
        except UsageError as exc:
            raise UsageError(f"webfetch: {exc}") from None
        self._owns_session = session is None
        self._session = SharedSession() if session is None else session
        self._max_bytes = max_bytes
        self._max_redirects = max_redirects

    @property
    def allow_hosts(self) -> tuple[str, ...]:
        """The allow-list, canonical and sorted; empty means public addresses only."""
        return self._egress.allow_hosts

    def __repr__(self) -> str:
        allowed = f", allow_hosts={list(self.allow_hosts)!r}" if self.allow_hosts else ""
        return f"WebFetchTool(max_bytes={self._max_bytes}{allowed})"

    async def aclose(self) -> None:
        """Close the session this tool made; a borrowed one is its owner's to close."""
        if self._owns_session:
            await self._session.aclose()

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        parsed = _parse_args(args)
        if isinstance(parsed, str):
            return ToolResult.error(f"webfetch: {parsed}")
        url, fmt, seconds = parsed
        try:
            page = await self._fetch(url, fmt, seconds)
        except (UsageError, EgressRefused) as exc:
            return ToolResult.error(f"webfetch: {exc}")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            # aiohttp's message names the host and the failure (refused, reset, DNS, TLS).
            return ToolResult.error(f"webfetch: fetching {url} failed: {type(exc).__name__}: {exc}")
        if isinstance(page, ToolResult):
            return page
        meta: dict[str, Any] = {
            "url": page.url,
            "status": page.status,
            "content_type": page.content_type,
            "truncated": page.cut,
        }
        if not _is_textual(page.content_type):
            return ToolResult.error(
                f"webfetch: {page.url} is {page.content_type}, not text; it cannot be shown", meta
            )
        text = _decode(page.body, page.content_type, page.header)
        if fmt != "html" and _is_html(page.content_type, text):
            convert = html_to_markdown if fmt == "markdown" else html_to_text
            if len(page.body) > _INLINE_CONVERT_BYTES:
                text = await anyio.to_thread.run_sync(convert, text, page.url)
            else:
                text = convert(text, page.url)
        if page.cut:
            text += (
                f"\n\n[webfetch: the body was cut at {self._max_bytes} bytes; "
                "the rest was not read]"
            )
        return ToolResult.ok(text, meta)

    async def _fetch(self, url: str, fmt: str, seconds: float) -> _Page | ToolResult:
        """The page, or the error result of a non-2xx reply or a passed deadline."""
        headers = {"Accept": _ACCEPT[fmt], "User-Agent": "toolnexus_async-webfetch"}
        with anyio.move_on_after(seconds):
            async with guarded_request(
                self._session,
                self._egress,
                "GET",
                url,
                headers=headers,
                max_redirects=self._max_redirects,
            ) as response:
                status = response.status
                if not 200 <= status < 300:
                    reason = f" {response.reason}" if response.reason else ""
                    return ToolResult.error(
                        f"HTTP {status}{reason}: fetching {url} failed",
                        {"url": str(response.url), "status": status},
                    )
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_chunked(_CHUNK):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > self._max_bytes:
                        break
                body = b"".join(chunks)
                has_type = "Content-Type" in response.headers
                return _Page(
                    body=body[: self._max_bytes],
                    status=status,
                    content_type=response.content_type if has_type else "",
                    header=response.headers.get("Content-Type"),
                    url=str(response.url),
                    cut=len(body) > self._max_bytes,
                )
        return ToolResult.error(f"webfetch: fetching {url} timed out after {seconds:g} s")
