"""The SDK's OAuth flow for one server, with its one step that waits for a person replaced.

Rule of this module: the SDK's ``OAuthClientProvider`` does the protocol; this module only
keeps what the SDK keeps in memory in our token store (:class:`_Storage`, and the expiry
and discovered metadata :meth:`_Provider._initialize` restores after a restart) and, where
the SDK would send the person to the authorization URL and wait inside the HTTP request,
keeps the link and what its exchange needs under way and lets the request go on without a
token (:meth:`_Provider._perform_authorization_code_grant`). What a link becomes (a
suspension) and how it is answered is ``_oauth``'s.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urljoin

import attrs
import httpx2
from mcp.client.auth import OAuthClientProvider, PKCEParameters
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp.shared.auth_utils import calculate_token_expiry

if TYPE_CHECKING:
    from ._oauth import ServerSignIn

__all__ = ("SignInLink",)


class _SignInNeeded(Exception):
    """Raised inside the SDK's flow where it would wait for a person: the flow stops there."""


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _SignInNeeded)


logging.getLogger("mcp.client.auth.oauth2").addFilter(_Quiet())


@attrs.frozen
class SignInLink:
    """A sign-in link made for one request: where to send the person, and its state."""

    url: str = attrs.field(repr=False)
    state: str = attrs.field(repr=False)
    request_id: str


class _Storage:
    """The SDK's ``TokenStorage`` over one server's record in our :class:`TokenStore`."""

    def __init__(self, sign_in: ServerSignIn) -> None:
        self._sign_in = sign_in

    async def get_tokens(self) -> OAuthToken | None:
        kept = (await self._sign_in.record()).get("tokens")
        return None if kept is None else OAuthToken.model_validate(kept)

    async def set_tokens(self, tokens: OAuthToken) -> None:
        await self._sign_in.update(
            tokens=tokens.model_dump(mode="json", exclude_none=True),
            # Absolute: the SDK keeps the expiry in memory only, and a token loaded after a
            # restart would otherwise look valid for ever (and be refused, not refreshed).
            expires_at=calculate_token_expiry(tokens.expires_in),
        )

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        fixed = self._sign_in.fixed_client()
        if fixed is not None:
            return fixed
        kept = (await self._sign_in.record()).get("client")
        return None if kept is None else OAuthClientInformationFull.model_validate(kept)

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self._sign_in.fixed_client() is None:
            await self._sign_in.update(
                client=client_info.model_dump(mode="json", exclude_none=True)
            )


class _Provider(OAuthClientProvider):
    """The SDK's provider, with its wait for a person replaced by a link kept in the store."""

    def __init__(self, sign_in: ServerSignIn, metadata: OAuthClientMetadata) -> None:
        assert sign_in.config.url is not None
        super().__init__(sign_in.config.url, metadata, _Storage(sign_in))
        self._sign_in = sign_in

    async def _initialize(self) -> None:
        await super()._initialize()
        # What the SDK keeps in memory only, from the sign-in that brought the tokens: a
        # refresh after a restart must reach the token endpoint discovered then.
        record = await self._sign_in.record()
        context = self.context
        context.token_expiry_time = record.get("expires_at")
        if context.oauth_metadata is None and record.get("metadata") is not None:
            context.oauth_metadata = OAuthMetadata.model_validate(record["metadata"])
        kept = record.get("resource_metadata")
        if context.protected_resource_metadata is None and kept is not None:
            context.protected_resource_metadata = ProtectedResourceMetadata.model_validate(kept)

    async def _perform_authorization_code_grant(self) -> tuple[str, str]:
        sign_in = self._sign_in
        sign_in.needed = True
        if not sign_in.interactive:
            raise _SignInNeeded  # connecting: the server waits for its sign-in tool
        context = self.context
        client = context.client_info
        redirects = context.client_metadata.redirect_uris
        if client is None or not redirects:
            raise _SignInNeeded
        metadata = context.oauth_metadata
        base = context.get_authorization_base_url(context.server_url)
        endpoint = str(metadata.authorization_endpoint) if metadata else urljoin(base, "/authorize")
        token_url = (
            str(metadata.token_endpoint)
            if metadata and metadata.token_endpoint
            else urljoin(base, "/token")
        )
        pkce = PKCEParameters.generate()
        state = secrets.token_urlsafe(32)
        params = {
            "response_type": "code",
            "client_id": client.client_id,
            "redirect_uri": str(redirects[0]),
            "state": state,
            "code_challenge": pkce.code_challenge,
            "code_challenge_method": "S256",
        }
        resource = None
        if context.should_include_resource_param(context.protocol_version):
            resource = params["resource"] = context.get_resource_url()  # RFC 8707
        scope = context.client_metadata.scope
        if scope:
            params["scope"] = scope
            if "offline_access" in scope.split():
                params["prompt"] = "consent"  # OpenID Connect asks it with offline_access
        link = SignInLink(f"{endpoint}?{urlencode(params)}", state, "req_" + uuid.uuid4().hex)
        await sign_in.keep_under_way(
            state,
            {
                "request": link.request_id,
                "verifier": pkce.code_verifier,
                "redirect_uri": str(redirects[0]),
                "token_url": token_url,
                "client_id": client.client_id,
                "resource": resource,
                "scope": scope,
                "metadata": None if metadata is None else metadata.model_dump(mode="json"),
                "resource_metadata": (
                    None
                    if context.protected_resource_metadata is None
                    else context.protected_resource_metadata.model_dump(mode="json")
                ),
                "made": time.time(),
            },
        )
        sign_in.links.append(link)
        raise _SignInNeeded

    async def _auth_flow(self, request: httpx2.Request) -> Any:
        flow = super()._auth_flow(request)
        try:
            outgoing = await flow.__anext__()
            while True:
                response = yield outgoing
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        except _SignInNeeded:
            # The request goes on unauthenticated: its refusal is this call's error, and
            # the session lives on. (The flow's own lock was released as this unwound.)
            request.headers.pop("Authorization", None)
            yield request
        finally:
            await flow.aclose()


class _Noticing(httpx2.Auth):
    """No sign-in can be made (no redirect URI): a 401 is noticed, to say why it failed."""

    def __init__(self, sign_in: ServerSignIn) -> None:
        self._sign_in = sign_in

    async def async_auth_flow(self, request: httpx2.Request) -> Any:
        response = yield request
        if response.status_code == 401:
            self._sign_in.needed = True
