"""The MCP servers a toolkit loads, read from the ``mcpServers`` config every toolnexus port
shares (the Claude-desktop / opencode format, a superset of it).

Rules of this module:

- Pure: it reads a mapping (or a JSON file) and answers frozen :class:`ServerConfig` values,
  or raises :class:`UsageError` naming the server and the field that is wrong. Nothing here
  imports the MCP SDK, starts a process or reads an environment variable: ``${NAME}`` in a
  header or an environment value is expanded when the server is connected, so a config can
  be checked where the secrets are not.
- The wrapper key is ``mcpServers``, ``servers`` or ``mcp``; without one the object is the
  server map itself, minus the sibling sections other ports keep there (``builtins``,
  ``agents``, ``a2a``, ``mcpServer``).
- ``type`` is ``local`` (stdio: ``command``) or ``remote`` (streamable HTTP: ``url``),
  inferred from which of the two is given. ``command`` is a list, or a string with an
  ``args`` list (Claude desktop's style). ``environment`` has the alias ``env``; ``enabled``
  the inverse alias ``disabled``. ``timeout`` is in milliseconds (default 30000) and bounds
  each phase of connecting (start, handshake, each page of the tool list) on its own.
- Fields other ports do not read are this port's own and additive (a config stays valid
  for every port): ``callTimeout`` (milliseconds one tool call may take, default 300000;
  0 for none) and ``maxReplyBytes`` (the largest SSE event a remote server's reply may
  be, default 16 MiB).
- Header and environment values are secrets: a :class:`ServerConfig`'s ``repr`` names their
  keys only; so is an ``oauth`` client secret (its ``repr`` says whether there is one).
- ``oauth`` (remote servers; opencode's keys ``clientId``, ``clientSecret``, ``scope``, and
  ours, ``redirectUri``): absent, sign-in is used when the server asks for it (a 401), unless
  the headers carry an ``Authorization`` of their own; ``false`` turns it off; an object
  configures it (``clientId`` for a pre-registered client, else the client registers itself
  dynamically). ``${NAME}`` in ``clientId`` or ``clientSecret`` is expanded at connect time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from .._core.errors import UsageError

__all__ = (
    "DEFAULT_CALL_TIMEOUT_MS",
    "DEFAULT_MAX_REPLY_BYTES",
    "DEFAULT_TIMEOUT_MS",
    "McpStatus",
    "OAuthConfig",
    "ServerConfig",
    "load_config",
    "parse_config",
)

DEFAULT_TIMEOUT_MS = 30_000
# pydantic-ai's default: long enough for the slow tools people run (a build, a crawl, a
# query), short enough that a hung server does not hold a run for good. The Agents SDK's
# 5 s would cut ordinary tools (a fetch of a slow page) mid-work.
DEFAULT_CALL_TIMEOUT_MS = 300_000
# The SDK's 1 MiB cut a file read or a screenshot in base64; 16 MiB carries those and
# still bounds what one reply may make this process hold.
DEFAULT_MAX_REPLY_BYTES = 16 * 1024 * 1024
_WRAPPERS = ("mcpServers", "servers", "mcp")
_SIBLINGS = frozenset({"builtins", "agents", "a2a", "mcpServer"})
_FIELDS = frozenset(
    {
        "type",
        "command",
        "args",
        "environment",
        "env",
        "cwd",
        "url",
        "headers",
        "enabled",
        "disabled",
        "timeout",
        "tools",
        "callTimeout",
        "maxReplyBytes",
        "oauth",
    }
)
_OAUTH_FIELDS = frozenset({"clientId", "clientSecret", "scope", "redirectUri"})


def _names(values: Mapping[str, str]) -> str:
    return repr(sorted(values))


def _secret(value: str | None) -> str:
    return "None" if value is None else "'[set]'"


@attrs.frozen
class OAuthConfig:
    """How a remote server's sign-in (OAuth 2.1 with PKCE, docs/mcp.md) is set up.

    Attributes:
        client_id: a client registered beforehand with the server's authorization server;
            without one the client registers itself (dynamic client registration).
        client_secret: that client's secret, if it has one (``${NAME}`` expanded).
        scope: the scopes to ask for, space-separated; without it, what the server says.
        redirect_uri: where the authorization server sends the person back with the code
            (serve's ``/oauth/callback``, or your host's); without it, the toolkit's
            ``mcp_redirect_uri``.
    """

    client_id: str | None = None
    client_secret: str | None = attrs.field(default=None, repr=_secret)
    scope: str | None = None
    redirect_uri: str | None = None


@attrs.frozen
class ServerConfig:
    """One MCP server of the config, checked.

    Attributes:
        name: the key it has in the config (tool names start with it, sanitised).
        type: ``"local"`` (a process spoken to over stdio) or ``"remote"`` (streamable HTTP).
        command: for a local server, the program and its arguments.
        environment: for a local server, variables set for it (``${NAME}`` expanded at
            connect time) on top of the few the MCP SDK passes on (``HOME``, ``PATH``, ...).
        cwd: for a local server, the directory it starts in.
        url: for a remote server, its endpoint.
        headers: for a remote server, sent with every request (``${NAME}`` expanded).
        enabled: False leaves the server out (its status says ``disabled``).
        timeout: seconds each phase of connecting may take.
        tools: an allow- or drop-list on the server's own tool names (see :func:`parse_config`).
        call_timeout: seconds one tool call may take (``callTimeout``), None for no limit.
        max_reply: the largest SSE event, in bytes, a remote server's reply may be
            (``maxReplyBytes``); a larger one fails that call, not the session.
        oauth: for a remote server, its sign-in; ``None`` when it has none (``oauth: false``,
            or headers with an ``Authorization``).
    """

    name: str
    type: Literal["local", "remote"]
    command: tuple[str, ...] = ()
    environment: Mapping[str, str] = attrs.field(factory=dict, repr=_names)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=_names)
    enabled: bool = True
    timeout: float = DEFAULT_TIMEOUT_MS / 1000
    tools: Mapping[str, bool] | None = None
    call_timeout: float | None = DEFAULT_CALL_TIMEOUT_MS / 1000
    max_reply: int = DEFAULT_MAX_REPLY_BYTES
    oauth: OAuthConfig | None = None

    def exposes(self, tool: str) -> bool:
        """Whether the server's tool ``tool`` (its own name) is loaded: every tool without a
        ``tools`` map; with one holding a ``true``, only those; with only ``false`` entries,
        every tool but those."""
        if not self.tools:
            return True
        if any(self.tools.values()):
            return self.tools.get(tool, False)
        return self.tools.get(tool, True)


@attrs.frozen
class McpStatus:
    """Where one configured MCP server stands (``Toolkit.mcp_status``).

    Attributes:
        state: ``"connected"``, ``"disabled"`` (``enabled: false``), ``"needs_auth"`` (a
            remote server that wants a sign-in before it answers: while it waits for its
            first one, its one tool, ``<server>_sign_in``, asks for it; after that, the
            next call of one of its tools does) or ``"failed"`` (it did not start, answer
            or list its tools in time, or its session ended and has not been connected
            again yet).
        error: for ``failed``, what went wrong (secrets scrubbed), and when it is tried
            again; for ``needs_auth``, how the sign-in is asked for.
        protocol: the protocol version negotiated (``"2026-07-28"``, ``"2025-11-25"``, ...).
        tools: the toolkit names of the tools it contributed.
        transport: ``"stdio"``, ``"streamable-http"`` or ``"sse"`` (a legacy server), once
            connected.
        reconnects: how many times it was connected again after its session ended.
        ended: why its last session ended (kept after it reconnects), or None.
        unsupported: the server's own names of the tools it lists that are not offered
            (they need task mode: ``execution.taskSupport`` is ``required``).
    """

    state: Literal["connected", "disabled", "needs_auth", "failed"]
    error: str | None = None
    protocol: str | None = None
    tools: tuple[str, ...] = ()
    transport: str | None = None
    reconnects: int = 0
    ended: str | None = None
    unsupported: tuple[str, ...] = ()


def _fail(server: str, problem: str) -> UsageError:
    return UsageError(f"MCP server {server!r}: {problem}")


def _str_map(server: str, field: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        # The values are not shown: they may be secrets.
        raise _fail(server, f"{field} must map names to strings")
    return dict(value)


def _command(server: str, spec: Mapping[str, Any]) -> tuple[str, ...]:
    command = spec.get("command")
    args = spec.get("args")
    if isinstance(command, str):
        parts = [command]
    elif isinstance(command, list) and all(isinstance(p, str) for p in command):
        parts = list(command)
    else:
        raise _fail(server, "command must be a list of strings (or a string with an args list)")
    if args is not None:
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise _fail(server, "args must be a list of strings")
        parts += args
    if not parts or not parts[0]:
        raise _fail(server, "command is empty")
    return tuple(parts)


def _enabled(server: str, spec: Mapping[str, Any]) -> bool:
    enabled, disabled = spec.get("enabled"), spec.get("disabled")
    for field, value in (("enabled", enabled), ("disabled", disabled)):
        if value is not None and not isinstance(value, bool):
            raise _fail(server, f"{field} must be true or false")
    if enabled is not None and disabled is not None and enabled == disabled:
        raise _fail(server, "enabled and disabled contradict each other")
    if enabled is not None:
        return bool(enabled)
    return not disabled


def _timeout(server: str, value: object) -> float:
    if value is None:
        return DEFAULT_TIMEOUT_MS / 1000
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _fail(server, f"timeout must be a positive number of milliseconds, got {value!r}")
    return float(value) / 1000


def _call_timeout(server: str, value: object) -> float | None:
    if value is None:
        return DEFAULT_CALL_TIMEOUT_MS / 1000
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise _fail(
            server, f"callTimeout must be a number of milliseconds >= 0 (0: none), got {value!r}"
        )
    return float(value) / 1000 if value else None


def _max_reply(server: str, value: object) -> int:
    if value is None:
        return DEFAULT_MAX_REPLY_BYTES
    if isinstance(value, bool) or not isinstance(value, int) or not value > 0:
        raise _fail(server, f"maxReplyBytes must be a positive whole number, got {value!r}")
    return value


def _tools(server: str, value: object) -> dict[str, bool] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, bool) for k, v in value.items()
    ):
        raise _fail(server, "tools must map the server's tool names to true/false")
    return dict(value)


def _oauth(server: str, value: object, headers: Mapping[str, str]) -> OAuthConfig | None:
    if value is False:
        return None
    if value is None or value is True:
        # A server given its own Authorization header is signed in already.
        if any(key.lower() == "authorization" for key in headers):
            return None
        return OAuthConfig()
    if not isinstance(value, Mapping):
        raise _fail(server, "oauth must be false or an object")
    unknown = set(value) - _OAUTH_FIELDS
    if unknown:
        raise _fail(server, f"unknown oauth field(s) {', '.join(sorted(unknown))}")
    fields: dict[str, str | None] = {}
    for key in sorted(_OAUTH_FIELDS):
        given = value.get(key)
        if given is not None and (not isinstance(given, str) or not given):
            # Not shown: a client secret is a secret.
            raise _fail(server, f"oauth.{key} must be a non-empty string")
        fields[key] = given
    redirect = fields["redirectUri"]
    if redirect is not None and not redirect.startswith(("http://", "https://")):
        raise _fail(server, "oauth.redirectUri must be an http:// or https:// URL")
    if fields["clientSecret"] is not None and fields["clientId"] is None:
        raise _fail(server, "oauth.clientSecret needs oauth.clientId")
    return OAuthConfig(fields["clientId"], fields["clientSecret"], fields["scope"], redirect)


def _server(name: str, spec: object) -> ServerConfig:
    if not isinstance(spec, Mapping):
        raise _fail(name, f"must be an object, got {type(spec).__name__}")
    unknown = set(spec) - _FIELDS
    if unknown:
        raise _fail(name, f"unknown field(s) {', '.join(sorted(unknown))}")
    kind = spec.get("type")
    if kind is None:
        kind = "remote" if "url" in spec else "local" if "command" in spec else None
        if kind is None:
            raise _fail(name, "needs a command (a local server) or a url (a remote one)")
    if kind not in ("local", "remote"):
        raise _fail(name, f"type must be 'local' or 'remote', got {kind!r}")
    if "env" in spec and "environment" in spec:
        raise _fail(name, "give environment or its alias env, not both")
    environment = _str_map(name, "environment", spec.get("environment", spec.get("env")))
    headers = _str_map(name, "headers", spec.get("headers"))
    cwd = spec.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise _fail(name, "cwd must be a string")
    common: dict[str, Any] = {
        "enabled": _enabled(name, spec),
        "timeout": _timeout(name, spec.get("timeout")),
        "tools": _tools(name, spec.get("tools")),
        "call_timeout": _call_timeout(name, spec.get("callTimeout")),
        "max_reply": _max_reply(name, spec.get("maxReplyBytes")),
    }
    if kind == "local":
        if "url" in spec or headers or "oauth" in spec:
            raise _fail(name, "a local server takes command, not url, headers or oauth")
        if "maxReplyBytes" in spec:
            # stdio has no event to bound: saying nothing would promise a limit not kept.
            raise _fail(name, "maxReplyBytes bounds a remote server's replies, not a local one's")
        command = _command(name, spec)
        return ServerConfig(name, "local", command, environment, cwd, **common)
    url = spec.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise _fail(name, "url must be an http:// or https:// URL")
    if "command" in spec or environment or cwd is not None:
        raise _fail(name, "a remote server takes url and headers, not command, env or cwd")
    oauth = _oauth(name, spec.get("oauth"), headers)
    return ServerConfig(name, "remote", url=url, headers=headers, oauth=oauth, **common)


def parse_config(config: Mapping[str, Any]) -> tuple[ServerConfig, ...]:
    """The servers of ``config``, in the order given.

    ``config`` is the parsed JSON: ``{"mcpServers": {name: server, ...}}`` (or ``servers``
    or ``mcp`` as the key), or the server map itself. A ``tools`` map on a server selects
    its tools by their own names: absent or empty, all; with at least one ``true``, only
    the ``true`` ones; with only ``false`` entries, all but those.

    >>> [s.name for s in parse_config({"mcpServers": {"files": {"command": ["mcp-files"]}}})]
    ['files']

    Raises:
        UsageError: naming the server and the field that is wrong.
    """
    if not isinstance(config, Mapping):
        raise UsageError(f"an MCP config must be a JSON object, got {type(config).__name__}")
    wrappers = [key for key in _WRAPPERS if key in config]
    if len(wrappers) > 1:
        raise UsageError(f"an MCP config has one server map, found {' and '.join(wrappers)}")
    if wrappers:
        servers = config[wrappers[0]]
        if not isinstance(servers, Mapping):
            raise UsageError(f"{wrappers[0]} must map server names to servers")
    else:
        servers = {k: v for k, v in config.items() if k not in _SIBLINGS}
    parsed = []
    for name, spec in servers.items():
        if not isinstance(name, str) or not name:
            raise UsageError(f"an MCP server name must be a non-empty string, got {name!r}")
        parsed.append(_server(name, spec))
    return tuple(parsed)


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[ServerConfig, ...]:
    """:func:`parse_config` of a mapping, or of the JSON file at ``source``."""
    if isinstance(source, Mapping):
        return parse_config(source)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the MCP config {str(path)!r}: {exc.strerror}") from None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"the MCP config {str(path)!r} is not JSON: {exc}") from None
    return parse_config(parsed)
