"""Every exception the package raises, in one tree.

::

    ToolnexusError                  base of everything raised here; catch this to catch us
    ├── UsageError(ValueError)      the API was misused: bad configuration, a tool that
    │                               is not a tool, a closed client asked to run
    ├── PayloadError(ValueError)    a wire payload (Request, Answer, transcript JSON) is
    │                               malformed; the message names the offending key
    ├── ConfinementError(ValueError)  a path leads out of a confined workspace; the file
    │                               tools turn it into an error result for the model
    ├── AnswerError(LookupError)    an answer cannot be applied; nothing was changed
    │   ├── UnknownRequestError          no outstanding request has that id
    │   ├── AlreadyAnsweredError         the request was answered before
    │   ├── RequestExpiredError          the request expired before the answer came
    │   ├── AnswerMismatchError          resuming: the answer echoes none of the halted run's
    │   │                           outstanding requests
    │   └── AlreadyResumedError          resuming: another resume claimed that request first
    ├── StoreError                  a run store row is corrupt or foreign; other rows are
    │   │                           unaffected
    │   ├── StoreUnavailableError   the store cannot be reached now (down, timed out,
    │   │                           locked, full); nothing is lost, retry later
    │   └── DamagedRunError         a stored run cannot be read back: it was marked
    │                               failed with the reason and will not resume
    ├── RunTimeoutError(TimeoutError)    a run exceeded the client's whole-run ``timeout``
    ├── RunCancelledError           a held run (``RunHandle``) was cancelled: no result
    ├── OutputValidationError       a run's output stayed invalid after its retries;
    │                               carries the raw reply and what is wrong with it
    └── ModelError                  anything between us and the model
        ├── ProviderError           the provider answered with a non-2xx status;
        │                           carries ``status`` and a bounded ``body`` excerpt
        ├── ProtocolError           a 2xx reply that lacks what the wire style requires
        │   └── ReplyTooLargeError       the reply is longer than ``max_reply_bytes``
        └── TransportError          the request never got an HTTP answer (connection
                                    refused, reset, timed out); mapped from aiohttp

``HaltRun`` is not in the tree: it is a signal, not an error (a ``wait_for`` raises it to
halt the run), defined with the wire types in ``_core/types.py``.

Every name ends in ``Error``; every class is raised with a message that says what to do.

Rules kept by every raise site:

- No third-party exception leaves the package: aiohttp errors are mapped in
  ``_io/transport.py`` and raised with neither ``__cause__`` nor ``__context__``, since the
  originals may hold secrets.
- No message, ``repr`` or attribute ever carries an API key or a header value: errors are
  built from the status, the URL and the body the provider sent, and the body excerpt is
  scrubbed of the key before it is stored.
- Tools never raise across the toolkit: their failures become error results for the model,
  so none of these is a tool error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .results import RunResult

__all__ = (
    "AlreadyAnsweredError",
    "AlreadyResumedError",
    "AnswerError",
    "AnswerMismatchError",
    "ConfinementError",
    "RequestExpiredError",
    "RunTimeoutError",
    "RunCancelledError",
    "StoreError",
    "UnknownRequestError",
    "ModelError",
    "OutputValidationError",
    "PayloadError",
    "ProtocolError",
    "ProviderError",
    "ReplyTooLargeError",
    "ToolnexusError",
    "TransportError",
    "UsageError",
)

# A provider's error body can be megabytes of HTML from a proxy; the excerpt is for a human.
BODY_EXCERPT_LIMIT = 500


class ToolnexusError(Exception):
    """Base class of every error raised by toolnexus_async."""


class UsageError(ToolnexusError, ValueError):
    """The library was called in a way it does not support.

    Subclasses :class:`ValueError` so that existing ``except ValueError`` handlers still work.
    """


class PayloadError(ToolnexusError, ValueError, TypeError):
    """A data value is malformed or of the wrong type: a ``Request``, ``Answer`` or
    ``ToolResult`` being built, or a wire payload (a stored transcript, a JSON body).

    Both a :class:`ValueError` and a :class:`TypeError`, so that either ``except`` catches
    ``Answer(request_id, ok="no")``.
    """


class ConfinementError(ToolnexusError, ValueError):
    """A path leads outside a confined workspace; the message names the path and the root."""

    def __init__(self, path: str, root: Path, why: str) -> None:
        super().__init__(f"{path!r} {why} the workspace root {str(root)!r}; access refused")
        self.path = path
        self.root = root


class AnswerError(ToolnexusError, LookupError):
    """An answer could not be applied; the state it was meant for is unchanged.

    Attributes:
        request_id: the id the answer carried.
    """

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.request_id, str(self)))


class UnknownRequestError(AnswerError):
    """No outstanding request has this id (never parked, or its run was cancelled)."""


class AlreadyAnsweredError(AnswerError):
    """The request was answered already; a second answer is refused."""


class RequestExpiredError(AnswerError):
    """The request's ``expires_at`` passed before the answer came; its run was told so."""


class AnswerMismatchError(AnswerError):
    """The answer does not fit its request: resuming, its id echoes none of the halted run's
    outstanding requests; or it approves, by ``data["digest"]``, another call than the
    approval request shows. Nothing was taken."""


class AlreadyResumedError(AnswerError):
    """Resuming: another resume claimed this request first; only one may proceed."""


class StoreError(ToolnexusError):
    """A stored run cannot be read back (corrupt, foreign, or from a newer release)."""


class StoreUnavailableError(StoreError):
    """The run store cannot be reached now: the database is down or restarting, a
    connection dropped, a statement outlived the store's timeout (a lock held too long),
    the disk is full or the file is read-only or locked by another process.

    A passing fault, not a verdict on any run: what the store committed is intact, and
    the same call may succeed later. A write to PostgreSQL that failed so may or may not
    have been committed (the reply was lost); one to SQLite was not (but after an I/O
    error, which the message says). The durable host retries its own writes until the
    store is back, in a way that is safe either way. ``retry_after`` is a hint, in
    seconds, for a client told to come back (HTTP ``Retry-After``).
    """

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DamagedRunError(StoreError):
    """A stored run cannot be read back (its row does not parse, or was written by a newer
    release): the store marked it failed with the reason, once, and nothing resumes it.
    ``run_id`` names it."""

    def __init__(self, run_id: str, message: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunTimeoutError(ToolnexusError, TimeoutError):
    """A run took longer than the client's ``timeout``; the run was cancelled."""


class RunCancelledError(ToolnexusError):
    """A run held by a ``RunHandle`` was cancelled before it ended: it has no result."""


class OutputValidationError(ToolnexusError):
    """A run given ``output_type=`` got no valid output: its last reply was still invalid
    after the model was asked to correct it ``output_retries`` times.

    Attributes:
        raw: the reply that was read: its text, or the output tool's arguments as JSON.
        errors: what is wrong with it (the validator's message, or the JSON error).
        run: the run as it ended: ``status == "incomplete"``, ``limit ==
            "output_invalid"``, every reply and correction in ``messages``.
    """

    def __init__(self, raw: str, errors: str, run: RunResult) -> None:
        super().__init__(f"the model's output is not valid after the retries: {errors}")
        self.raw = raw
        self.errors = errors
        self.run = run


class ModelError(ToolnexusError):
    """The model could not be asked, or its answer could not be used.

    Attributes:
        run: when raised by a run, the run as it stood at the failed request:
            ``status == "incomplete"``, ``limit == "model_error"``, every tool call so far
            answered in ``messages``. Continue it with
            ``client.run(None, toolkit, history=error.run.messages)``; the tools that
            already ran do not run again.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        # An instance attribute, not a class annotation: this module imports nothing of
        # the run machinery (which imports it), and type hints of the class still resolve.
        self.run: RunResult | None = None


class ProviderError(ModelError):
    """The provider replied with a status outside 2xx.

    Attributes:
        status: the HTTP status code.
        body: at most 500 characters of the reply body, as sent by the provider.
        url: the endpoint that was called.
        headers: the reply's headers, names lower-cased (``retry-after`` is the one a
            retry policy reads). Reply headers carry no secret of ours.
        hint: the likely fix, when the client can tell (a 404 from an OpenAI-style
            ``base_url`` without ``/v1``, a 401 when no key was given), else ``None``; it
            ends the message.
    """

    def __init__(
        self,
        status: int,
        body: str,
        url: str,
        *,
        truncated: bool = False,
        headers: Mapping[str, str] | None = None,
        hint: str | None = None,
    ) -> None:
        self.status = status
        self.body = body[:BODY_EXCERPT_LIMIT]
        self.url = url
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.truncated = truncated or len(body) > BODY_EXCERPT_LIMIT
        self.hint = hint
        cut = "..." if self.truncated else ""
        told = f"\nhint: {hint}" if hint else ""
        super().__init__(f"provider replied HTTP {status} from {url}: {self.body}{cut}{told}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_provider_error,
            (self.status, self.body, self.url, self.truncated, self.headers, self.hint),
        )


def _rebuild_provider_error(
    status: int,
    body: str,
    url: str,
    truncated: bool,
    headers: dict[str, str],
    hint: str | None = None,
) -> ProviderError:
    return ProviderError(status, body, url, truncated=truncated, headers=headers, hint=hint)


class ProtocolError(ModelError):
    """A 2xx reply that is not what the wire style promises (missing keys, wrong types)."""


class ReplyTooLargeError(ProtocolError):
    """The reply is longer than the client's ``max_reply_bytes``; it was not read further.

    Attributes:
        limit: the cap, in bytes (decompressed).
    """

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_too_large, (str(self), self.limit))


def _rebuild_too_large(message: str, limit: int) -> ReplyTooLargeError:
    return ReplyTooLargeError(message, limit=limit)


class TransportError(ModelError):
    """The request got no HTTP reply: the connection failed, broke or timed out."""
