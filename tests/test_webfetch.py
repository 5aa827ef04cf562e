"""The webfetch built-in against a real aiohttp server on 127.0.0.1 (never the network)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import anyio
import pytest
from aiohttp import web

from tests.shared import every_path
from toolnexus_async import Tool, ToolResult
from toolnexus_async.tools._egress import EgressPolicy
from toolnexus_async.tools._session import SharedSession
from toolnexus_async.tools.builtin.webfetch import (
    MAX_BYTES,
    WebFetchTool,
    html_to_markdown,
    html_to_text,
)

PAGE = """<!doctype html>
<html><head><title>Page title</title>
<style>body { color: red }</style>
<script>document.write("<p>from script</p>")</script></head>
<body>
<h1>Main heading</h1>
<p>Read <a href="/docs/intro?x=1">the   docs</a> and <strong>run</strong>
<code>make test</code>.</p>
<ul><li>first</li><li>second<ol><li>inner one</li><li>inner two</li></ol></li></ul>
<pre><code>def f():
    return 1
</code></pre>
<h2>Second</h2>
<p>Fish &amp; chips</p>
</body></html>"""


WORDS = "Café crème à 5 €"


def page_in(encoding: str, head: str = "") -> bytes:
    """A small HTML page declaring its encoding (or not) in ``head``, encoded so."""
    return f"<html><head>{head}</head><body><p>{WORDS}</p></body></html>".encode(encoding)


# path -> (Content-Type header, body): each body is readable only if decoded as a browser would.
ENCODED: dict[str, tuple[str, bytes]] = {
    "/meta-charset": ("text/html", page_in("cp1252", '<meta charset="windows-1252">')),
    "/http-equiv": (
        "text/html",
        page_in(
            "cp1252",
            '<meta name="x" content="y"><meta http-equiv="Content-Type" '
            'content="text/html; charset=windows-1252">',
        ),
    ),
    # A byte order mark beats the header and the meta tag alike.
    "/utf8-bom": (
        "text/html; charset=windows-1252",
        b"\xef\xbb\xbf" + page_in("utf-8", '<meta charset="windows-1252">'),
    ),
    "/utf16-bom": ("text/html", page_in("utf-16")),  # Python's utf-16 writes the BOM
    "/header-wins": (
        "text/html; charset=windows-1252",
        page_in("cp1252", '<meta charset="utf-8">'),
    ),
    # latin1 means windows-1252 to a browser: the euro sign is byte 0x80.
    "/latin1-label": ("text/plain; charset=ISO-8859-1", WORDS.encode("cp1252")),
    "/bogus": ("text/html; charset=no-such-thing", page_in("utf-8", '<meta charset="nor-this">')),
    "/utf7": ("text/plain; charset=utf-7", WORDS.encode("utf-8")),
    "/untyped": (
        "",
        page_in("cp1252", '<meta charset="windows-1252">').replace(
            b"<html>", b"<!DOCTYPE html><html>"
        ),
    ),
    # A <meta> in plain text is text, not a declaration.
    "/plain-meta": ("text/plain", '<meta charset="windows-1252"> Café'.encode()),
}


class Server:
    """Routes by path; records every request and the client port it came from."""

    def __init__(self) -> None:
        self.url = ""
        self.paths: list[str] = []
        self.peers: set[object] = set()
        self.written = 0
        # Never set during a test: a handler awaiting it hangs until teardown releases it.
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        assert request.transport is not None
        self.peers.add(request.transport.get_extra_info("peername"))
        path = request.path
        if path == "/page":
            return web.Response(text=PAGE, content_type="text/html")
        if path in ENCODED:
            content_type, body = ENCODED[path]
            response = web.Response(body=body)
            if content_type:
                response.headers["Content-Type"] = content_type
            else:
                response.headers.popall("Content-Type", None)
            return response
        if path == "/plain":
            return web.Response(text="just *text* <b>as is</b>", content_type="text/plain")
        if path == "/json":
            return web.json_response({"a": 1})
        if path == "/missing":
            return web.Response(status=404, text="<h1>not here</h1>", content_type="text/html")
        if path == "/error":
            return web.Response(status=503, text="down")
        if path == "/endless":
            return await self.endless(request)
        if path == "/big-html":
            html = "<p>para <a href='/x'>link</a></p>" * 20_000
            return web.Response(text=html, content_type="text/html")
        if path == "/image":
            return web.Response(body=b"\x89PNG\r\n\x1a\n", content_type="image/png")
        if path == "/redirect":
            raise web.HTTPFound("/plain")
        if path == "/hang":
            await self.release.wait()
            return web.Response(text="too late")
        return web.Response(status=500, text="unknown path")

    async def endless(self, request: web.Request) -> web.StreamResponse:
        """Streams text until the client stops reading (or far past any sane cap)."""
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            while self.written < ENDLESS_LIMIT:
                await response.write(chunk)
                self.written += len(chunk)
        except ConnectionError:
            pass  # the client hung up: what this route is for
        return response


# Far above MAX_BYTES, so a tool that reads to the end is caught without hanging.
ENDLESS_LIMIT = 16 * MAX_BYTES
# The test servers listen on loopback, which webfetch refuses unless it is allowed.
LOOPBACK = ["127.0.0.1"]


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    async with every_path(srv.handle, srv.release.set) as srv.url:
        yield srv


@pytest.fixture
async def tool() -> AsyncIterator[WebFetchTool]:
    shared = SharedSession()
    try:
        yield WebFetchTool(shared, allow_hosts=LOOPBACK)
    finally:
        await shared.aclose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def fetch(tool: WebFetchTool, url: str, **args: object) -> ToolResult:
    # Bounded, so a regression that hangs fails the test instead of the run.
    with anyio.fail_after(10):
        return await tool.execute({"url": url, **args})


async def test_is_a_builtin_tool(tool: WebFetchTool) -> None:
    """webfetch satisfies the Tool protocol with the family's name, source and schema."""
    assert isinstance(tool, Tool)
    assert (tool.name, tool.source) == ("webfetch", "builtin")
    assert tool.input_schema["required"] == ["url"]
    assert set(tool.input_schema["properties"]) == {"url", "format", "timeout"}


async def test_markdown_is_the_default(server: Server, tool: WebFetchTool) -> None:
    """HTML becomes markdown: headings, absolute links, lists, code; scripts and styles go."""
    result = await fetch(tool, server.url + "/page")
    assert not result.is_error, result.output
    out = result.output
    assert out.startswith("# Main heading")
    assert f"[the docs]({server.url}/docs/intro?x=1)" in out
    assert "**run**" in out and "`make test`" in out
    assert "- first\n- second\n  1. inner one\n  2. inner two" in out
    assert "```\ndef f():\n    return 1\n```" in out
    assert "## Second" in out and "Fish & chips" in out
    assert "from script" not in out and "color" not in out and "Page title" not in out
    assert result.metadata is not None
    assert result.metadata["status"] == 200
    assert result.metadata["truncated"] is False


async def test_text_format_has_no_markup(server: Server, tool: WebFetchTool) -> None:
    """format=text keeps the words and the line structure but no markdown syntax."""
    result = await fetch(tool, server.url + "/page", format="text")
    assert not result.is_error
    out = result.output
    assert out.startswith("Main heading\n\nRead the docs and run make test.")
    assert "#" not in out and "](" not in out and "**" not in out and "```" not in out
    assert "    return 1" in out
    assert "from script" not in out


async def test_html_format_returns_the_page_as_sent(server: Server, tool: WebFetchTool) -> None:
    """format=html returns the body untouched, scripts included."""
    result = await fetch(tool, server.url + "/page", format="html")
    assert result.output == PAGE


async def test_non_html_text_is_returned_as_sent(server: Server, tool: WebFetchTool) -> None:
    """text/plain and JSON are not run through the HTML converter."""
    plain = await fetch(tool, server.url + "/plain")
    assert plain.output == "just *text* <b>as is</b>"
    data = await fetch(tool, server.url + "/json", format="text")
    assert data.output == '{"a": 1}'


@pytest.mark.parametrize("path", sorted(set(ENCODED) - {"/plain-meta", "/latin1-label"}))
async def test_pages_are_decoded_as_browsers_do(
    server: Server, tool: WebFetchTool, path: str
) -> None:
    """BOM, then the header's charset, then <meta>, then UTF-8; bogus names are ignored."""
    result = await fetch(tool, server.url + path, format="text")
    assert not result.is_error, result.output
    assert result.output == WORDS


async def test_charset_labels_and_meta_in_plain_text(server: Server, tool: WebFetchTool) -> None:
    """'latin1' is windows-1252 as in browsers; a <meta> tag in plain text declares nothing."""
    latin1 = await fetch(tool, server.url + "/latin1-label")
    assert latin1.output == WORDS
    plain = await fetch(tool, server.url + "/plain-meta")
    assert plain.output == '<meta charset="windows-1252"> Café'


async def test_redirect_is_followed(server: Server, tool: WebFetchTool) -> None:
    """A redirect is followed and the metadata names the final URL."""
    result = await fetch(tool, server.url + "/redirect")
    assert result.output.startswith("just *text*")
    assert result.metadata is not None and result.metadata["url"] == server.url + "/plain"


@pytest.mark.parametrize(("path", "status"), [("/missing", 404), ("/error", 503)])
async def test_non_2xx_is_an_error_result(
    server: Server, tool: WebFetchTool, path: str, status: int
) -> None:
    """A non-2xx reply is an error result starting with HTTP <status>."""
    result = await fetch(tool, server.url + path)
    assert result.is_error
    assert result.output.startswith(f"HTTP {status}")
    assert result.metadata is not None and result.metadata["status"] == status


async def test_body_is_capped_and_the_result_says_so(server: Server, tool: WebFetchTool) -> None:
    """Reading stops after MAX_BYTES, the output keeps exactly that much and says it was cut."""
    result = await fetch(tool, server.url + "/endless")
    assert not result.is_error
    body, _, note = result.output.partition("\n\n[webfetch:")
    assert body == "x" * MAX_BYTES
    assert "cut at" in note
    assert result.metadata is not None and result.metadata["truncated"] is True
    # The server was stopped by the client hanging up, not by its own limit.
    assert server.written < ENDLESS_LIMIT


async def test_a_large_page_is_converted_too(server: Server, tool: WebFetchTool) -> None:
    """A page above the inline size is converted (off the loop) like a small one."""
    result = await fetch(tool, server.url + "/big-html")
    assert not result.is_error
    assert result.output.count(f"[link]({server.url}/x)") == 20_000
    assert "<p>" not in result.output


async def test_timeout_is_an_error_result(server: Server, tool: WebFetchTool) -> None:
    """A server that never answers gives a timeout error result after the tool's timeout."""
    start = anyio.current_time()
    result = await fetch(tool, server.url + "/hang", timeout=0.2)
    assert result.is_error
    assert "timed out after 0.2 s" in result.output
    assert anyio.current_time() - start < 5
    assert server.paths == ["/hang"]


async def test_cancellation_propagates(server: Server, tool: WebFetchTool) -> None:
    """Cancelling the caller cancels the fetch; it is not turned into a result."""
    with anyio.move_on_after(0.2) as scope:
        await tool.execute({"url": server.url + "/hang", "timeout": 60})
        pytest.fail("execute returned instead of being cancelled")
    assert scope.cancelled_caught


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/file", "file:///etc/passwd", "javascript:alert(1)", "no-scheme"]
)
async def test_only_http_and_https_urls(server: Server, tool: WebFetchTool, url: str) -> None:
    """Any other scheme is refused with an error result before any request."""
    result = await fetch(tool, url)
    assert result.is_error
    assert "only http:// and https://" in result.output
    assert server.paths == []


async def test_connection_refused_is_an_error_result(tool: WebFetchTool) -> None:
    """A refused connection becomes an error result, not an exception."""
    result = await fetch(tool, f"http://127.0.0.1:{free_port()}/")
    assert result.is_error
    assert "failed" in result.output and "ClientConnectorError" in result.output


async def test_binary_content_is_refused(server: Server, tool: WebFetchTool) -> None:
    """An image is not shown as mojibake: it is an error naming the content type."""
    result = await fetch(tool, server.url + "/image")
    assert result.is_error
    assert "image/png" in result.output


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"format": "pdf"}, "'format' must be one of"),
        ({"timeout": 0}, "'timeout' must be a positive number"),
        ({"timeout": "soon"}, "'timeout' must be a positive number"),
        ({"url": ""}, "'url' must be a non-empty string"),
    ],
)
async def test_bad_arguments_are_error_results(
    server: Server, tool: WebFetchTool, args: dict[str, object], problem: str
) -> None:
    """Bad arguments are reported without a request, even when called without validation."""
    result = await tool.execute({"url": server.url + "/plain", **args})
    assert result.is_error and problem in result.output
    assert server.paths == []


async def test_one_session_for_many_calls(server: Server) -> None:
    """Calls share the SharedSession's pool: three fetches use one connection."""
    shared = SharedSession()
    try:
        tool = WebFetchTool(shared, allow_hosts=LOOPBACK)
        for _ in range(3):
            assert not (await fetch(tool, server.url + "/plain")).is_error
        assert len(server.paths) == 3
        assert len(server.peers) == 1
    finally:
        await shared.aclose()


async def test_aclose_leaves_the_shared_session_open(server: Server) -> None:
    """The tool's aclose does not close the session it borrows; the owner's aclose does."""
    shared = SharedSession()
    tool = WebFetchTool(shared, allow_hosts=LOOPBACK)
    assert not (await fetch(tool, server.url + "/plain")).is_error
    session = shared.get(EgressPolicy(LOOPBACK))
    await tool.aclose()
    open_after_tool_close = not session.closed
    await shared.aclose()
    assert open_after_tool_close
    assert session.closed
    result = await fetch(tool, server.url + "/plain")
    assert result.is_error and "closed" in result.output


async def test_without_a_session_the_tool_owns_one(server: Server) -> None:
    """WebFetchTool() makes its own session on first use and closes it in aclose."""
    tool = WebFetchTool(allow_hosts=LOOPBACK)
    assert not (await fetch(tool, server.url + "/plain")).is_error
    await tool.aclose()
    after = await fetch(tool, server.url + "/plain")
    assert after.is_error and "closed" in after.output
    assert repr(tool) == f"WebFetchTool(max_bytes={MAX_BYTES}, allow_hosts=['127.0.0.1'])"


def test_html_to_markdown_keeps_entities_and_drops_js_links() -> None:
    """Entities are decoded, javascript: links keep only their text, images keep alt text."""
    html = '<p>a &lt; b <a href="javascript:x()">click</a> <img src="p.png" alt="P"></p>'
    assert (
        html_to_markdown(html, "https://e.test/dir/")
        == "a < b click ![P](https://e.test/dir/p.png)"
    )
    assert html_to_text(html) == "a < b click"


def test_html_to_markdown_survives_broken_markup() -> None:
    """Unclosed and misnested tags still give readable output, nothing lost."""
    html = "<h3>Title<p>one <b>two <i>three</b> four<li>item"
    out = html_to_markdown(html)
    assert out.startswith("### Title")
    assert "one **two *three*** four" in out
    assert out.endswith("- item")


def test_paragraphs_inside_list_items_stay_on_the_marker_line() -> None:
    """<li><p>text</p></li> renders as "- text"; empty items are dropped."""
    html = "<ul><li><p>one</p><p>more</p></li><li></li><li>two</li></ul><p>after</p>"
    assert html_to_markdown(html) == "- one\nmore\n- two\n\nafter"
