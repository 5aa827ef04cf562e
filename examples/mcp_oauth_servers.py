"""An authorization server and an MCP server it protects, on two loopback ports, to try the
sign-in of docs/mcp.md with (and the sign-in tests' counterpart). Run as
``python examples/mcp_oauth_servers.py``; it prints
``READY <authorization server URL> <MCP endpoint URL>`` once both listen. For trying only:
everything is in memory, and whoever opens a sign-in link is signed in at once.

- The authorization server is the SDK's own routes (``create_auth_routes``: metadata,
  dynamic registration, authorize, token with PKCE, refresh, revoke) over the in-memory
  :class:`Provider` below. Its authorize step sends the person to ``/login``, which signs
  them in at once (no form: a test's HTTP GET is the browser) and redirects to the client's
  redirect URI with the code, the state and ``iss``.
- The MCP server is the SDK's ``MCPServer`` with its auth support (bearer tokens checked
  against the provider, protected resource metadata naming the authorization server), and
  scope ``read`` required. Its tool ``admin_report`` wants scope ``admin`` too: a call
  without it is refused with 403 ``insufficient_scope`` (the step-up challenge), by
  :class:`_StepUp`.
- ``FIXED_CLIENT=<id>:<secret>:<redirect URI>`` in the environment pre-registers a client.
- ``GET /admin/stats`` on the authorization server counts registrations, code exchanges and
  refreshes, and ``POST /admin/expire`` makes every access token issued so far expired.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from typing import Any

import anyio
import uvicorn
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    IdentityAssertionParams,
    ProviderTokenVerifier,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SCOPES = ["read", "admin"]


class Provider:
    """An authorization server's state, in memory."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.asked: dict[str, tuple[str, AuthorizationParams]] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.tokens: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.stats = {"registered": 0, "exchanged": 0, "refreshed": 0}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        # Registered for every scope this server knows: asking for more later (step-up)
        # needs no new registration.
        client_info.scope = " ".join(SCOPES)
        self.clients[client_info.client_id or ""] = client_info
        self.stats["registered"] += 1

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        key = secrets.token_urlsafe(16)
        self.asked[key] = (client.client_id or "", params)
        return f"{self.issuer}/login?asked={key}"

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        code = self.codes.get(authorization_code)
        return code if code is not None and code.client_id == client.client_id else None

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        del self.codes[authorization_code.code]
        self.stats["exchanged"] += 1
        return self._issue(
            client.client_id or "", authorization_code.scopes, authorization_code.resource
        )

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        token = self.refresh.get(refresh_token)
        return token if token is not None and token.client_id == client.client_id else None

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        del self.refresh[refresh_token.token]
        self.stats["refreshed"] += 1
        return self._issue(
            client.client_id or "", scopes or refresh_token.scopes, refresh_token.resource
        )

    async def exchange_identity_assertion(
        self, client: OAuthClientInformationFull, params: IdentityAssertionParams
    ) -> OAuthToken:
        raise TokenError("unsupported_grant_type", "this server signs people in by link only")

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.tokens.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.tokens.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = "at_" + secrets.token_hex(16), "rt_" + secrets.token_hex(16)
        expires = int(time.time()) + 3600
        self.tokens[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource
        )
        return OAuthToken(
            access_token=access, expires_in=3600, scope=" ".join(scopes), refresh_token=refresh
        )

    # -- the person's side, and the tests' -------------------------------------------------

    async def login(self, request: Request) -> Response:
        asked = self.asked.pop(request.query_params.get("asked", ""), None)
        if asked is None:
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        client_id, params = asked
        code = "code_" + secrets.token_hex(16)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or ["read"],
            expires_at=time.time() + 300,
            client_id=client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        # RFC 9207: iss exactly as the metadata spells the issuer (with its root slash).
        iss = str(AnyHttpUrl(self.issuer))
        target = construct_redirect_uri(
            str(params.redirect_uri), code=code, state=params.state, iss=iss
        )
        return RedirectResponse(target, status_code=302)

    async def stats_route(self, request: Request) -> Response:
        return JSONResponse(self.stats)

    async def expire(self, request: Request) -> Response:
        for token in self.tokens.values():
            token.expires_at = 0
        return JSONResponse({"expired": len(self.tokens)})


class _StepUp:
    """Calls of ``admin_report`` need scope ``admin``: without it, 403 insufficient_scope."""

    def __init__(self, app: ASGIApp, provider: Provider, metadata_url: str) -> None:
        self.app, self.provider, self.metadata_url = app, provider, metadata_url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if _calls_admin(body):
            headers = dict(scope["headers"])
            bearer = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
            token = await self.provider.load_access_token(bearer)
            if token is not None and "admin" not in token.scopes:
                challenge = (
                    f'Bearer error="insufficient_scope", scope="read admin", '
                    f'resource_metadata="{self.metadata_url}"'
                )
                response = JSONResponse(
                    {"error": "insufficient_scope"},
                    status_code=403,
                    headers={"WWW-Authenticate": challenge},
                )
                await response(scope, receive, send)
                return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def _calls_admin(body: bytes) -> bool:
    try:
        message: Any = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(message, dict)
        and message.get("method") == "tools/call"
        and message.get("params", {}).get("name") == "admin_report"
    )


def _socket() -> socket.socket:
    # Listening before uvicorn takes it: a client that connects early waits in the backlog.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


async def main() -> None:
    as_sock, rs_sock = _socket(), _socket()
    issuer = f"http://127.0.0.1:{as_sock.getsockname()[1]}"
    resource = f"http://127.0.0.1:{rs_sock.getsockname()[1]}/mcp"
    provider = Provider(issuer)
    fixed = os.environ.get("FIXED_CLIENT")
    if fixed:
        client_id, secret, redirect = fixed.split(":", 2)
        provider.clients[client_id] = OAuthClientInformationFull(
            client_id=client_id,
            client_secret=secret,
            redirect_uris=[redirect],  # type: ignore[list-item]
            token_endpoint_auth_method="client_secret_post",
            scope=" ".join(SCOPES),
        )
    routes = create_auth_routes(
        provider,
        AnyHttpUrl(issuer),
        client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=SCOPES),
    )
    routes += [
        Route("/login", provider.login),
        Route("/admin/stats", provider.stats_route),
        Route("/admin/expire", provider.expire, methods=["POST"]),
    ]
    authorization_server = Starlette(routes=routes)

    server = MCPServer(
        "guarded",
        token_verifier=ProviderTokenVerifier(provider),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=AnyHttpUrl(resource),
            required_scopes=["read"],
            validate_token_resource=False,
        ),
    )

    @server.tool()
    def whoami() -> str:
        """Who the caller is."""
        return "you are signed in"

    @server.tool()
    def admin_report() -> str:
        """A report that needs the admin scope."""
        return "the admin report"

    metadata_url = resource.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    protected = _StepUp(server.streamable_http_app(), provider, metadata_url)

    def serve(app: ASGIApp) -> uvicorn.Server:
        return uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))

    as_server, rs_server = serve(authorization_server), serve(protected)
    async with anyio.create_task_group() as group:
        group.start_soon(as_server.serve, [as_sock])
        group.start_soon(rs_server.serve, [rs_sock])
        print(f"READY {issuer} {resource}", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    try:
        anyio.run(main)
    except KeyboardInterrupt:
        sys.exit(0)
