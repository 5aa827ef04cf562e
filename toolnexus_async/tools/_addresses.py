"""Which IP addresses are public: the address rule of the egress guard.

Rules of this module:

- A tool connects to public addresses only. Refused are loopback, link-local (the cloud
  metadata service at 169.254.169.254), private, shared (100.64.0.0/10), site-local,
  multicast, unspecified (``0.0.0.0``, ``::``), reserved, and every other address that the
  IANA special-purpose address registries do not call globally reachable, in IPv4 and
  IPv6; in IPv6, everything outside global unicast ``2000::/3``. An IPv6 address that
  carries an IPv4 one (IPv4-mapped ``::ffff:0:0/96``, 6to4 ``2002::/16``, NAT64
  ``64:ff9b::/96``) is judged by the IPv4 address inside alone: refused when it is, public
  when it is public. Teredo (``2001::/32``, a tunnel through a relay to a host behind a
  NAT) is refused whatever it carries, and so is the local-use NAT64 prefix
  ``64:ff9b:1::/48`` (what it translates to is a local choice).
- The tables are this module's own, never :mod:`ipaddress`'s ``is_private`` or
  ``is_global``: those changed between Python releases (3.13, and 3.11/3.12 patch
  releases, for CVE-2024-4032), and a security decision must not change with the
  interpreter. :mod:`ipaddress` only parses and tests membership. An address is shown in
  one spelling on every Python too: an IPv4-mapped one as ``::ffff:127.0.0.1``.
"""

from __future__ import annotations

import ipaddress

__all__ = ("IPAddress", "IPNetwork", "non_public_reason", "spelling")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _nets(*texts: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(text) for text in texts)


# What each refused address is called, most specific first: 127.0.0.1 is not globally
# reachable either, but "loopback" says more. The rows are the entries of the IANA IPv4
# and IPv6 Special-Purpose Address Registries whose "Globally Reachable" is not True (as
# Python 3.13.0's ipaddress lists them, plus 3fff::/20 of 2024), save those judged by
# the IPv4 address they carry (::ffff:0:0/96, 2002::/16, 64:ff9b::/96).
_KINDS: tuple[tuple[str, tuple[IPNetwork, ...]], ...] = (
    ("an unspecified address", _nets("0.0.0.0/32", "::/128")),
    ("a loopback address", _nets("127.0.0.0/8", "::1/128")),
    ("a link-local address", _nets("169.254.0.0/16", "fe80::/10")),
    ("a multicast address", _nets("224.0.0.0/4", "ff00::/8")),
    ("a site-local address", _nets("fec0::/10")),
    ("a Teredo address", _nets("2001::/32")),
    (
        "a private address",
        _nets(
            "0.0.0.0/8",  # "this network"
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.0.0.0/24",  # IETF protocol assignments
            "192.0.2.0/24",  # documentation
            "192.168.0.0/16",
            "198.18.0.0/15",  # benchmarking
            "198.51.100.0/24",  # documentation
            "203.0.113.0/24",  # documentation
            "240.0.0.0/4",  # reserved
            "255.255.255.255/32",  # limited broadcast
            "64:ff9b:1::/48",  # local-use NAT64
            "100::/64",  # discard-only
            "2001::/23",  # IETF protocol assignments
            "2001:db8::/32",  # documentation
            "3fff::/20",  # documentation
            "fc00::/7",  # unique local
        ),
    ),
    ("a non-public address", _nets("100.64.0.0/10")),  # shared (carrier-grade NAT)
)
# Inside the rows above, yet globally reachable by the registries: anycast services
# (PCP, TURN, AMT, AS112) and ORCHIDv2 and drone identifiers.
_GLOBAL = _nets(
    "192.0.0.9/32",
    "192.0.0.10/32",
    "2001:1::1/128",
    "2001:1::2/128",
    "2001:3::/32",
    "2001:4:112::/48",
    "2001:20::/28",
    "2001:30::/28",
)
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def _embedded_v4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    if address.ipv4_mapped is not None:
        return "IPv4-mapped", address.ipv4_mapped
    if address.sixtofour is not None:
        return "6to4", address.sixtofour
    if address in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _kind(address: IPAddress) -> str | None:
    # Membership only (``in``): it reads the address's bits, the same on every Python.
    if any(address in net for net in _GLOBAL):
        return None
    for kind, nets in _KINDS:
        if any(address in net for net in nets):
            return kind
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST:
        return "a reserved address"
    return None


def non_public_reason(address: IPAddress) -> str | None:
    """Why ``address`` is not a public one ("a loopback address", ...), or None if it is.

    An IPv4 address embedded in an IPv6 one (IPv4-mapped, 6to4, NAT64) is unwrapped and
    judged alone; the answer is the same on every Python (this module's own tables).
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_v4(address)
        if embedded is not None:
            label, inner = embedded
            kind = _kind(inner)
            # A public IPv4 address inside: the same host as that address itself.
            return None if kind is None else f"{kind} ({label} {inner})"
    return _kind(address)


def spelling(text: str, address: IPAddress) -> str:
    """``text`` (which parsed as ``address``) as shown, the same on every Python: an
    IPv4-mapped address as ``::ffff:127.0.0.1`` (RFC 5952, section 5). yarl writes a URL's
    host as ``ipaddress`` does, and Python 3.11 and 3.12 write ``::ffff:7f00:1``."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        scope = f"%{address.scope_id}" if address.scope_id else ""
        return f"::ffff:{address.ipv4_mapped}{scope}"
    return text
