"""The toolkit: which tools a run may call, how they are found, and how they are executed.

Rules of this module:

- Arguments are checked against the tool's input schema before it runs (compiled once per
  schema); a violation is an error result naming the field and the rule.
- A tool never raises across the toolkit: :meth:`Toolkit.execute` turns an exception into
  an error result naming the tool and the exception, and an unknown name into an error
  result naming the tools that do exist. Only cancellation passes through. The same holds
  for :meth:`Toolkit.refused`, which tells a tool that its request was refused.
- Names are unique. In :meth:`Toolkit.create` an extra tool with a built-in's name replaces
  that built-in, and among the extra tools the first of a name wins; :meth:`register`
  refuses a taken name unless told to replace it.
- The schema adapters (``to_openai`` ...) are the codecs' renderers, handed one tuple of
  the tools that stays the same until the tools change, so the codecs render it once.
- :meth:`Toolkit.create` is safe by default: the built-ins are confined to ``workdir`` and
  the acting ones ask before they act (``approve="ask"``); loosening either is explicit.
  Its switches fail closed: an unknown built-in, a switch that is not a bool or a policy
  that is not one is a :class:`UsageError`, never read as "leave it on".
- MCP servers (``create(mcp=...)``) connect when the toolkit is entered (``async with``, or
  :meth:`start`) and their tools are registered then; a server that fails is reported in
  :attr:`mcp_status` and the toolkit loads without it. Leaving closes every session and
  server process. An MCP tool never replaces a tool of the same name: it is left out.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from .._core.closing import FlagClosing
from .._core.codecs._tools import render_anthropic, render_gemini, render_openai
from .._core.errors import UsageError
from .._core.types import Tool, ToolContext, ToolResult, check_tool_name
from .._core.validation import Validator, validator_for
from ..tools._session import SharedSession
from ..tools.builtin import BUILTIN_NAMES, ApprovalPolicy, Workspace, builtin_tools, check_policy
from .resolver import Resolver, WaitFor

if TYPE_CHECKING:
    from ..mcp import McpStatus, TokenStore
    from ..mcp._connect import McpServers
    from ..mcp._connection import Connection

__all__ = ("Toolkit",)

log = logging.getLogger("toolnexus_async")


def _check_tool(tool: object) -> Tool:
    missing = [
        attr
        for attr in ("name", "description", "input_schema", "source", "execute")
        if not hasattr(tool, attr)
    ]
    if missing:
        raise UsageError(f"{tool!r} is not a tool: it lacks {', '.join(missing)}")
    assert isinstance(tool, Tool)
    check_tool_name(tool.name)
    if not isinstance(tool.input_schema, Mapping):
        raise UsageError(f"tool {tool.name!r}: input_schema must be a JSON Schema object")
    return tool


class Toolkit(FlagClosing):
    """A set of uniquely named tools, executed safely.

    Build one with :meth:`create`; use it as an async context manager so that every source
    it opened is closed::

        async with Toolkit.create(builtins=False, extra_tools=[send_payment]) as tk:
            result = await tk.execute("send_payment", {"amount": 30})

    A closed toolkit refuses to execute, to register and to be entered again
    (:class:`UsageError`), as a closed client refuses to run.
    """

    _kind = "toolkit"

    def __init__(self, tools: Iterable[Tool] = (), *, validate: bool = True) -> None:
        self._tools: dict[str, Tool] = {}
        # The tools as one tuple, handed to the codecs every turn; rebuilt when tools change,
        # so a codec can remember its rendering by the tuple's identity.
        self._spec_tuple: tuple[Tool, ...] = ()
        self._validate = validate
        self._validators: dict[str, Validator] = {}
        # Resources the toolkit created for its tools (the shared HTTP session), closed last.
        self._resources: list[SharedSession] = []
        self._mcp: McpServers | None = None
        self._closed = False
        for tool in tools:
            self.register(tool)

    @classmethod
    def create(
        cls,
        builtins: bool | Mapping[str, Any] = True,
        extra_tools: Iterable[Tool] = (),
        *,
        workdir: str | os.PathLike[str] | None = None,
        confine: bool = True,
        approve: ApprovalPolicy = "ask",
        allow_hosts: Iterable[str] = (),
        validate: bool = True,
        mcp: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        wait_for: WaitFor | None = None,
        mcp_tokens: TokenStore | None = None,
        mcp_redirect_uri: str | None = None,
    ) -> Toolkit:
        """Assemble a toolkit from the built-ins and ``extra_tools``.

        Args:
            builtins: ``True`` (all built-ins), ``False`` (none), or a mapping such as
                ``{"tools": {"bash": False}}`` that turns single built-ins off; an unknown
                name or a switch that is not a bool raises :class:`UsageError`.
            extra_tools: your tools. One with a built-in's name replaces that built-in;
                among these the first of a name wins.
            workdir: the directory the file tools and ``bash`` work in (default: the
                current directory).
            confine: keep every file tool, and ``bash``'s working directory, under
                ``workdir`` (the default): ``..``, absolute paths outside and symlinks
                leading out are refused. ``False`` lets paths lead anywhere. ``bash``
                itself is not a sandbox.
            approve: when the acting built-ins (``bash``, ``write``, ``edit``,
                ``apply_patch``) ask for approval: ``"ask"`` (every call, the default),
                ``"allow-all"`` (never: a sandbox, CI), or a callable
                ``(tool_name, args) -> bool`` returning True for a call that may run
                unasked. Anything else raises :class:`UsageError`.
            allow_hosts: host names, addresses and networks (``"10.0.0.0/8"``) that
                ``webfetch`` may reach although they are not public; by default it reaches
                public addresses only (no loopback, private, link-local, ...).
            validate: check each call's arguments against the tool's input schema before
                the tool runs; a violation is an error result for the model.
            mcp: MCP servers to load (docs/mcp.md): the ``mcpServers`` config as a mapping
                or the path of its JSON file. They connect when the toolkit is entered
                (``async with``) or :meth:`start` ed. Needs ``toolnexus-async[mcp]``.
            wait_for: answers the questions an MCP server of protocol 2025-11-25 or older
                asks inline during a call (``async (request) -> Answer``, or an Inbox).
                Without it such servers are not offered elicitation. Questions of
                2026-07-28 servers need no ``wait_for`` here: they suspend the call.
            mcp_tokens: where remote servers' sign-ins are kept (a
                :class:`~toolnexus_async.mcp.TokenStore`; default: in memory, so a restart
                signs in again; ``RunStoreTokens(store)`` keeps them in a run store).
            mcp_redirect_uri: where an authorization server sends the person back after a
                sign-in, for the servers whose ``oauth`` config names none (serve's
                ``/oauth/callback``, or a URL of yours that calls
                :func:`~toolnexus_async.mcp.sign_in_answer`).
        """
        approve = check_policy(approve)
        servers = None
        if mcp is not None:
            from ..mcp import load_config, require_sdk

            require_sdk()
            from ..mcp._connect import McpServers

            servers = McpServers(
                load_config(mcp),
                Resolver.of(wait_for),
                tokens=mcp_tokens,
                redirect_uri=mcp_redirect_uri,
            )
        elif wait_for is not None or mcp_tokens is not None or mcp_redirect_uri is not None:
            raise UsageError(
                "wait_for, mcp_tokens and mcp_redirect_uri are for MCP servers; pass mcp= too"
            )
        extras: dict[str, Tool] = {}
        for tool in extra_tools:
            tool = _check_tool(tool)
            if tool.name in extras:
                log.warning("extra tool %r is listed twice; the first one is kept", tool.name)
                continue
            extras[tool.name] = tool
        enabled = _enabled_builtins(builtins)
        toolkit = cls(validate=validate)
        if enabled - set(extras):
            workspace = Workspace(Path.cwd() if workdir is None else workdir, confine=confine)
            session = SharedSession()
            toolkit._resources.append(session)
            tools = builtin_tools(workspace, session, approve=approve, allow_hosts=allow_hosts)
            for tool in tools:
                if tool.name in enabled and tool.name not in extras:
                    toolkit.register(tool)
        for tool in extras.values():
            toolkit.register(tool)
        toolkit._mcp = servers
        return toolkit

    async def start(self) -> None:
        """Connect the MCP servers and register their tools (``async with`` does this).

        Returns when every enabled server is connected or has failed; see
        :attr:`mcp_status`. Call :meth:`aclose` from the same task. Called again, it
        connects again every enabled server that is not connected (one whose session
        ended, or that failed to start), and returns when each has connected or failed.
        """
        self._check_open()
        servers = self._mcp
        if servers is None:
            return
        if servers.started:
            await servers.reconnect()
            return
        await servers.start()
        # In the config's order, so that names are the same on every start; later
        # changes (a reconnect, a server's list_changed) are applied as they come.
        for connection in servers.connections:
            if connection.session is not None or connection.state == "needs_auth":
                self._mcp_tools(connection)
        servers.on_tools = self._mcp_tools

    def _mcp_tools(self, connection: Connection) -> None:
        """Offer the tools ``connection``'s server lists now (or its sign-in tool, while it
        waits for its first sign-in), in place of those it offered before (a tool it still
        lists keeps its place)."""
        if self._closed:
            return
        from ..mcp._oauth import SignInTool
        from ..mcp._tool import McpTool, tools_of

        def server_of(tool: Tool) -> Connection | None:
            return tool.connection if isinstance(tool, McpTool | SignInTool) else None

        taken = {
            name for name, tool in self._tools.items() if server_of(tool) not in (None, connection)
        }
        others = {name: tool for name, tool in self._tools.items() if server_of(tool) is None}
        fresh = {tool.name: tool for tool in tools_of(connection, taken, others)}
        tools: dict[str, Tool] = {}
        for name, tool in self._tools.items():
            if server_of(tool) is connection:
                self._validators.pop(name, None)
                if name in fresh:
                    tools[name] = fresh.pop(name)
            else:
                tools[name] = tool
        tools.update(fresh)
        self._tools = tools
        self._spec_tuple = tuple(tools.values())

    @property
    def mcp_connections(self) -> tuple[Connection, ...]:
        """The sessions of the MCP servers this toolkit owns (empty without ``mcp=``): for
        :mod:`toolnexus_async.mcp` (a sign-in's redirect finds its server here), not for
        applications, which read :attr:`mcp_status`."""
        return () if self._mcp is None else tuple(self._mcp.connections)

    @property
    def mcp_status(self) -> dict[str, McpStatus]:
        """Each configured MCP server's :class:`~toolnexus_async.mcp.McpStatus`, by name
        (empty without ``mcp=``). Before :meth:`start` an enabled server reads ``failed``
        with the error ``"not started"``."""
        if self._mcp is None:
            return {}
        from ..mcp import McpStatus

        status = {}
        for connection in self._mcp.connections:
            mine = tuple(
                name
                for name, tool in self._tools.items()
                if getattr(tool, "connection", None) is connection
            )
            status[connection.config.name] = McpStatus(
                connection.state,
                connection.error,
                connection.protocol,
                mine,
                transport=connection.transport,
                reconnects=connection.reconnects,
                ended=connection.ended,
                unsupported=connection.unsupported,
            )
        return status

    async def __aenter__(self) -> Self:
        self._check_open()
        await self.start()
        return self

    def register(self, tool: Tool, *, replace: bool = False) -> None:
        """Add ``tool``; a taken name is refused unless ``replace=True``."""
        self._check_open()
        tool = _check_tool(tool)
        if tool.name in self._tools and not replace:
            raise UsageError(
                f"a tool named {tool.name!r} is already registered; pass replace=True to swap it"
            )
        self._tools[tool.name] = tool
        self._spec_tuple = tuple(self._tools.values())
        self._validators.pop(tool.name, None)

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def tools(self) -> list[Tool]:
        """Every tool, in registration order."""
        return list(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __repr__(self) -> str:
        return f"Toolkit({list(self._tools)!r})"

    async def execute(
        self, name: str, args: dict[str, Any], ctx: ToolContext | None = None
    ) -> ToolResult:
        """Run the tool ``name``; whatever happens, the answer is a :class:`ToolResult`.

        Raises:
            UsageError: the toolkit is closed (its tools' resources are gone).
        """
        if self._closed:
            self._check_open()
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult.error(self._unknown(name))
        if self._validate:
            problem = self._check_arguments(tool, args)
            if problem is not None:
                return ToolResult.error(problem)
        try:
            # Typed as object: tools are duck-typed user code and may return anything.
            result: object = await tool.execute(args, ctx)
        except Exception as exc:
            log.debug("tool %r raised", name, exc_info=True)
            return ToolResult.error(f"tool {name!r} raised {type(exc).__name__}: {exc}")
        if not isinstance(result, ToolResult):
            return ToolResult.error(
                f"tool {name!r} returned {type(result).__name__}, not a ToolResult"
            )
        return result

    async def refused(self, name: str, args: dict[str, Any], ctx: ToolContext) -> None:
        """Tell the tool ``name`` that its request ``ctx.request`` was refused
        (``ctx.answer``: ``ok=False``) and that it will not run again for this call.

        Calls the tool's optional ``async refused(args, ctx)``; nothing for an unknown tool
        or one without it. Never raises for the tool's sake: an exception from it is logged
        (a warning naming the tool and the exception's type) and ignored. Only cancellation
        passes through.

        Raises:
            UsageError: the toolkit is closed.
        """
        if self._closed:
            self._check_open()
        tell = getattr(self._tools.get(name), "refused", None)
        if tell is None:
            return
        try:
            await tell(args, ctx)
        except Exception as exc:
            # The type only: an exception's text may carry what the tool was sent.
            log.warning("tool %r raised %s in refused(); ignored", name, type(exc).__name__)
            log.debug("tool %r raised in refused()", name, exc_info=True)

    def check_arguments(self, name: str, args: dict[str, Any]) -> str | None:
        """What is wrong with calling the tool ``name`` with ``args`` (unknown tool, or
        arguments its ``input_schema`` refuses), or ``None`` when nothing is. Checks even
        when the toolkit was made with ``validate=False``.

        >>> Toolkit().check_arguments("nope", {})
        "unknown tool 'nope'; available tools: none"
        """
        tool = self._tools.get(name)
        if tool is None:
            return self._unknown(name)
        return self._check_arguments(tool, args)

    def _unknown(self, name: str) -> str:
        return f"unknown tool {name!r}; available tools: {', '.join(self._tools) or 'none'}"

    def _check_arguments(self, tool: Tool, args: dict[str, Any]) -> str | None:
        check = self._validators.get(tool.name)
        if check is None:
            try:
                check = validator_for(tool.input_schema)
            except UsageError as exc:
                return f"tool {tool.name!r} cannot be called: its input schema is invalid: {exc}"
            self._validators[tool.name] = check
        problem = check(args)
        if problem is None:
            return None
        return f"invalid arguments for tool {tool.name!r}: {problem}; the tool did not run"

    @property
    def specs(self) -> tuple[Tool, ...]:
        """The tools, as the one tuple a model request renders: the same object until the
        tools change, so a codec renders it once (see ``_codecs._tools``)."""
        return self._spec_tuple

    def to_openai(self) -> list[dict[str, Any]]:
        """Chat Completions ``tools``: ``{"type": "function", "function": {...}}`` each."""
        return copy.deepcopy(render_openai(self._spec_tuple))

    def to_anthropic(self) -> list[dict[str, Any]]:
        """Messages API ``tools``: ``{"name", "description", "input_schema"}`` each."""
        return copy.deepcopy(render_anthropic(self._spec_tuple))

    def to_gemini(self) -> list[dict[str, Any]]:
        """Gemini ``functionDeclarations``, with the schema keys Gemini rejects removed."""
        return copy.deepcopy(render_gemini(self._spec_tuple))

    async def aclose(self) -> None:
        """Close every tool that holds a resource (it has an ``aclose``), then the shared
        HTTP session. Idempotent. One failing close does not keep the others open: the first
        error is raised once everything was closed.
        """
        if self._closed:
            return
        self._closed = True
        closers: list[Any] = [] if self._mcp is None else [self._mcp.aclose]
        closers += [getattr(tool, "aclose", None) for tool in self._tools.values()]
        closers += [resource.aclose for resource in self._resources]
        first: Exception | None = None
        for closer in closers:
            if closer is None:
                continue
            try:
                await closer()
            except Exception as exc:
                log.warning("closing a tool failed: %r", exc)
                first = first or exc
        if first is not None:
            raise first


def _enabled_builtins(builtins: bool | Mapping[str, Any]) -> set[str]:
    if builtins is True:
        return set(BUILTIN_NAMES)
    if builtins is False:
        return set()
    if not isinstance(builtins, Mapping):
        raise UsageError(f"builtins must be a bool or a mapping, got {type(builtins).__name__}")
    unknown_keys = set(builtins) - {"tools"}
    if unknown_keys:
        raise UsageError(f"unknown builtins option(s): {', '.join(sorted(unknown_keys))}")
    switches = builtins.get("tools", {})
    if not isinstance(switches, Mapping):
        raise UsageError("builtins['tools'] must map tool names to True/False")
    unknown = [name for name in switches if name not in BUILTIN_NAMES]
    if unknown:
        raise UsageError(
            f"unknown built-in tool(s): {', '.join(map(str, unknown))}; "
            f"the built-ins are {', '.join(BUILTIN_NAMES)}"
        )
    for name, on in switches.items():
        if not isinstance(on, bool):
            # Read as "not False", {"bash": 0} or {"bash": "off"} would leave bash on.
            raise UsageError(f"builtins['tools'][{name!r}] must be True or False, got {on!r}")
    return {name for name in BUILTIN_NAMES if switches.get(name, True)}
