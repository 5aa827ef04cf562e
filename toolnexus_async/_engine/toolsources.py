"""The tool sources a registry is composed of: opened in order, their tools taken, closed in
reverse (the ``ToolRegistry`` rules on sources and names, ``toolkit``'s docstring).

Rules of this module:

- A source that fails to open closes the ones opened before it, and the registry: nothing
  stays open, even when the opening is cancelled.
- A live source (it has ``watch``) never takes a taken name: its tool is left out with a
  warning; a tool it still offers when its list changes keeps its place.
- Closing closes the sources in reverse, then every tool registered directly that has an
  ``aclose``; one failing close does not keep the others open.
- A mixin of :class:`~toolnexus_async._engine.toolkit.ToolRegistry`, which owns the state
  (the hot path, ``execute``, reads none of this module).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from .._core.errors import UsageError
from .._core.types import Tool, ToolSource, check_tool
from .._core.validation import Validator

__all__ = ("ToolSources",)

log = logging.getLogger("toolnexus_async")


class ToolSources:
    """Opening, taking the tools of, and closing a registry's composed sources."""

    _tools: dict[str, Tool]
    _spec_tuple: tuple[Tool, ...]
    _validators: dict[str, Validator]
    _sources: list[ToolSource]
    _opened: list[ToolSource]
    _instructing: list[ToolSource]
    _owners: dict[str, ToolSource]
    _started: bool
    _blocked: bool
    _closed: bool

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...  # FlagClosing's, in the registry

    def _add_source(self, source: ToolSource) -> None:
        if not isinstance(source, ToolSource):
            raise UsageError(
                f"{source!r} is not a tool source: it needs async __aenter__/__aexit__ and "
                "tools() (wrap plain tools or functions in NativeTools)"
            )
        if any(source is mine for mine in self._sources):
            raise UsageError(f"the tool source {source!r} is given twice")
        self._sources.append(source)

    def _adopt(self, source: ToolSource) -> None:
        """Take the tools of ``source``, open already (its tools need no I/O), as if it had
        been entered: for an assembly whose toolkit is usable before it is entered."""
        self._add_source(source)
        self._opened_now(source)
        self._take(source, live=False)

    @property
    def sources(self) -> tuple[ToolSource, ...]:
        """The composed sources, in order (open while the toolkit is entered)."""
        return tuple(self._sources)

    @property
    def unopened(self) -> tuple[ToolSource, ...]:
        """The composed sources not opened yet: their tools join when it is entered."""
        if self._closed:
            return ()
        return tuple(s for s in self._sources if not any(s is o for o in self._opened))

    async def start(self) -> None:
        """Open the sources in order and take their tools (``async with`` does this).

        Call :meth:`aclose` from the same task. If a source fails to open, or two offer one
        name, the sources opened so far are closed, the toolkit too, and the error is
        raised (a source's own exception carries a note naming the source).
        """
        self._check_open()
        if self._started:
            return
        self._started = True
        try:
            for source in self._sources:
                if any(source is opened for opened in self._opened):
                    continue  # adopted open
                watch = getattr(source, "watch", None)
                if watch is not None:
                    watch(functools.partial(self._changed, source))
                try:
                    await source.__aenter__()
                except Exception as exc:
                    exc.add_note(f"(while opening the tool source {source!r})")
                    raise
                self._opened_now(source)
                self._take(source, live=watch is not None)
        except BaseException:
            # Cancelled or failed: whatever is open must close, even inside a cancelled scope.
            with anyio.CancelScope(shield=True):
                await self._close_all(quiet=True)
            raise
        self._blocked = False

    def _opened_now(self, source: ToolSource) -> None:
        """``source`` is open: it is left in reverse by aclose(), and if it has
        ``instructions()``, asked for them at the start of every run."""
        self._opened.append(source)
        if callable(getattr(source, "instructions", None)):
            self._instructing.append(source)

    def _take(self, source: ToolSource, *, live: bool) -> None:
        """Register what ``source`` offers as it opens (see the module's rules on names)."""
        for offered in source.tools():
            tool = check_tool(offered)
            holder = self._owners.get(tool.name)
            if tool.name not in self._tools:
                self._tools[tool.name] = tool
                self._owners[tool.name] = source
            elif live:
                log.warning(
                    "tool %r of %r is left out: the name is taken by %s",
                    tool.name,
                    source,
                    "this source" if holder is source else _holder(holder),
                )
            elif holder is source:
                raise UsageError(f"the tool source {source!r} offers {tool.name!r} twice")
            else:
                raise UsageError(
                    f"two tool sources offer a tool named {tool.name!r}: {_holder(holder)} "
                    f"and {source!r}; leave it out of one of them"
                )
        self._spec_tuple = tuple(self._tools.values())

    def _changed(self, source: ToolSource) -> None:
        """A live source's tools changed: offer what it offers now, in place of what it
        offered before (a tool it still offers keeps its place)."""
        if self._closed or not any(source is s for s in self._opened):
            return
        fresh: dict[str, Tool] = {}
        for offered in source.tools():
            try:
                tool = check_tool(offered)
            except UsageError as exc:
                log.warning("a tool of %r is left out: %s", source, exc)
                continue
            fresh.setdefault(tool.name, tool)
        tools: dict[str, Tool] = {}
        for name, tool in self._tools.items():
            if self._owners.get(name) is not source:
                tools[name] = tool
                continue
            self._validators.pop(name, None)
            del self._owners[name]
            if name in fresh:
                tools[name] = fresh.pop(name)
                self._owners[name] = source
        for name, tool in fresh.items():
            if name in tools:
                holder = _holder(self._owners.get(name))
                log.warning(
                    "tool %r of %r is left out: the name is taken by %s", name, source, holder
                )
                continue
            tools[name] = tool
            self._owners[name] = source
        self._tools = tools
        self._spec_tuple = tuple(tools.values())

    @property
    def instructions(self) -> str | None:
        """What the open sources add to a run's system prompt (each source's optional
        ``instructions()``, in order), or None: a skill catalogue, say."""
        # A loop by index, not a comprehension: asked once per run, and on 3.11 the
        # comprehension made a function and a cell (for its walrus) each time, the list's
        # iterator an object the collector tracks.
        # Only the sources that have instructions() are asked: for a toolkit of tools alone,
        # no getattr() that fails on each of its sources per run.
        instructing = self._instructing
        if not instructing:
            return None
        parts: list[str] = []
        for index in range(len(instructing)):
            text = _instructions_of(instructing[index])
            if text:
                parts.append(text)
        return "\n\n".join(parts) or None

    async def aclose(self) -> None:
        """Close the sources (in reverse), then every tool registered directly that holds a
        resource (it has an ``aclose``). Idempotent. One failing close does not keep the
        others open: the first error is raised once everything was closed.
        """
        await self._close_all(quiet=False)

    async def _close_all(self, *, quiet: bool) -> None:
        if self._closed:
            return
        self._closed = self._blocked = True
        opened, self._opened = self._opened[::-1], []
        self._instructing = []
        closers: list[Callable[[], Awaitable[object]] | None] = [
            functools.partial(source.__aexit__, None, None, None) for source in opened
        ]
        closers += [
            getattr(tool, "aclose", None)
            for name, tool in self._tools.items()
            if name not in self._owners
        ]
        first: Exception | None = None
        for closer in closers:
            if closer is None:
                continue
            try:
                await closer()
            except Exception as exc:
                log.warning("closing a tool source failed: %r", exc)
                first = first or exc
        if first is not None and not quiet:
            raise first


def _holder(source: ToolSource | None) -> str:
    return "a tool registered directly" if source is None else repr(source)


def _instructions_of(source: ToolSource) -> str | None:
    instructions = getattr(source, "instructions", None)
    return instructions() if callable(instructions) else None
