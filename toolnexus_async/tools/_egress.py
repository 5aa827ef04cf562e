"""The egress rule: which addresses the HTTP tools may connect to, and how they follow redirects.

Rules of this module:

- A tool connects to public addresses only (``_addresses``: loopback, link-local, private,
  reserved and every other address not globally reachable are refused, the same on every
  Python).
- The only exceptions are the entries of an :class:`EgressPolicy`: host names, addresses
  and networks, IPv4 or IPv6. A name is matched exactly (case and a final dot aside) against
  the host as written in the URL, and lets the tool reach whatever that name resolves to; an
  address or network lets in every host that resolves into it. A bad entry is a
  :class:`UsageError` when the policy is built, never a surprise at call time.
- A name is checked where it is resolved: :class:`GuardResolver` resolves it once, checks
  every address returned and refuses the host if any one is refused, and the connector
  connects only to the addresses it returned, so no second lookup (DNS rebinding) can swap
  them. aiohttp does not resolve an IP-literal host, so :func:`guarded_request` checks the
  literal host of every request itself, redirect hops included; a numeric host that is not a
  canonical IP address (``2130706433``, ``127.1``) is refused, since the system would read
  it as one.
- One policy, one aiohttp session (see :class:`SharedSession`): a pooled connection or a
  cached DNS answer checked under one policy is never used under another. No proxy is ever
  used (a proxy would be the only address checked).
- Redirects are followed by :func:`guarded_request` alone, at most ``max_redirects`` of
  them, each hop checked like the first: http and https only, literal hosts at once, names
  when they are resolved. A 303, and a 301 or 302 answering a POST, continue as a GET
  without a body; 307 and 308 keep the method and the body. Once a hop leaves the origin
  (scheme, host and port), ``Authorization``, ``Proxy-Authorization``, ``Cookie`` and every
  header the caller marks secret are no longer sent.
- A refusal is an :class:`EgressRefused` naming the address, the host and how to allow it;
  the tools turn it into an error result. It never holds a header value.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import aiohttp
import attrs
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from .._core.errors import UsageError
from ._addresses import IPAddress, IPNetwork, non_public_reason, spelling

if TYPE_CHECKING:
    from ._session import SharedSession

__all__ = (
    "MAX_REDIRECTS",
    "EgressPolicy",
    "EgressRefused",
    "GuardResolver",
    "guarded_request",
    "non_public_reason",
)

log = logging.getLogger("toolnexus_async.tools.egress")


MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Sent to the origin they were meant for only; the caller adds its own secret headers.
_ORIGIN_BOUND = frozenset({"authorization", "proxy-authorization", "cookie"})
# They describe a body; once a redirect drops the body they would describe nothing.
_BODY_HEADERS = frozenset({"content-type", "content-length", "content-encoding"})
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_HOW = "add it to allow_hosts to let tools reach it"


class EgressRefused(OSError):
    """The egress guard refused a connection or a redirect; the message says why.

    An :class:`OSError`, because that is what an aiohttp resolver raises for a host it will
    not give an address for. Attributes: ``address`` and ``host`` (None when the refusal is
    about a URL rather than an address) and ``reason``.
    """

    def __init__(
        self,
        message: str,
        *,
        address: str | None = None,
        host: str | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.address = address
        self.host = host
        self.reason = reason

    @classmethod
    def of_address(
        cls, address: str, host: str | None, reason: str, via: URL | None = None
    ) -> EgressRefused:
        """The refusal of ``address`` (which ``host`` resolved to), reached from ``via``."""
        shown = f"[{address}]" if ":" in address else address
        if host is not None and _plain_name(host) != address.lower():
            shown += f" ({host})"
        after = f" after a redirect from {via}" if via is not None else ""
        # An odd spelling cannot be allowed; the same address written plainly can.
        how = _HOW if _is_address(address) else "write the address in its usual form"
        return cls(
            f"refused to connect to {shown}{after}: {reason}; {how}",
            address=address,
            host=host,
            reason=reason,
        )


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _plain_name(host: str) -> str:
    return host.lower().removesuffix(".")


def _looks_numeric(host: str) -> bool:
    """True for a host aiohttp connects to without resolving it (its own heuristic)."""
    return ":" in host or host.replace(".", "").isdigit()


def _host_name(text: str) -> str | None:
    """``text`` as an ASCII host name, lower case; None if it is not one."""
    try:
        ascii_text = text if text.isascii() else text.encode("idna").decode("ascii")
    except UnicodeError:
        return None
    name = _plain_name(ascii_text)
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    # No top-level domain is numeric: "127.1" or "2130706433" is an address written oddly.
    return None if labels[-1].isdigit() else name


def _entry(raw: object) -> str:
    """One allow-list entry in its canonical spelling, or the UsageError naming it."""
    if not isinstance(raw, str):
        raise UsageError(f"allow_hosts entries must be strings, got {raw!r}")
    text = raw.strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if "%" not in bare:
        try:
            return str(ipaddress.ip_address(bare))
        except ValueError:
            pass
        if "/" in bare:
            try:
                return str(ipaddress.ip_network(bare))
            except ValueError as exc:
                raise UsageError(f"allow_hosts: {raw!r} is not a network: {exc}") from None
        name = _host_name(bare)
        if name is not None:
            return name
    raise UsageError(
        f"allow_hosts: {raw!r} is not a host name, an IP address or a network; write a "
        "name such as 'wiki.internal', an address such as '10.0.0.5' or a network such "
        "as '10.0.0.0/8', with no scheme, port or path"
    )


def _entries(hosts: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(hosts, str):
        hosts = (hosts,)
    try:
        given = list(hosts)
    except TypeError:
        raise UsageError(f"allow_hosts must be a list of strings, got {hosts!r}") from None
    # Sorted: equal lists in any order make equal policies, hence one shared session.
    return tuple(sorted({_entry(raw) for raw in given}))


@attrs.frozen
class EgressPolicy:
    """What the HTTP tools may reach beyond public addresses: an allow-list.

    ``EgressPolicy()`` allows nothing non-public. Entries are host names (``"localhost"``),
    addresses (``"127.0.0.1"``, ``"::1"``) and networks (``"10.0.0.0/8"``, ``"fd00::/8"``);
    ``allow_hosts`` holds them canonical and sorted, so equal lists give equal policies.
    """

    allow_hosts: tuple[str, ...] = attrs.field(default=(), converter=_entries)
    _names: frozenset[str] = attrs.field(init=False, eq=False, repr=False)
    _networks: tuple[IPNetwork, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        networks = [e for e in self.allow_hosts if _host_name(e) is None]
        object.__setattr__(self, "_names", frozenset(self.allow_hosts) - set(networks))
        object.__setattr__(self, "_networks", tuple(ipaddress.ip_network(n) for n in networks))

    def allows_name(self, host: str) -> bool:
        """True if ``host``, as written in a URL, is one of the allowed names."""
        return _plain_name(host) in self._names

    def _allows(self, address: IPAddress) -> bool:
        unwrapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return any(address in net or (unwrapped and unwrapped in net) for net in self._networks)

    def check_address(self, address: str, host: str | None = None, via: URL | None = None) -> None:
        """Raise :class:`EgressRefused` unless a tool may connect to ``address``.

        ``host`` is the name it was resolved from, for the message; ``via`` the URL whose
        redirect led here.
        """
        try:
            parsed: IPAddress = ipaddress.ip_address(address)
        except ValueError:
            reason = "a numeric host that is not a canonical IP address"
            raise EgressRefused.of_address(address, host, reason, via) from None
        if self._allows(parsed):
            return
        reason_found = non_public_reason(parsed)
        if reason_found is not None:
            shown = spelling(address, parsed)
            log.info("egress refused: %s (%s): %s", shown, host or shown, reason_found)
            raise EgressRefused.of_address(shown, host, reason_found, via)

    def check_url(self, url: URL, via: URL | None = None) -> None:
        """Refuse a URL that is not http(s), or whose literal host is refused.

        A host name passes here: :class:`GuardResolver` checks it when it is resolved.
        """
        if url.scheme not in ("http", "https") or not url.raw_host:
            where = f"follow a redirect from {via} to" if via is not None else "fetch"
            raise EgressRefused(
                f"refused to {where} {url}: only http:// and https:// URLs can be fetched"
            )
        if _looks_numeric(url.raw_host):
            self.check_address(url.raw_host, via=via)


class GuardResolver(AbstractResolver):
    """An aiohttp resolver that hands out only the addresses ``policy`` lets a tool reach.

    ``inner`` does the lookup (by default the connector's owner passes an
    ``aiohttp.ThreadedResolver``, the system's ``getaddrinfo``); every address it returns is
    checked, and one refused address refuses the host.
    """

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver) -> None:
        self.policy = policy
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if not self.policy.allows_name(host):
            for result in results:
                self.policy.check_address(result["host"], host)
        return results

    async def close(self) -> None:
        await self._inner.close()


def _origin(url: URL) -> tuple[str, str, int | None]:
    return url.scheme, _plain_name(url.raw_host or ""), url.port


@asynccontextmanager
async def guarded_request(
    shared: SharedSession,
    policy: EgressPolicy,
    method: str,
    url: str | URL,
    *,
    headers: Mapping[str, str] | None = None,
    secret_headers: Iterable[str] = (),
    params: Sequence[tuple[str, str]] | None = None,
    json: Any = None,
    data: Any = None,
    max_redirects: int = MAX_REDIRECTS,
) -> AsyncIterator[aiohttp.ClientResponse]:
    """Send ``method url`` under ``policy``, following redirects; yields the last response.

    The response is released when the block ends. Raises :class:`EgressRefused` for a
    refused hop or one redirect too many, and aiohttp's errors for the rest. ``params``
    apply to the first request only; later hops go where the ``Location`` says.
    """
    session = shared.get(policy)
    target = URL(url) if isinstance(url, str) else url
    sent = dict(headers or {})
    secret = _ORIGIN_BOUND | {name.lower() for name in secret_headers}
    via: URL | None = None
    followed = 0
    while True:
        policy.check_url(target, via)
        try:
            response = await session.request(
                method,
                target,
                headers=sent,
                params=params,
                json=json,
                data=data,
                allow_redirects=False,
            )
        except aiohttp.ClientConnectorError as exc:
            refused = exc.os_error
            if isinstance(refused, EgressRefused) and refused.address is not None:
                raise EgressRefused.of_address(
                    refused.address, refused.host, refused.reason, via
                ) from None
            raise
        location = response.headers.get("Location") if response.status in _REDIRECTS else None
        if location is None:
            break
        response.release()
        here = response.url
        target = here.join(URL(location)).with_fragment(None)
        if followed == max_redirects:
            raise EgressRefused(
                f"stopped at a redirect from {here} to {target}: at most {max_redirects} "
                "redirects are followed"
            )
        followed += 1
        status = response.status
        if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
            method, json, data = "GET", None, None
            sent = {k: v for k, v in sent.items() if k.lower() not in _BODY_HEADERS}
        if _origin(target) != _origin(here):
            sent = {k: v for k, v in sent.items() if k.lower() not in secret}
        via, params = here, None
    try:
        yield response
    finally:
        response.release()
