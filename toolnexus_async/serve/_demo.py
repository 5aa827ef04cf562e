"""The serve demo: an in-process rule-based model and three tools that each stop for a human.

Rule of this module: no I/O and no state between runs; whatever the prompt, a run goes

1. ``check_login``: a login link (``kind="authorization"``) on the first call, fine once
   answered;
2. ``question``: the built-in tool, asking which restaurant (unless the prompt names one
   of :data:`RESTAURANTS`) and for how many people, with options;
3. ``book_table`` (from the terminal demo): a deposit that needs approval;
4. a final text that sums up the answers.

A refusal at any step ends the run with a text that says so, in words for people.
:func:`serve_demo_app` wires them into :func:`create_app` with a :class:`SqliteRunStore`;
``toolnexus-async serve`` uses it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from .._core.errors import UsageError
from .._core.messages import AssistantMessage, Message, ToolCall, ToolReturn, UserMessage
from .._core.types import Tool, ToolContext, ToolResult
from .._demo import book_table
from .._engine.client import LlmClient
from .._engine.tracing import Tracing, require_otel
from ..durable import PostgresRunStore, RunStore, SqliteRunStore
from ..mcp._tokens import RunStoreTokens
from ..skills import SkillSet
from ..tools._standard import Toolkit
from ..tools.builtin import QuestionTool
from ..tools.native import define_tool
from ._app import GRACE, MAX_ACTIVE_RUNS, MakeClient, create_app
from ._inline import InlineQuestions
from ._runs import ServeInbox

__all__ = (
    "LOGIN_URL",
    "RESTAURANTS",
    "demo_client",
    "serve_demo_app",
    "serve_demo_model",
    "serve_demo_tools",
)

LOGIN_URL = "https://example.com/login?app=toolnexus-demo"
RESTAURANTS = ("Luigi's", "Sakura", "Le Petit Zinc")
PARTY_SIZES = ("2", "4", "6")
TIME = "19:30"


@define_tool
async def check_login(ctx: ToolContext | None = None) -> ToolResult:
    """Check that the user is logged in to the booking service; ask them to log in if not."""
    if ctx is None or ctx.answer is None:
        return ToolResult.auth_required(
            LOGIN_URL, "Log in to the booking service, then confirm here."
        )
    return ToolResult.ok("Logged in to the booking service.")


def serve_demo_tools() -> list[Tool]:
    """The demo's tools: ``check_login``, ``question`` and ``book_table``."""
    return [check_login, QuestionTool(), book_table]


def _returns(messages: list[Message]) -> dict[str, ToolReturn]:
    return {m.name: m for m in messages if isinstance(m, ToolReturn)}


def _strings(value: Any) -> list[str]:
    """Every string (or number) in an answer, in order, however the form nested them."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [str(value)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _named(prompt: str) -> str | None:
    """The demo restaurant the prompt names, if any (the first in :data:`RESTAURANTS`)."""
    folded = prompt.casefold()
    return next((r for r in RESTAURANTS if r.casefold() in folded), None)


def _choices(output: str, named: str | None = None) -> tuple[str, int]:
    """The restaurant and party size the human chose (defaults for anything unclear); with
    a restaurant ``named`` in the prompt only the party size was asked."""
    try:
        answers = _strings(json.loads(output))
    except ValueError:
        answers = []
    if named is not None:
        answers = [named, *answers]
    restaurant = answers[0] if answers and answers[0].strip() else RESTAURANTS[0]
    size = 2
    if len(answers) > 1 and (digits := re.search(r"\d+", answers[1])):
        size = max(1, min(20, int(digits.group())))
    return restaurant.strip()[:100], size


# What the model is told of a refused or expired request starts so (_suspension.declined);
# the demo model, like any model, knows only what it is told.
DECLINED = "declined/expired: "


def _refusal(output: str, what: str) -> str:
    """A refused step in words for people: the model-facing ``declined/expired: ...`` is
    not something to show a person."""
    return what if output.startswith(DECLINED) else output


def _call(name: str, arguments: dict[str, Any], turn: int) -> ToolCall:
    return ToolCall(f"serve_demo_{turn}", name, arguments)


def serve_demo_model(messages: list[Message], tools: list[Tool]) -> AssistantMessage:
    """The rule-based model: it reads the results so far and takes the next step."""
    prompt = next((m.text for m in messages if isinstance(m, UserMessage)), "")
    done = _returns(messages)
    login = done.get("check_login")
    if login is None:
        return AssistantMessage(
            "First, let me make sure you are logged in.", (_call("check_login", {}, 1),)
        )
    if login.is_error:
        why = _refusal(login.output, "the login was cancelled")
        return AssistantMessage(f"I stopped: you are not logged in ({why}).")
    named = _named(prompt)
    asked = done.get("question")
    if asked is None:
        party = {
            "question": "For how many people?",
            "header": "Party",
            "options": list(PARTY_SIZES),
        }
        if named is not None:
            return AssistantMessage(
                f"You are logged in. How many people at {named}?",
                (_call("question", {"questions": [party]}, 2),),
            )
        where = {
            "question": "Which restaurant?",
            "header": "Restaurant",
            "options": list(RESTAURANTS),
        }
        return AssistantMessage(
            "You are logged in. A couple of questions.",
            (_call("question", {"questions": [where, party]}, 2),),
        )
    if asked.is_error:
        why = _refusal(asked.output, "you declined to answer")
        return AssistantMessage(f"I stopped: I need your choices ({why}).")
    restaurant, size = _choices(asked.output, named)
    booking = done.get("book_table")
    if booking is None:
        arguments = {"restaurant": restaurant, "time": TIME, "party_size": size}
        return AssistantMessage(
            f"Booking {restaurant} for {size} at {TIME}; the deposit needs your approval.",
            (_call("book_table", arguments, 3),),
        )
    if booking.is_error:
        return AssistantMessage(
            f"You asked: {prompt!r}. You chose {restaurant} for {size}, "
            f"but I did not book it: {_refusal(booking.output, 'you declined the deposit')}."
        )
    return AssistantMessage(
        f"You asked: {prompt!r}. You chose {restaurant} for {size} at {TIME}. {booking.output}"
    )


def demo_client(inbox: ServeInbox, tracing: Tracing | None = None) -> LlmClient:
    """The in-process demo model, parking in ``inbox`` (a ``make_client`` for create_app),
    traced with ``tracing`` when given."""
    return LlmClient.in_process(
        serve_demo_model, model="serve-demo", wait_for=inbox, tracing=tracing
    )


def serve_demo_app(
    store: str | os.PathLike[str] | RunStore,
    *,
    make_client: MakeClient | None = None,
    park_timeout: float = 300.0,
    max_body: int = 64 * 1024,
    token: str | None = None,
    insecure_no_auth: bool = False,
    allowed_hosts: Iterable[str] = (),
    lease: float = 30.0,
    mcp: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    skills: Iterable[str | os.PathLike[str]] | None = None,
    freeze_gc: bool = False,
    grace: float = GRACE,
    store_timeout: float = 10.0,
    max_active_runs: int = MAX_ACTIVE_RUNS,
    tracing: Tracing | None = None,
) -> web.Application:
    """:func:`create_app` on the embedded defaults: the demo model and tools, a SQLite store.

    ``store`` is a run store, a SQLite file's path, or a ``postgresql://`` DSN for a
    :class:`~toolnexus_async.durable.PostgresRunStore` (see :func:`open_store`).
    ``make_client`` replaces the demo model (a real endpoint, say); the demo tools stay.
    ``token``, ``insecure_no_auth``, ``allowed_hosts``, ``lease``, ``freeze_gc``, ``grace``,
    ``store_timeout`` and ``max_active_runs`` are as for :func:`create_app`; a store opened
    here from a path or DSN is given ``store_timeout`` too. ``mcp`` adds the tools of MCP
    servers (an ``mcpServers`` config or its file, see docs/mcp.md), connected at startup:
    the questions of 2026-07-28 servers are requests on the page like any tool's, and so are
    the sign-ins of remote servers (their tokens kept in the run store); older servers'
    inline questions are on the page too, while this process lives (``"durable": false``).
    ``skills`` are folders searched for Agent Skills (docs/skills.md), loaded now: their
    catalogue joins every run's instructions, and the ``skill`` tool loads one.
    ``tracing`` traces the demo model's runs (``Tracing()``: to the global tracer
    provider), checked here: a :class:`UsageError` when OpenTelemetry's API is missing; a
    client of ``make_client`` is traced by the ``tracing=`` it is built with instead.
    The app owns the toolkit and the store (given or made here) and closes them on shutdown.
    """
    if tracing is not None:
        if not isinstance(tracing, Tracing):
            raise UsageError(f"tracing must be a Tracing, got {type(tracing).__name__}")
        if make_client is not None:
            raise UsageError(
                "tracing= traces the demo model's client; with make_client, build your "
                "LlmClient with tracing= instead"
            )
        require_otel("serve_demo_app(tracing=...)")
    run_store = store if isinstance(store, RunStore) else open_store(store, timeout=store_timeout)
    # Sign-ins to remote MCP servers are kept beside the runs that wait for them.
    tokens = RunStoreTokens(run_store) if hasattr(run_store, "mcp_token") and mcp else None
    # Older servers' inline questions go to the page while this process lives.
    inline = InlineQuestions() if mcp else None
    toolkit = Toolkit.create(
        builtins=False,
        extra_tools=serve_demo_tools(),
        mcp=mcp,
        mcp_tokens=tokens,
        wait_for=inline,
        skills=None if skills is None else SkillSet.load(skills),
    )
    app = create_app(
        make_client=make_client or functools.partial(demo_client, tracing=tracing),
        toolkit=toolkit,
        store=run_store,
        park_timeout=park_timeout,
        max_body=max_body,
        token=token,
        insecure_no_auth=insecure_no_auth,
        allowed_hosts=allowed_hosts,
        lease=lease,
        freeze_gc=freeze_gc,
        grace=grace,
        store_timeout=store_timeout,
        max_active_runs=max_active_runs,
        inline_questions=inline,
    )

    async def owned(app: web.Application) -> AsyncIterator[None]:
        # First in the list: opened before the app's own context, closed after it.
        async with toolkit, run_store:
            yield

    app.cleanup_ctx.insert(0, owned)
    return app


def open_store(where: str | os.PathLike[str], *, timeout: float = 10.0) -> RunStore:
    """The run store ``where`` names: a ``postgresql://`` (or ``postgres://``) DSN is a
    :class:`~toolnexus_async.durable.PostgresRunStore` (the ``postgres`` extra), anything
    else the path of a :class:`~toolnexus_async.durable.SqliteRunStore` file.

    ``timeout`` is how long one store call may take, a held lock included, before it fails
    with :class:`~toolnexus_async.StoreUnavailableError` (PostgreSQL's ``command_timeout``
    and ``call_timeout``, SQLite's ``timeout``). Nothing is opened yet: the store connects
    on first use. A path that cannot name a SQLite file, in a folder that does not exist or
    naming a folder, is a :class:`~toolnexus_async.UsageError` saying so: no retry mends it.
    """
    if not 0 < timeout < math.inf:
        raise UsageError(f"the store timeout must be > 0 seconds, and finite, got {timeout}")
    if isinstance(where, str) and where.startswith(("postgresql://", "postgres://")):
        return PostgresRunStore(where, command_timeout=timeout, call_timeout=timeout)
    _check_file(Path(where))
    return SqliteRunStore(where, timeout=timeout)


def _check_file(path: Path) -> None:
    if path.is_dir():
        raise UsageError(
            f"run store {path} is a folder, not a file: name a file in it, such as "
            f"{path / 'toolnexus-runs.sqlite'}"
        )
    folder = path.parent
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"run store {path}: {folder} is a file, not a folder")
    if not folder.exists():
        raise UsageError(
            f"run store {path}: the folder {folder} does not exist; create it, or name a "
            "file in a folder that exists"
        )
