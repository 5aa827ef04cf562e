"""The egress guard: the address rules, the allow-list, the guarding resolver and the
sessions built on it.

Names are resolved by :class:`FakeDNS`, which stands in for a DNS server that answers what
a test says; nothing here opens a connection.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from toolnexus_async import UsageError
from toolnexus_async.tools._egress import (
    EgressPolicy,
    EgressRefused,
    GuardResolver,
    non_public_reason,
)
from toolnexus_async.tools._session import SharedSession

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
        "2002:5db8:d822::1",
        "64:ff9b::5db8:d822",
    ],
)
def test_public_addresses_pass(address: str) -> None:
    """A public address, plain or embedded in IPv6, is not refused."""
    assert non_public_reason(ipaddress.ip_address(address)) is None
    EgressPolicy().check_address(address)


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


# -- the shared sessions -------------------------------------------------------------


async def test_shared_session_closes_every_session_and_resolver() -> None:
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
