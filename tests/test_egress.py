"""The egress guard: the address rules, the allow-list, and webfetch and http tools that
refuse what they must not reach, redirects included, against servers on 127.0.0.1 only.

Names are resolved by the system (``localhost``, from /etc/hosts) or by :class:`FakeDNS`,
which stands in for a DNS server that answers what a test says. The fetches only ever name
loopback addresses (or ``0.0.0.0``, which means this host), so even a broken guard would
not reach beyond this machine; other addresses are tested on the pure rules.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import anyio
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from tests.conftest import assert_no_leaks
from tests.shared import every_path
from toolnexus_async import ToolResult, UsageError
from toolnexus_async.tools._egress import (
    EgressPolicy,
    EgressRefused,
    GuardResolver,
    non_public_reason,
)
from toolnexus_async.tools._session import SharedSession
from toolnexus_async.tools.builtin.webfetch import WebFetchTool
from toolnexus_async.tools.http import http_tool

SECRET = "sk-egress-7d2e91c4"
HOW = "add it to allow_hosts to let tools reach it"


# -- the address rules ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.255.0.9", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "a loopback address (IPv4-mapped 127.0.0.1)"),
        ("169.254.169.254", "a link-local address"),
        ("10.0.0.1", "a private address"),
        ("10.255.255.254", "a private address"),
        ("172.16.0.1", "a private address"),
        ("172.31.255.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("100.64.0.1", "a non-public address"),
        ("100.127.255.254", "a non-public address"),
        ("fc00::1", "a private address"),
        ("fd12:3456::1", "a private address"),
        ("fe80::1", "a link-local address"),
        ("fe80::1%eth0", "a link-local address"),
        ("fec0::1", "a site-local address"),
        ("224.0.0.1", "a multicast address"),
        ("239.1.2.3", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("ff0e::1", "a multicast address"),
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("255.255.255.255", "a private address"),
        ("240.0.0.1", "a private address"),
        ("2002:7f00:1::", "a loopback address (6to4 127.0.0.1)"),
        ("2002:a9fe:a9fe::1", "a link-local address (6to4 169.254.169.254)"),
        ("64:ff9b::7f00:1", "a loopback address (NAT64 127.0.0.1)"),
        ("64:ff9b::a00:1", "a private address (NAT64 10.0.0.1)"),
        ("::ffff:10.0.0.1", "a private address (IPv4-mapped 10.0.0.1)"),
        ("::ffff:169.254.169.254", "a link-local address (IPv4-mapped 169.254.169.254)"),
        ("::127.0.0.1", "a reserved address"),  # IPv4-compatible, deprecated
        ("2001:db8::1", "a private address"),  # documentation
        ("5f00::1", "a reserved address"),  # outside 2000::/3
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a Teredo address"),
        ("2002:c0a8:101::1", "a private address (6to4 192.168.1.1)"),
        # Python's own is_private/is_global judge these differently from one release to
        # the next (3.11.7 and 3.12.1 call the first two global); the guard does not.
        ("192.0.0.100", "a private address"),  # IETF protocol assignments
        ("64:ff9b:1::a00:1", "a private address"),  # local-use NAT64
        ("3fff::1", "a private address"),  # documentation (2024)
        ("2001:2::1", "a private address"),  # benchmarking
    ],
)
def test_non_public_addresses_are_refused(address: str, reason: str) -> None:
    """Each kind of non-public address is named, an embedded IPv4 address unwrapped."""
    assert non_public_reason(ipaddress.ip_address(address)) == reason
    with pytest.raises(EgressRefused) as info:
        EgressPolicy().check_address(address)
    assert info.value.address == address
    assert info.value.reason == reason
    assert str(info.value).endswith(f": {reason}; {HOW}")


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "2606:4700::1111",
        "::ffff:93.184.216.34",
        "2002:5db8:d822::1",  # 6to4: Python 3.13's ipaddress calls all of 2002::/16 private
        "64:ff9b::5db8:d822",
        "192.0.0.9",  # anycast services the registry calls globally reachable...
        "2001:4:112::1",  # ...which Python 3.11.7 and 3.12.1 call private
        "2001:20::1",
    ],
)
def test_public_addresses_pass(address: str) -> None:
    """A public address, plain or embedded in IPv6, is not refused, on every Python."""
    assert non_public_reason(ipaddress.ip_address(address)) is None
    EgressPolicy().check_address(address)


@pytest.mark.parametrize("written", ["::ffff:127.0.0.1", "::ffff:7f00:1", "::FFFF:7F00:0001"])
def test_an_ipv4_mapped_address_is_named_alike_on_every_python(written: str) -> None:
    """Python 3.13 writes ``::ffff:7f00:1`` as ``::ffff:127.0.0.1``; the guard always does."""
    with pytest.raises(EgressRefused) as info:
        EgressPolicy().check_address(written)
    assert info.value.address == "::ffff:127.0.0.1"
    assert str(info.value).startswith("refused to connect to [::ffff:127.0.0.1]: a loopback")


@pytest.mark.parametrize(
    ("entries", "address"),
    [
        (["127.0.0.1"], "127.0.0.1"),
        (["127.0.0.1"], "::ffff:127.0.0.1"),
        (["[::1]"], "::1"),
        (["127.0.0.0/8"], "127.0.0.2"),
        (["10.0.0.0/8"], "10.20.30.40"),
        (["192.168.0.0/16"], "::ffff:192.168.7.7"),
        (["fd00::/8"], "fd00::5"),
        (["fe80::/10"], "fe80::1%eth0"),
        (["169.254.169.254"], "169.254.169.254"),
    ],
)
def test_the_allow_list_admits_addresses_and_networks(entries: list[str], address: str) -> None:
    """An address in an allowed network (an IPv4-mapped one too) may be reached."""
    EgressPolicy(entries).check_address(address)


def test_the_allow_list_admits_nothing_else() -> None:
    """Allowing one address or network leaves the others refused."""
    policy = EgressPolicy(["127.0.0.1", "10.0.0.0/8"])
    for address in ("127.0.0.2", "169.254.169.254", "192.168.1.1", "::1", "fd00::1"):
        with pytest.raises(EgressRefused):
            policy.check_address(address)


def test_names_are_allowed_as_written() -> None:
    """A name matches case-insensitively, a final dot aside; other names do not match."""
    policy = EgressPolicy(["Wiki.Internal.", "bücher.test"])
    assert policy.allow_hosts == ("wiki.internal", "xn--bcher-kva.test")
    assert policy.allows_name("wiki.internal")
    assert policy.allows_name("WIKI.internal.")
    assert policy.allows_name("xn--bcher-kva.test")
    assert not policy.allows_name("evil.wiki.internal")
    assert not policy.allows_name("internal")


def test_policies_are_canonical_frozen_and_hashable() -> None:
    """Equal lists in any order give equal policies with one hash; a str is one entry."""
    first = EgressPolicy(["10.0.0.0/8", "LOCALHOST", "::0001", "127.0.0.1"])
    second = EgressPolicy(("127.0.0.1", "localhost", "10.0.0.0/8", "::1", "localhost"))
    assert first == second and hash(first) == hash(second)
    assert first.allow_hosts == ("10.0.0.0/8", "127.0.0.1", "::1", "localhost")
    assert EgressPolicy("localhost").allow_hosts == ("localhost",)
    assert EgressPolicy() != first
    assert repr(EgressPolicy(["::1"])) == "EgressPolicy(allow_hosts=('::1',))"
    with pytest.raises(AttributeError):
        first.allow_hosts = ()  # type: ignore[misc]


@pytest.mark.parametrize(
    "entry",
    [
        "http://127.0.0.1",
        "127.0.0.1:8080",
        "10.0.0.1/8",
        "10.0.0.0/33",
        "",
        "two words",
        "*.example.com",
        "127.1",
        "2130706433",
        "host/path",
        "-leading.example",
        "fe80::1%eth0",
    ],
)
def test_a_garbage_entry_is_a_usage_error_naming_it(entry: str) -> None:
    """An entry that is no name, address or network is refused when the policy is built."""
    with pytest.raises(UsageError) as info:
        EgressPolicy(["localhost", entry])
    assert repr(entry) in str(info.value)


def test_entries_must_be_strings() -> None:
    """A non-string entry, or a non-iterable list, is a UsageError too."""
    with pytest.raises(UsageError, match="strings"):
        EgressPolicy([5])  # type: ignore[list-item]
    with pytest.raises(UsageError, match="list of strings"):
        EgressPolicy(5)  # type: ignore[arg-type]


def test_the_tools_check_their_allow_list_when_built() -> None:
    """webfetch and http_tool refuse a bad entry at once, naming the tool and the entry."""
    with pytest.raises(UsageError, match=r"webfetch: allow_hosts: 'localhost:80'"):
        WebFetchTool(allow_hosts=["localhost:80"])
    with pytest.raises(UsageError, match=r"http tool 'api': allow_hosts: 'a b'"):
        http_tool("api", "d", "GET", "http://127.0.0.1/", {}, allow_hosts=["a b"])
    with pytest.raises(UsageError, match="max_bytes"):
        WebFetchTool(max_bytes=0)


# -- the resolver -------------------------------------------------------------------------


class FakeDNS(AbstractResolver):
    """A DNS server's stand-in: each name resolves to the addresses the test gives it."""

    def __init__(self, table: Mapping[str, Sequence[str]]) -> None:
        self.table = table
        self.asked: list[str] = []
        self.closed = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.table:
            raise OSError(f"{host}: no such name")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            )
            for address in self.table[host]
        ]

    async def close(self) -> None:
        self.closed = True


async def test_one_refused_address_refuses_the_host() -> None:
    """A name with a public and a private address is refused as a whole."""
    dns = FakeDNS({"mixed.test": ["93.184.216.34", "10.0.0.7"], "public.test": ["8.8.8.8"]})
    guard = GuardResolver(EgressPolicy(), dns)
    with pytest.raises(EgressRefused) as info:
        await guard.resolve("mixed.test", 80)
    assert str(info.value) == (
        f"refused to connect to 10.0.0.7 (mixed.test): a private address; {HOW}"
    )
    assert [r["host"] for r in await guard.resolve("public.test", 80)] == ["8.8.8.8"]
    await guard.close()
    assert dns.closed


async def test_an_allowed_name_may_resolve_anywhere() -> None:
    """A name on the list is not judged by its addresses; an allowed address admits names."""
    # The name as the URL wrote it is what gets resolved (real DNS ignores the case).
    dns = FakeDNS({"WIKI.internal.": ["10.0.0.7", "::1"], "db.internal": ["10.0.0.8"]})
    by_name = GuardResolver(EgressPolicy(["wiki.internal"]), dns)
    assert len(await by_name.resolve("WIKI.internal.", 80)) == 2
    with pytest.raises(EgressRefused):
        await by_name.resolve("db.internal", 80)
    by_network = GuardResolver(EgressPolicy(["10.0.0.0/24"]), dns)
    assert len(await by_network.resolve("db.internal", 80)) == 1


# -- guarded fetches ----------------------------------------------------------------------


class Recorder:
    """Records every request; ``/to/<status>?url=...`` redirects there, anything else is ok."""

    def __init__(self) -> None:
        self.url = ""
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.method, request.path, dict(request.headers), body))
        if request.path.startswith("/to/"):
            status = int(request.path.rsplit("/", 1)[1])
            return web.Response(status=status, headers={"Location": request.query["url"]})
        if request.path == "/loop":
            raise web.HTTPFound("/loop")
        return web.Response(text=f"ok {request.method} {request.path} {body.decode()}")


@pytest.fixture
async def first() -> AsyncIterator[Recorder]:
    server = Recorder()
    async with every_path(server.handle, lambda: None) as server.url:
        yield server


@pytest.fixture
async def second() -> AsyncIterator[Recorder]:
    server = Recorder()
    async with every_path(server.handle, lambda: None) as server.url:
        yield server


def redirect(server: Recorder, status: int, to: str) -> str:
    return f"{server.url}/to/{status}?url={to}"


async def guarded(
    make_session: Callable[[], SharedSession], allow: Sequence[str], url: str, **options: Any
) -> tuple[ToolResult, ToolResult]:
    """The result of webfetch and of a GET http tool for ``url`` under the same allow-list."""
    shared = make_session()
    try:
        fetch = WebFetchTool(shared, allow_hosts=allow, **options)
        api = http_tool("api", "d", "GET", url, {}, session=shared, allow_hosts=allow, **options)
        with anyio.fail_after(10):
            return await fetch.execute({"url": url}), await api.execute({})
    finally:
        await shared.aclose()


@pytest.mark.parametrize(
    ("host", "shown"),
    [
        ("127.0.0.1", "127.0.0.1: a loopback address"),
        ("localhost", "127.0.0.1 (localhost): a loopback address"),
        ("LocalHost", "127.0.0.1 (localhost): a loopback address"),
        ("[::ffff:127.0.0.1]", "[::ffff:127.0.0.1]: a loopback address (IPv4-mapped 127.0.0.1)"),
        ("[::1]", "[::1]: a loopback address"),
        ("0.0.0.0", "0.0.0.0: an unspecified address"),
        ("[::]", "[::]: an unspecified address"),
        ("0x7f000001", "127.0.0.1 (0x7f000001): a loopback address"),
    ],
)
async def test_loopback_is_refused_and_sees_no_request(
    first: Recorder, host: str, shown: str
) -> None:
    """Every spelling of the test server's address is refused before a request is sent."""
    url = f"http://{host}:{first.port}/secret"
    fetched, called = await guarded(SharedSession, (), url)
    assert fetched.is_error and fetched.output == f"webfetch: refused to connect to {shown}; {HOW}"
    assert called.is_error
    assert called.output == f"api: GET {url}: refused to connect to {shown}; {HOW}"
    assert first.seen == []
    assert_no_leaks()


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0177.0.0.1", "127.0.0.1."])
async def test_odd_numeric_hosts_are_refused(first: Recorder, host: str) -> None:
    """A numeric host the system would read as 127.0.0.1 is refused, not connected to."""
    fetched, called = await guarded(SharedSession, ["127.0.0.1"], f"http://{host}:{first.port}/")
    for result in (fetched, called):
        assert result.is_error
        assert f"refused to connect to {host}: " in result.output
        assert "not a canonical IP address" in result.output
    assert first.seen == []


async def test_a_public_name_resolving_to_loopback_is_refused(first: Recorder) -> None:
    """What a name resolves to is checked: a public-looking name on 127.0.0.1 is refused."""
    dns = FakeDNS({"docs.example.com": ["127.0.0.1"]})
    url = f"http://docs.example.com:{first.port}/"
    fetched, called = await guarded(lambda: SharedSession(resolver=lambda: dns), (), url)
    expected = f"refused to connect to 127.0.0.1 (docs.example.com): a loopback address; {HOW}"
    assert fetched.output == f"webfetch: {expected}"
    assert called.output == f"api: GET {url}: {expected}"
    # The clear refusal, not aiohttp's wrapping of it.
    assert "ClientConnector" not in fetched.output + called.output
    assert dns.asked and first.seen == []


@pytest.mark.parametrize(
    "allow", [["127.0.0.1"], ["127.0.0.0/8"], ["localhost"], ["127.0.0.1", "::1", "localhost"]]
)
async def test_an_allowed_server_is_reached(first: Recorder, allow: list[str]) -> None:
    """Listed by address, network or name, the server on loopback answers."""
    url = f"http://localhost:{first.port}/page"
    fetched, called = await guarded(SharedSession, allow, url)
    assert not fetched.is_error and fetched.output == "ok GET /page "
    assert not called.is_error and called.output == "ok GET /page "
    assert len(first.seen) == 2


async def test_an_allowed_name_through_dns(first: Recorder) -> None:
    """A name on the list is reached wherever it resolves; another name there is not."""
    dns = FakeDNS({"api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    shared = SharedSession(resolver=lambda: dns)
    try:
        tool = WebFetchTool(shared, allow_hosts=["api.test"])
        ok = await tool.execute({"url": f"http://api.test:{first.port}/a"})
        other = await tool.execute({"url": f"http://other.test:{first.port}/b"})
    finally:
        await shared.aclose()
    assert ok.output == "ok GET /a "
    assert other.output.startswith("webfetch: refused to connect to 127.0.0.1 (other.test)")
    assert [path for _, path, _, _ in first.seen] == ["/a"]


async def test_policies_never_share_a_pool_or_a_dns_answer(first: Recorder) -> None:
    """After an allowed tool used a connection to localhost, a guarded one is still refused."""
    shared = SharedSession()
    try:
        allowed = WebFetchTool(shared, allow_hosts=["localhost"])
        strict = WebFetchTool(shared)
        url = f"http://localhost:{first.port}/x"
        assert not (await allowed.execute({"url": url})).is_error
        refused = await strict.execute({"url": url})
        again = await allowed.execute({"url": url})
        assert shared.get(EgressPolicy(["localhost"])) is not shared.get()
        assert shared.get(EgressPolicy(["LOCALHOST"])) is shared.get(EgressPolicy(["localhost"]))
    finally:
        await shared.aclose()
    assert refused.output.startswith("webfetch: refused to connect to 127.0.0.1 (localhost)")
    assert not again.is_error
    assert len(first.seen) == 2
    assert_no_leaks()


async def test_shared_session_closes_every_session_and_resolver(first: Recorder) -> None:
    """aclose closes the session of each policy and the resolver each one was given."""
    made: list[FakeDNS] = []

    def resolver() -> FakeDNS:
        made.append(FakeDNS({"api.test": ["127.0.0.1"]}))
        return made[-1]

    shared = SharedSession(resolver=resolver)
    sessions = [shared.get(), shared.get(EgressPolicy(["api.test"]))]
    assert repr(shared) == "SharedSession(open)"
    await shared.aclose()
    assert all(session.closed for session in sessions)
    assert len(made) == 2 and all(dns.closed for dns in made)
    with pytest.raises(UsageError, match="closed"):
        shared.get()


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("http://127.0.0.1:{port}/inside", "a loopback address"),
        ("http://internal.test:{port}/inside", "a loopback address"),
        ("http://[::ffff:127.0.0.1]:{port}/inside", "a loopback address (IPv4-mapped"),
        ("http://0.0.0.0:{port}/inside", "an unspecified address"),
    ],
)
async def test_a_redirect_to_a_refused_address_is_refused_at_the_hop(
    first: Recorder, second: Recorder, target: str, reason: str
) -> None:
    """An allowed server redirecting inward: the hop is refused, the target sees nothing."""
    dns = FakeDNS({"api.test": ["127.0.0.1"], "internal.test": ["127.0.0.1"]})
    inside = target.format(port=second.port)
    start = redirect(first, 302, inside).replace("127.0.0.1", "api.test", 1)
    fetched, called = await guarded(
        lambda: SharedSession(resolver=lambda: dns), ["api.test"], start
    )
    for result in (fetched, called):
        assert result.is_error
        assert "refused to connect to " in result.output
        assert (
            f"after a redirect from {first.url}/to/302?url=http".replace("127.0.0.1", "api.test")
            in result.output
        )
        assert reason in result.output and HOW in result.output
    assert len(first.seen) == 2
    assert second.seen == []


async def test_a_redirect_to_another_scheme_is_refused(first: Recorder) -> None:
    """Only http and https are followed."""
    fetched, called = await guarded(
        SharedSession, ["127.0.0.1"], redirect(first, 302, "file:///etc/passwd")
    )
    for result in (fetched, called):
        assert result.is_error and "refused to follow a redirect from" in result.output
        assert "file:///etc/passwd: only http:// and https://" in result.output


async def test_redirects_are_followed_at_most_max_redirects_times(first: Recorder) -> None:
    """A redirect loop stops after max_redirects hops with an error result."""
    fetched, called = await guarded(
        SharedSession, ["127.0.0.1"], first.url + "/loop", max_redirects=3
    )
    for result in (fetched, called):
        assert result.is_error and "at most 3 redirects are followed" in result.output
    assert len(first.seen) == 2 * 4


async def test_an_allowed_redirect_is_followed(first: Recorder, second: Recorder) -> None:
    """Between allowed servers, redirects work and the metadata names the final URL."""
    shared = SharedSession()
    try:
        tool = WebFetchTool(shared, allow_hosts=["127.0.0.1"])
        result = await tool.execute({"url": redirect(first, 308, second.url + "/end")})
    finally:
        await shared.aclose()
    assert result.output == "ok GET /end "
    assert result.metadata is not None and result.metadata["url"] == second.url + "/end"


@pytest.mark.parametrize(
    ("status", "method", "then", "body_kept"),
    [
        (303, "POST", "GET", False),
        (303, "PUT", "GET", False),
        (302, "POST", "GET", False),
        (301, "POST", "GET", False),
        (301, "PUT", "PUT", True),
        (307, "POST", "POST", True),
        (308, "PUT", "PUT", True),
    ],
)
async def test_redirect_methods(
    first: Recorder, second: Recorder, status: int, method: str, then: str, body_kept: bool
) -> None:
    """303 (and 301/302 after POST) become a GET without body; 307/308 keep both."""
    shared = SharedSession()
    try:
        tool = http_tool(
            "api",
            "d",
            method,
            redirect(first, status, second.url + "/next"),
            {"type": "object", "properties": {"name": {"type": "string"}}},
            session=shared,
            allow_hosts=["127.0.0.1"],
        )
        result = await tool.execute({"name": "n"})
    finally:
        await shared.aclose()
    assert not result.is_error, result.output
    ((seen_method, _, headers, body),) = second.seen
    assert seen_method == then
    assert body == (b'{"name": "n"}' if body_kept else b"")
    assert ("Content-Type" in headers) is body_kept


async def test_secret_headers_stay_with_their_origin(
    first: Recorder, second: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across origins, Authorization, Cookie and secret headers are dropped; within, kept."""
    monkeypatch.setenv("TN_EGRESS_TOKEN", SECRET)
    headers = {
        "Authorization": "Bearer ${TN_EGRESS_TOKEN}",
        "Cookie": "session=abc",
        "X-Api-Key": SECRET,
        "Accept": "text/plain",
    }
    shared = SharedSession()
    try:
        for url in (
            redirect(first, 307, first.url + "/same"),
            redirect(first, 307, second.url + "/other"),
        ):
            tool = http_tool(
                "api",
                "d",
                "GET",
                url,
                {},
                headers=headers,
                session=shared,
                allow_hosts=["127.0.0.1"],
            )
            assert not (await tool.execute({})).is_error
    finally:
        await shared.aclose()
    sent = {path: seen for _, path, seen, _ in first.seen + second.seen}
    assert sent["/same"]["Authorization"] == f"Bearer {SECRET}"
    assert sent["/same"]["X-Api-Key"] == SECRET and sent["/same"]["Cookie"] == "session=abc"
    other = sent["/other"]
    assert "Authorization" not in other and "X-Api-Key" not in other and "Cookie" not in other
    assert other["Accept"] == "text/plain"
    assert SECRET not in repr(other)


async def test_a_refusal_shows_no_header_value(
    first: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal result names the address and the URL, never a header value."""
    monkeypatch.setenv("TN_EGRESS_TOKEN", SECRET)
    shared = SharedSession()
    try:
        tool = http_tool(
            "api",
            "d",
            "GET",
            f"http://localhost:{first.port}/",
            {},
            headers={"Authorization": "Bearer ${TN_EGRESS_TOKEN}"},
            session=shared,
        )
        result = await tool.execute({})
    finally:
        await shared.aclose()
    assert result.output.startswith(f"api: GET http://localhost:{first.port}/: refused to")
    assert SECRET not in result.output and first.seen == []
