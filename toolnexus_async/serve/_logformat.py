"""``serve --log-format json``: one JSON object per log record, for a service's log pipeline.

Rule of this module: a record becomes one line of JSON with fixed keys (``time`` in UTC,
RFC 3339 with milliseconds; ``level``; ``logger``; ``message``), plus ``run_id`` for a
record of a run, ``exception`` (the formatted traceback) when it has one, and ``trace_id``
and ``span_id`` when it was logged inside a recording OpenTelemetry span. Nothing is added
that the text format would not show: a secret kept out of a message stays out of the line.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

__all__ = ("JsonFormatter",)


class JsonFormatter(logging.Formatter):
    """Formats each record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, Any] = {
            "time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        run_id = getattr(record, "run_id", None)
        if run_id:
            out["run_id"] = run_id
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        out.update(_span_ids())
        return json.dumps(out, ensure_ascii=False, default=str)


def _span_ids() -> dict[str, str]:
    """The ids of the OpenTelemetry span the record was logged in, if any is recording.

    OpenTelemetry is looked up only if something imported it: a server that does not trace
    does not load it for its log.
    """
    otel = sys.modules.get("opentelemetry.trace")
    if otel is None:
        return {}
    context = otel.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
