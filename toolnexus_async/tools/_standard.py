"""The public :class:`Toolkit`: the tool registry, plus the standard assembly and MCP views.

Rules of this module:

- The registry (``_engine/toolkit.py``) imports no tool source; this module sits above
  both and adds what needs the sources: :meth:`Toolkit.create` (the built-ins, your tools
  and MCP servers composed as sources) and the MCP views (:attr:`Toolkit.mcp_status`,
  :attr:`Toolkit.mcp_connections`), read from the :class:`~toolnexus_async.mcp.McpTools`
  sources composed in, however they were.
- :meth:`Toolkit.create` is safe by default: the built-ins are confined to ``workdir`` and
  the acting ones ask before they act (``approve="ask"``); loosening either is explicit.
  Its switches fail closed: an unknown built-in, a switch that is not a bool or a policy
  that is not one is a :class:`UsageError`, never read as "leave it on".
- In :meth:`Toolkit.create` an extra tool with a built-in's name replaces that built-in,
  and among the extra tools the first of a name wins. The built-ins and the extra tools are
  there at once; MCP servers connect when the toolkit is entered (``async with``, or
  :meth:`Toolkit.start`), and a server that fails is reported in :attr:`mcp_status` while
  the toolkit loads without it. An MCP tool never replaces a tool of the same name: it is
  left out (the rule of live sources).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .._core.errors import UsageError
from .._core.types import Tool, check_tool
from .._engine.resolver import WaitFor
from .._engine.toolkit import ToolRegistry
from ..mcp._source import McpTools
from ..skills import Skill, SkillSet, SkillTools
from ._sources import BuiltinTools, NativeTools
from .builtin import BUILTIN_NAMES, ApprovalPolicy, check_policy

if TYPE_CHECKING:
    from ..mcp import McpStatus, TokenStore
    from ..mcp._connection import Connection

__all__ = ("Toolkit",)

log = logging.getLogger("toolnexus_async")


class Toolkit(ToolRegistry):
    """A set of uniquely named tools from composed sources, executed safely.

    Compose it from sources and enter it, so that every source it opened is closed::

        async with Toolkit.compose(NativeTools(send_payment), McpTools(config)) as tk:
            result = await tk.execute("send_payment", {"amount": 30})

    or assemble the standard set with :meth:`create`. A closed toolkit refuses to execute,
    to register and to be entered again (:class:`UsageError`), as a closed client refuses
    to run.
    """

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
        skills: SkillSet | Iterable[str | os.PathLike[str] | Skill] | None = None,
    ) -> Toolkit:
        """Assemble a toolkit from the built-ins, ``extra_tools`` and MCP servers: the
        sources :class:`~toolnexus_async.BuiltinTools`, :class:`~toolnexus_async.NativeTools`
        and :class:`~toolnexus_async.mcp.McpTools`, composed. Unlike a toolkit of
        :meth:`compose`, it may be used before it is entered (without its MCP tools).

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
            skills: Agent Skills (docs/skills.md): a
                :class:`~toolnexus_async.skills.SkillSet`, or folders to search for
                ``SKILL.md`` files (and skills given as data), loaded now. With at least
                one skill, the toolkit offers the ``skill`` tool and the runs' system prompt
                lists each skill's name and description.
        """
        approve = check_policy(approve)
        servers = None
        if mcp is not None:
            servers = McpTools(
                mcp, wait_for=wait_for, tokens=mcp_tokens, redirect_uri=mcp_redirect_uri
            )
        elif wait_for is not None or mcp_tokens is not None or mcp_redirect_uri is not None:
            raise UsageError(
                "wait_for, mcp_tokens and mcp_redirect_uri are for MCP servers; pass mcp= too"
            )
        extras: dict[str, Tool] = {}
        for tool in extra_tools:
            tool = check_tool(tool)
            if tool.name in extras:
                log.warning("extra tool %r is listed twice; the first one is kept", tool.name)
                continue
            extras[tool.name] = tool
        enabled = _enabled_builtins(builtins)
        ready: list[NativeTools | SkillTools] = []  # their tools need no I/O: taken at once
        if enabled - set(extras):
            off = (set(BUILTIN_NAMES) - enabled) | set(extras)
            ready.append(
                BuiltinTools(
                    workdir=workdir,
                    confine=confine,
                    approve=approve,
                    allow_hosts=allow_hosts,
                    disable=sorted(off & set(BUILTIN_NAMES)),
                )
            )
        if extras:
            ready.append(NativeTools(*extras.values()))
        if skills is not None:
            found = skills if isinstance(skills, SkillSet) else SkillSet.load(skills)
            if found.skipped:
                log.warning(
                    "skills left out: %s",
                    "; ".join(f"{s.where}: {s.reason}" for s in found.skipped),
                )
            if found.skills:
                ready.append(SkillTools(found))
        toolkit = cls(validate=validate)
        toolkit._assemble(ready, [] if servers is None else [servers])
        return toolkit

    def _assemble(self, ready: list[NativeTools | SkillTools], later: list[McpTools]) -> None:
        """Take the tools of the ``ready`` sources now (a toolkit of :meth:`create` is
        usable before it is entered) and open the ``later`` ones when it is entered."""
        for tools in ready:
            self._adopt(tools)
        for servers in later:
            self._add_source(servers)

    async def start(self) -> None:
        """Open the sources: connect the MCP servers and take their tools (``async with``
        does this).

        Returns when every enabled server is connected or has failed; see
        :attr:`mcp_status`. Call :meth:`aclose` from the same task. Called again, it
        connects again every enabled server that is not connected (one whose session
        ended, or that failed to start), and returns when each has connected or failed.
        """
        self._check_open()
        if not self._started:
            await super().start()
            return
        for source in self._mcp_sources():
            await source.reconnect()

    def _mcp_sources(self) -> list[McpTools]:
        return [source for source in self.sources if isinstance(source, McpTools)]

    @property
    def mcp_connections(self) -> tuple[Connection, ...]:
        """The sessions of the MCP servers this toolkit owns (empty without MCP sources):
        for :mod:`toolnexus_async.mcp` (a sign-in's redirect finds its server here), not
        for applications, which read :attr:`mcp_status`."""
        return tuple(c for source in self._mcp_sources() for c in source.connections)

    @property
    def mcp_status(self) -> dict[str, McpStatus]:
        """Each configured MCP server's :class:`~toolnexus_async.mcp.McpStatus`, by name
        (empty without MCP sources). Before :meth:`start` an enabled server reads
        ``failed`` with the error ``"not started"``."""
        status: dict[str, McpStatus] = {}
        for source in self._mcp_sources():
            status.update(source.status(self.get))
        return status


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
