"""The inbox's lock: who may use it, and what every response says about itself.

Rules of this module, checked in this order for every request to every route (unknown
routes included, so nothing can be probed from outside):

1. **Host.** The ``Host`` header must name an allowed host, else 403. Allowed are the
   loopback names (``localhost``, ``127.0.0.1``, ``::1``), every IP literal, and the names
   given as ``allowed_hosts`` (a list: a string or a name that is not one is a
   :class:`UsageError`, as is a port). A DNS-rebinding page reaches the server under the page's own
   name, which is not on the list. An IP literal cannot be rebound: a page at
   ``http://192.0.2.7:8080`` *is* that address, so it is the server's own page, and allowing
   literals lets ``--host 0.0.0.0`` be used by address without more flags.
2. **Origin.** A state-changing request (POST, PUT, PATCH, DELETE) whose ``Origin`` header is
   present must come from the server's own origin, the host and port of its ``Host``
   header, else 403. ``Origin: null`` (a sandboxed frame, a file) is foreign too.
3. **Token.** Unless the app was created with ``insecure_no_auth=True``, the request must
   carry the token as ``Authorization: Bearer <token>``, or a live login session in the
   login cookie, else 401: JSON for the API, a short HTML page for ``GET /``.
   ``GET /?token=<token>`` logs a browser in: it starts a session and sets the cookie
   (``HttpOnly; SameSite=Strict; Path=/``) to the session's id, and answers 303 to ``/``,
   so the token leaves the address bar; a wrong one is 401. The token in a query is read on
   that route only. Tokens are compared in constant time. The cookie's name carries the
   listening port, so two servers on one machine do not log each other out.
   Exempt are exactly :data:`PROBES`, ``GET`` (or ``HEAD``) ``/healthz`` and ``/readyz``:
   a load balancer or an orchestrator asks them without a token, and they tell nothing but
   whether the server serves and whether its store answers. Rules 1 and 2 still apply.
   So is ``GET /oauth/callback`` (:data:`CALLBACKS`): an authorization server sends the
   browser there from another site, without the ``SameSite=Strict`` cookie, and the
   one-use ``state`` it carries is its credential (``_oauth``).
4. **Sessions.** The cookie never holds the token, and a session id is never a token: the
   Bearer header accepts the token alone. Cookies ignore ports, so every server the browser
   visits on this host receives the cookie; what it receives ends when the person logs out
   (``POST /logout``), after :data:`SESSION_IDLE` seconds unused or :data:`SESSION_LIFETIME`
   seconds in all, or when the server stops, and it never reveals the token. The server
   keeps at most :data:`MAX_SESSIONS` sessions (a new one ends the least recently used),
   by the SHA-256 of their ids, so no id is looked up by a comparison a clock could time.
   A state-changing request that logs in by cookie must carry an ``Origin`` header (rule 2
   has checked it is ours): browsers send one with every POST, so the cookie counts only
   for requests a page of this origin makes.
5. **Who asked.** A request the guard admits carries its principal (:func:`principal_of`),
   which an answer is recorded under (``answered_by``): ``"api"`` for the token in the
   Bearer header (every API client holds the one token), ``"session:<12 hex digits>"`` for
   a page's login session (the first digits of the SHA-256 the session is kept by: a
   handle that tells sessions apart and reveals nothing of the id), ``"oauth-callback"``
   for a sign-in's callback, ``"anonymous"`` when the app has no token. Never the token,
   never a session id.
6. **Headers.** Every response the app prepares (errors, files and the event stream
   included) carries :data:`SECURITY_HEADERS`, and a Content-Security-Policy:
   :data:`PAGE_CSP` for HTML, which allows the page's own files and nothing inline,
   :data:`OTHER_CSP` for everything else. No response may be framed by any page.

Neither the token nor a session id reaches a log: the query string is left out of the access
log (see ``_server``) and out of every message here, and neither is in a repr.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import attrs
from aiohttp import hdrs, web

from .._core.errors import UsageError
from ._bodies import ApiError
from ._sessions import Sessions, check_token

__all__ = (
    "GUARD",
    "OTHER_CSP",
    "PAGE_CSP",
    "PROBES",
    "CALLBACKS",
    "SECURITY_HEADERS",
    "TOKEN_ENV",
    "Guard",
    "add_security_headers",
    "guard_requests",
    "log_out",
    "principal_of",
    "security_headers",
)

TOKEN_ENV: Final = "TOOLNEXUS_TOKEN"
LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})
STATE_CHANGING: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The health probes: served without the token (rule 3).
PROBES: Final = frozenset({"/healthz", "/readyz"})
# Where a sign-in comes back (rule 3): its state, not the token, admits it.
CALLBACKS: Final = frozenset({"/oauth/callback"})

PAGE_CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; object-src 'none'; "
    "frame-ancestors 'none'"
)
OTHER_CSP: Final = "default-src 'none'; base-uri 'none'; frame-ancestors 'none'"
SECURITY_HEADERS: Final = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # a login URL holds the token
    "Cross-Origin-Resource-Policy": "same-origin",
}

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[0-9]{1,5}")
_LOGIN_PAGE = b"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>toolnexus inbox: log in</title></head>
<body>
<h1>This inbox needs its token</h1>
<p>Open the address that <code>toolnexus-async serve</code> printed when it started. It
looks like <code>http://127.0.0.1:8080/?token=...</code>; the token is different each
time the server starts, unless it was given with <code>--token</code> or
<code>TOOLNEXUS_TOKEN</code>.</p>
<p>Opened that address already, from a link on another site? Then your browser logged
in but held the login back on that visit: <a href="/">open the inbox</a> from here.</p>
</body>
</html>
"""


@attrs.frozen
class Guard:
    """What an app checks: its token (None: no token check), the host names it allows, and
    the browsers logged in."""

    token: str | None = attrs.field(repr=False)  # never in a log line, not even this way
    allowed_hosts: frozenset[str] = attrs.field()
    sessions: Sessions = attrs.field(factory=Sessions, repr=False, eq=False)

    @classmethod
    def create(
        cls, token: str | None, *, insecure_no_auth: bool, allowed_hosts: Iterable[str]
    ) -> Guard:
        if token is None and not insecure_no_auth:
            raise UsageError(
                "the inbox needs a token (new_token() makes one); "
                "pass insecure_no_auth=True to serve without one"
            )
        if token is not None and insecure_no_auth:
            raise UsageError("give a token or insecure_no_auth=True, not both")
        if isinstance(allowed_hosts, str | bytes):
            # Iterated, "wiki" would allow the hosts "w", "i" and "k".
            raise UsageError(
                f"allowed_hosts must be a list of host names, got the string {allowed_hosts!r}"
            )
        names = set(LOOPBACK_NAMES)
        for name in allowed_hosts:
            if not isinstance(name, str):
                raise UsageError(f"an allowed host is a host name (a str), got {name!r}")
            parsed = (name.lower(), None) if _is_ip(name) else parse_host(name)
            if parsed is None or parsed[1] is not None:
                raise UsageError(f"an allowed host is a host name without a port, got {name!r}")
            names.add(parsed[0])
        return cls(None if token is None else check_token(token), frozenset(names))

    def allows(self, host: str) -> bool:
        return host in self.allowed_hosts or _is_ip(host)

    def matches(self, candidate: str | None) -> bool:
        if self.token is None or candidate is None:
            return False
        return hmac.compare_digest(
            candidate.encode("utf-8", "backslashreplace"), self.token.encode()
        )


GUARD = web.AppKey("toolnexus_guard", Guard)


def principal_of(request: web.Request) -> str:
    """Who the guard admitted ``request`` as (rule 5), for a handler of a route the guard
    checks: read again from what it checked (no request storage, which aiohttp types
    differently across its versions)."""
    guard = request.app[GUARD]
    if guard.token is None:
        return "anonymous"
    if request.path in CALLBACKS:
        return "oauth-callback"
    if guard.matches(_bearer(request)):
        return "api"
    cookie = request.cookies.get(cookie_name(request))
    # The guard let it through on this cookie (rule 3), checked a moment ago.
    return Sessions.handle(cookie) if cookie is not None else "anonymous"


def parse_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header (name lowercased, no brackets); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or not _is_ip(name) or ":" not in name:
            return None
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
        name = name.removesuffix(".")
        if not _HOST_NAME.fullmatch(name):
            return None
    if not rest:
        return name, None
    if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]):
        return None
    return name, int(rest[1:])


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def same_origin(origin: str, host: tuple[str, int | None]) -> bool:
    """Whether an ``Origin`` header names the server that the ``Host`` header names."""
    scheme, sep, authority = origin.strip().lower().partition("://")
    default = {"http": 80, "https": 443}.get(scheme)
    parsed = parse_host(authority) if sep and default is not None else None
    if parsed is None:
        return False  # "null", or not an http(s) origin
    name, port = parsed
    # A Host without a port means the scheme's default, which only the Origin tells.
    return name == host[0] and (port or default) == (host[1] or default)


def _port_suffix(request: web.BaseRequest) -> str:
    transport = request.transport
    address = transport.get_extra_info("sockname") if transport is not None else None
    if isinstance(address, tuple) and len(address) >= 2:
        return f"_{address[1]}"
    return ""


def cookie_name(request: web.BaseRequest) -> str:
    """The login cookie's name: with the listening port, as cookies ignore ports."""
    return f"toolnexus_session{_port_suffix(request)}"


def _old_cookie_name(request: web.BaseRequest) -> str:
    # Before sessions, the login cookie held the token itself under this name; a login or a
    # logout deletes it, so a browser stops handing the token to every local server.
    return f"toolnexus_token{_port_suffix(request)}"


def _bearer(request: web.Request) -> str | None:
    scheme, _, credentials = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


def _is_page(request: web.Request) -> bool:
    return request.path == "/" and request.method in ("GET", "HEAD")


def _is_probe(request: web.Request) -> bool:
    if request.path in CALLBACKS:
        return request.method == "GET"
    return request.path in PROBES and request.method in ("GET", "HEAD")


def _login_page() -> web.Response:
    return web.Response(
        status=401,
        body=_LOGIN_PAGE,
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


def _log_in(request: web.Request, guard: Guard) -> web.Response:
    """``GET /?token=...``: a session's cookie and a way back to ``/``, or the login page."""
    if not guard.matches(request.query.get("token")):
        return _login_page()
    response = web.Response(status=303, headers={hdrs.LOCATION: "/", "Cache-Control": "no-store"})
    response.set_cookie(
        cookie_name(request),
        guard.sessions.start(),
        path="/",
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )
    _delete_old_cookie(request, response)
    return response


async def log_out(request: web.Request) -> web.Response:
    """``POST /logout``: ends the session of the request's cookie and deletes the cookie."""
    cookie = request.cookies.get(cookie_name(request))
    if cookie is not None:
        request.app[GUARD].sessions.end(cookie)
    response = web.Response(status=204, headers={"Cache-Control": "no-store"})
    response.del_cookie(cookie_name(request), path="/", httponly=True, samesite="Strict")
    _delete_old_cookie(request, response)
    return response


def _delete_old_cookie(request: web.Request, response: web.StreamResponse) -> None:
    if _old_cookie_name(request) in request.cookies:
        response.del_cookie(_old_cookie_name(request), path="/", httponly=True, samesite="Strict")


@web.middleware
async def guard_requests(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Rules 1 to 4 of the module docstring; the handler runs only if all pass."""
    guard = request.app[GUARD]
    raw_host = request.headers.get(hdrs.HOST, "")
    host = parse_host(raw_host)
    if host is None or not guard.allows(host[0]):
        raise ApiError(
            403,
            f"this server does not answer to the host {raw_host[:100]!r}; "
            "start it with --allowed-host NAME to allow a name",
        )
    origin = request.headers.get(hdrs.ORIGIN)
    if request.method in STATE_CHANGING and origin is not None:
        if not same_origin(origin, host):
            raise ApiError(403, f"a request from another site ({origin[:100]!r}) is refused")
    if guard.token is None or _is_probe(request):
        return await handler(request)
    if _is_page(request) and "token" in request.query:
        return _log_in(request, guard)
    if guard.matches(_bearer(request)):
        return await handler(request)
    cookie = request.cookies.get(cookie_name(request))
    if cookie is not None and guard.sessions.check(cookie):
        if request.method in STATE_CHANGING and origin is None:
            raise ApiError(
                403,
                "a request that logs in with the page's cookie must come from the page, "
                "which sends Origin; a script sends Authorization: Bearer <token>",
            )
        return await handler(request)
    if _is_page(request):
        return _login_page()
    raise ApiError(
        401,
        "this inbox needs its token: send Authorization: Bearer <token>, or open the "
        "address toolnexus-async serve printed (http://.../?token=...)",
        headers={
            hdrs.WWW_AUTHENTICATE: 'Bearer realm="toolnexus inbox"',
            "Cache-Control": "no-store",
        },
    )


def security_headers(*, html: bool) -> dict[str, str]:
    """The headers rule 5 puts on a response (an HTML one, or any other)."""
    headers = {**SECURITY_HEADERS, "Content-Security-Policy": PAGE_CSP if html else OTHER_CSP}
    if html:
        headers["Cross-Origin-Opener-Policy"] = "same-origin"
    return headers


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: rule 5, on every response the app sends."""
    response.headers.update(security_headers(html=response.content_type == "text/html"))
