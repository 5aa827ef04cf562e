"""Signing in to a remote MCP server (OAuth 2.1): the provider, the store, the exchange.

Rules of this module (what a link becomes in a run, a suspension, and how its redirect
answers it is :mod:`._sign_in`'s):

- The SDK's ``OAuthClientProvider`` does the protocol: discovery (RFC 9728 protected
  resource metadata, RFC 8414 authorization server metadata), dynamic client registration
  (RFC 7591) or a pre-registered client, the scopes a server challenges for and step-up
  (a 403 ``insufficient_scope``), and refreshing a token before it expires. Its one inline
  step, sending the person to the authorization URL and awaiting the code inside the HTTP
  request that needed it, is replaced (``_oauth_flow``): the link and what its exchange
  needs (the PKCE verifier, the token endpoint, the client) are kept in the
  :class:`~._tokens.TokenStore`, and the HTTP request goes on without a token, so its 401
  (or 403) reaches the session as that one call's error while the session lives.
- The redirect's code is recorded beside its sign-in under way (:meth:`ServerSignIn.note_code`,
  the first code only); the retry exchanges it (:meth:`ServerSignIn.complete`), in whichever
  process it runs: the sign-in is taken out of the store first, so a state works once.
- Tokens, client secrets, verifiers and codes are secrets: they are kept in the token store
  only, never put in a message, a log record or a repr. The SDK logs "OAuth flow error"
  with a traceback for any exception in its flow; the one this module raises on purpose is
  dropped from that logger (``_oauth_flow._Quiet``).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import httpx2
from mcp.client.auth.utils import handle_token_response_scopes, validate_authorization_response_iss
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
)

from .._core.secrets import Scrubber
from .._core.types import Answer
from ..tools._headers import expand_headers
from ._config import OAuthConfig, ServerConfig
from ._oauth_flow import SignInLink, _Noticing, _Provider
from ._tokens import TokenStore

__all__ = ("ServerSignIn", "SignInLink")

log = logging.getLogger("toolnexus_async.mcp")

# Sign-ins under way kept per server: each link asked for adds one, each use removes it.
# A person who never comes back leaves one behind; the oldest go first.
MAX_UNDER_WAY = 16
_CLIENT_NAME = "toolnexus-async"


class ServerSignIn:
    """One remote server's sign-in: its provider, its record in the token store, its links."""

    def __init__(
        self, config: ServerConfig, oauth: OAuthConfig, tokens: TokenStore, redirect: str | None
    ) -> None:
        self.config = config
        self.oauth = oauth
        self.tokens = tokens
        self.redirect = oauth.redirect_uri or redirect
        self.interactive = False  # links are made for calls, not while connecting
        self.was_connected = False  # its tools are offered (not its sign-in tool)
        self.needed = False  # a request was refused for want of a sign-in
        self.links: list[SignInLink] = []  # made and not yet handed to a call
        self._key = f"mcp-oauth {config.name} {config.url}"
        self._under_way_key = f"mcp-oauth-under-way {config.name} {config.url}"
        self._lock = anyio.Lock()
        self._fixed: OAuthClientInformationFull | None = None
        self.scrub = Scrubber(())
        self._provider: _Provider | None = None

    def __repr__(self) -> str:
        return f"ServerSignIn(server={self.config.name!r})"

    # -- the HTTP client's auth ----------------------------------------------------------------

    def auth(self) -> httpx2.Auth | str:
        """The auth of the server's HTTP client, made anew for each connection (pre-registered
        client values expanded now), or why it cannot be made."""
        self.needed = False
        if self.redirect is None:
            return _Noticing(self)
        given = {
            k: v
            for k, v in (("id", self.oauth.client_id), ("secret", self.oauth.client_secret))
            if v
        }
        expanded = expand_headers(given, "oauth client value")
        if isinstance(expanded, str):
            return expanded
        values, hidden, _ = expanded
        self.scrub = Scrubber(hidden)
        method = "client_secret_post" if "secret" in values else "none"
        metadata = OAuthClientMetadata(
            redirect_uris=[self.redirect],  # type: ignore[list-item]
            client_name=_CLIENT_NAME,
            scope=self.oauth.scope,
            grant_types=["authorization_code", "refresh_token"],
            token_endpoint_auth_method=method,  # type: ignore[arg-type]
        )
        self._fixed = None
        if "id" in values:
            self._fixed = OAuthClientInformationFull(
                client_id=values["id"],
                client_secret=values.get("secret"),
                redirect_uris=[self.redirect],  # type: ignore[list-item]
                token_endpoint_auth_method=method,
                scope=self.oauth.scope,
            )
        self._provider = _Provider(self, metadata)
        return self._provider

    def connected(self) -> None:
        """The server connected: a call refused from now on gets a link."""
        self.interactive = self.was_connected = True

    def fixed_client(self) -> OAuthClientInformationFull | None:
        return self._fixed

    def why(self) -> str:
        """What a server refused for want of a sign-in needs, said for its status."""
        if self.redirect is None:
            return (
                "the server asks for a sign-in (HTTP 401), and no redirect URI is set: give "
                "oauth.redirectUri in its config, or Toolkit.create(mcp_redirect_uri=...)"
            )
        if self.was_connected:
            return "the server asks for a sign-in again: the next call of its tools asks the person"
        tool = f"{self.config.name}_sign_in"
        return f"the server asks for a sign-in first: its tool {tool!r} asks the person"

    # -- the record in the token store ---------------------------------------------------------

    async def record(self) -> dict[str, Any]:
        return await self.tokens.get(self._key) or {}

    async def update(self, **fields: Any) -> None:
        async with self._lock:
            record = await self.record()
            record.update(fields)
            await self.tokens.set(self._key, record)

    async def keep_under_way(self, state: str, entry: dict[str, Any]) -> None:
        async with self._lock:
            under_way = await self.tokens.get(self._under_way_key) or {}
            under_way[state] = entry
            for old in sorted(under_way, key=lambda s: under_way[s].get("made", 0))[
                :-MAX_UNDER_WAY
            ]:
                del under_way[old]
            await self.tokens.set(self._under_way_key, under_way)

    async def note_code(self, state: str, code: str | None, iss: str | None) -> str | None:
        """Record the code the redirect brought for ``state`` (the first one only); the id
        of the request it answers, or ``None`` when no sign-in under way has that state."""
        async with self._lock:
            under_way = await self.tokens.get(self._under_way_key) or {}
            entry = under_way.get(state)
            if entry is None:
                return None
            if "code" not in entry:
                entry["code"], entry["iss"] = code, iss
                await self.tokens.set(self._under_way_key, under_way)
            return str(entry["request"])

    async def take(self, state: str) -> dict[str, Any] | None:
        """The sign-in under way with ``state``, taken out of the store: it works once."""
        async with self._lock:
            under_way = await self.tokens.get(self._under_way_key) or {}
            entry: dict[str, Any] | None = under_way.pop(state, None)
            if entry is not None:
                await self.tokens.set(self._under_way_key, under_way or None)
            return entry

    # -- signing in ----------------------------------------------------------------------------

    def take_link(self) -> SignInLink | None:
        return self.links.pop(0) if self.links else None

    async def begin(self) -> SignInLink | str | None:
        """A new sign-in link for a server that is not connected: one request to it, which
        the provider's flow answers (discovery, registration); ``None`` when the server
        answers it without a sign-in (signed in meanwhile), or why no link was made."""
        auth = self._provider or self.auth()
        if isinstance(auth, str):
            return auth
        probe = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
        headers = {"Accept": "application/json, text/event-stream"}
        self.interactive = True
        try:
            async with httpx2.AsyncClient(auth=auth, timeout=self.config.timeout) as http:
                assert self.config.url is not None
                response = await http.post(self.config.url, json=probe, headers=headers)
        except Exception as exc:
            return self.scrub(f"the sign-in could not begin: {type(exc).__name__}: {exc}")
        link = self.take_link()
        if link is not None:
            return link
        if response.status_code in (401, 403):
            return self.why() if self.redirect is None else "the server refused the sign-in"
        return None

    async def complete(self, state: str, answer: Answer) -> str | None:
        """Exchange the code the redirect of sign-in ``state`` brought for tokens; why it
        failed, or ``None``. The sign-in is used up either way."""
        entry = await self.take(state)
        if entry is None:
            return "this sign-in was used already, or is unknown: sign in again"
        if not answer.ok:
            return "the sign-in was not completed"
        code = entry.get("code")
        if not isinstance(code, str) or not code:
            return "the sign-in did not come back with a code"
        try:
            metadata = entry.get("metadata")
            validate_authorization_response_iss(
                entry.get("iss"),
                None if metadata is None else OAuthMetadata.model_validate(metadata),
            )
        except Exception as exc:
            return f"the sign-in came back from another server: {exc}"
        provider = self._provider
        if provider is None:
            auth = self.auth()
            if isinstance(auth, str):
                return auth
            provider = self._provider
        assert provider is not None
        return await self._exchange(provider, entry, code)

    async def _exchange(self, provider: _Provider, entry: dict[str, Any], code: str) -> str | None:
        context = provider.context
        if context.client_info is None:
            context.client_info = await context.storage.get_client_info()
        if context.client_info is None or context.client_info.client_id != entry["client_id"]:
            return "the client this sign-in was made for is not registered any more: sign in again"
        data = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": entry["redirect_uri"],
            "client_id": entry["client_id"],
            "code_verifier": entry["verifier"],
        }
        if entry.get("resource"):
            data["resource"] = entry["resource"]
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        data, headers = context.prepare_token_auth(data, headers)
        try:
            async with httpx2.AsyncClient(timeout=self.config.timeout) as http:
                response = await http.post(entry["token_url"], data=data, headers=headers)
                if response.status_code not in (200, 201):
                    return f"the authorization server refused the code: {_oauth_error(response)}"
                token = await handle_token_response_scopes(response)
        except Exception as exc:
            return self.scrub(f"the code could not be exchanged: {type(exc).__name__}")
        if token.scope is None:
            token.scope = entry.get("scope")
        context.current_tokens = token
        context.update_token_expiry(token)
        await context.storage.set_tokens(token)
        await self.update(
            metadata=entry.get("metadata"), resource_metadata=entry.get("resource_metadata")
        )
        if context.oauth_metadata is None and entry.get("metadata") is not None:
            context.oauth_metadata = OAuthMetadata.model_validate(entry["metadata"])
        self.needed = False
        log.info("MCP server %r: signed in", self.config.name)
        return None

    async def forget(self, state: str) -> None:
        await self.take(state)


def _oauth_error(response: httpx2.Response) -> str:
    """The RFC 6749 error code of a refusal (never its body: it might echo what was sent)."""
    try:
        error = response.json().get("error")
    except Exception:
        error = None
    return f"HTTP {response.status_code}" + (f" ({error})" if isinstance(error, str) else "")
