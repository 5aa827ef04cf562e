"""toolnexus_async: an asyncio-native agent runtime in which a tool can stop to ask a human.

A tool returns ``ToolResult.pending(Request(...))`` instead of an answer; the run then
either awaits the host's ``wait_for(request)`` and retries the tool once with the answer,
or, without ``wait_for``, halts with ``status == "pending"`` so a durable host
(:mod:`toolnexus_async.durable`) can resume it later. Everything awaits, so many
suspended runs can share one event loop.
"""

from ._core.config import Limits, ModelSettings
from ._core.errors import (
    AlreadyAnsweredError,
    AlreadyResumedError,
    AnswerError,
    AnswerMismatchError,
    ConfinementError,
    DamagedRunError,
    ModelError,
    PayloadError,
    ProtocolError,
    ProviderError,
    ReplyTooLargeError,
    RequestExpiredError,
    RunCancelledError,
    RunTimeoutError,
    StoreError,
    StoreUnavailableError,
    ToolnexusError,
    TransportError,
    UnknownRequestError,
    UsageError,
)
from ._core.http import HttpRequest, HttpResponse, Transport
from ._core.messages import (
    AssistantMessage,
    Message,
    ModelReply,
    Reasoning,
    SystemMessage,
    ToolCall,
    ToolReturn,
    Usage,
    UserMessage,
    messages_from_json,
    messages_to_json,
)
from ._core.results import RunResult, ToolCallRecord
from ._core.retry import RetryPolicy, parse_retry_after
from ._core.types import Answer, HaltRun, Request, Tool, ToolContext, ToolResult, pending_of
from ._core.version import __version__ as __version__
from ._engine.client import LlmClient
from ._engine.conversations import (
    ConversationLocks,
    ConversationStore,
    MemoryConversationStore,
    SqliteConversationStore,
)
from ._engine.handle import RunHandle
from ._engine.hooks import Hooks, LlmCall, require_approval
from ._engine.metrics import LlmCallEvent, MetricEvent, MetricsRegistry, RunEvent, ToolCallEvent
from ._engine.streaming import (
    RunStream,
    StreamDone,
    StreamEvent,
    StreamPending,
    StreamReasoning,
    StreamText,
    StreamToolCall,
    StreamToolResult,
    StreamUsage,
)
from ._engine.toolkit import Toolkit
from ._io.terminal import terminal_input
from ._io.transport import AiohttpTransport
from .suspend import Inbox
from .tools.http import HttpTool, http_tool
from .tools.native import FunctionTool, define_tool

__all__ = (
    # wire data and results
    "Answer",
    "Request",
    "ToolResult",
    "ToolContext",
    "Tool",
    "pending_of",
    "HaltRun",
    # tools
    "Toolkit",
    "FunctionTool",
    "define_tool",
    "HttpTool",
    "http_tool",
    # running
    "LlmClient",
    "Limits",
    "ModelSettings",
    "Transport",
    "AiohttpTransport",
    "HttpRequest",
    "HttpResponse",
    "RunHandle",
    "Inbox",
    "terminal_input",
    "RunResult",
    "ToolCallRecord",
    "Usage",
    "ModelReply",
    # streaming
    "RunStream",
    "StreamEvent",
    "StreamText",
    "StreamReasoning",
    "StreamToolCall",
    "StreamToolResult",
    "StreamPending",
    "StreamUsage",
    "StreamDone",
    # hooks, resilience, metrics, conversations
    "Hooks",
    "LlmCall",
    "require_approval",
    "RetryPolicy",
    "parse_retry_after",
    "MetricEvent",
    "LlmCallEvent",
    "ToolCallEvent",
    "RunEvent",
    "MetricsRegistry",
    "ConversationStore",
    "MemoryConversationStore",
    "SqliteConversationStore",
    "ConversationLocks",
    # the transcript
    "Message",
    "SystemMessage",
    "UserMessage",
    "AssistantMessage",
    "Reasoning",
    "ToolCall",
    "ToolReturn",
    "messages_to_json",
    "messages_from_json",
    # errors
    "ToolnexusError",
    "UsageError",
    "PayloadError",
    "ConfinementError",
    "AnswerError",
    "UnknownRequestError",
    "AlreadyAnsweredError",
    "RequestExpiredError",
    "RunTimeoutError",
    "RunCancelledError",
    "AnswerMismatchError",
    "AlreadyResumedError",
    "StoreError",
    "StoreUnavailableError",
    "DamagedRunError",
    "ModelError",
    "ProviderError",
    "ProtocolError",
    "ReplyTooLargeError",
    "TransportError",
)


def _report_the_package_as_module() -> None:
    # Public names say they are toolnexus_async's (as httpx does): reprs, error tracebacks,
    # docs and pickles name toolnexus_async.Answer, not the private module it lives in.
    # Their string annotations are evaluated first, in the module that wrote them, since
    # typing.get_type_hints (attrs, FastAPI, cattrs) would look them up in __module__.
    import inspect

    for name in __all__:
        value = globals()[name]
        if inspect.isclass(value) or inspect.isfunction(value):
            value.__annotations__ = inspect.get_annotations(value, eval_str=True)
            value.__module__ = __name__


_report_the_package_as_module()
