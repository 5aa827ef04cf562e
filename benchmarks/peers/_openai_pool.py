"""The HTTP client the OpenAI-SDK-based peers get: the SDK's own, without a pool cap.

The ``openai`` SDK (under pydantic-ai, the Agents SDK and langchain-openai) keeps at most
100 idle connections by default, so at 500 concurrent runs most requests would open a new
TCP connection; toolnexus_async and the floor run with no cap in this benchmark
(``AiohttpTransport(max_connections=None)``, ``aiohttp.TCPConnector(limit=0)``), and each
peer gets the same here, through the hook its documentation gives for it. The timeout is
theirs too, 600 s: the SDK's own connect timeout of 5 s fails runs at 500 concurrent runs on
a busy 2-core machine (the event loop is too busy to finish the handshakes in time), which
measures the machine more than the framework.
"""

from __future__ import annotations

import httpx2
import openai


def unbounded_http_client() -> openai.DefaultAsyncHttpxClient:
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    return openai.DefaultAsyncHttpxClient(limits=limits, timeout=httpx2.Timeout(600.0))
