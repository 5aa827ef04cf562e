"""MetricsRegistry: counting, histograms, and Prometheus text that a strict parser accepts."""

from __future__ import annotations

import gc
import math
import re
import weakref

import attrs
import pytest

from toolnexus_async._core.errors import UsageError
from toolnexus_async._engine.metrics import (
    CONTENT_TYPE,
    DURATION_BUCKETS,
    RUN_DURATION_BUCKETS,
    LlmCallEvent,
    MetricEvent,
    MetricsRegistry,
    RunEvent,
    ToolCallEvent,
)

# ---- a tiny strict parser for the text exposition format 0.0.4 ---------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_HELP = re.compile(rf"# HELP ({_NAME}) (.*)")
_TYPE = re.compile(rf"# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)")
_SAMPLE = re.compile(rf"({_NAME})(\{{.*\}})? (\S+)")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}

Sample = tuple[str, tuple[tuple[str, str], ...]]


def _parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    """Parse ``{a="x",b="y"}`` exactly; escapes other than \\\\, \\" and \\n are refused."""
    assert text.startswith("{") and text.endswith("}"), text
    body, i, pairs = text[1:-1], 0, []
    while i < len(body):
        match = _LABEL_NAME.match(body, i)
        assert match, f"bad label name at {body[i:]!r}"
        name, i = match.group(), match.end()
        assert body[i : i + 2] == '="', f'expected =" after {name}'
        i += 2
        value = []
        while body[i] != '"':
            if body[i] == "\\":
                assert body[i + 1] in _ESCAPES, f"bad escape {body[i : i + 2]!r}"
                value.append(_ESCAPES[body[i + 1]])
                i += 2
            else:
                assert body[i] != "\n"
                value.append(body[i])
                i += 1
        i += 1
        pairs.append((name, "".join(value)))
        if i < len(body):
            assert body[i] == ",", f"expected , at {body[i:]!r}"
            i += 1
    names = [n for n, _ in pairs]
    assert len(names) == len(set(names)), f"duplicate label in {text}"
    return tuple(pairs)


def _family(name: str, types: dict[str, str]) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(suffix)
        if base != name and types.get(base) == "histogram":
            return base
    return name


def parse(text: str) -> tuple[dict[str, str], dict[Sample, float]]:
    """Parse exposition text strictly: returns (metric types, samples).

    Every line is a HELP, a TYPE or a ``name{labels} value`` sample; each metric has one
    HELP then one TYPE before its samples, and its samples are contiguous; no sample
    repeats; the text ends with a line feed.
    """
    assert text.endswith("\n")
    types: dict[str, str] = {}
    helped: set[str] = set()
    samples: dict[Sample, float] = {}
    current: str | None = None
    closed: set[str] = set()
    for line in text[:-1].split("\n"):
        if match := _HELP.fullmatch(line):
            name = match[1]
            assert name not in helped, f"second HELP for {name}"
            helped.add(name)
            if current is not None:
                closed.add(current)
            current = None
        elif match := _TYPE.fullmatch(line):
            name = match[1]
            assert name in helped and name not in types, f"TYPE of {name} out of place"
            types[name] = match[2]
            current = name
        else:
            match = _SAMPLE.fullmatch(line)
            assert match, f"not a sample line: {line!r}"
            family = _family(match[1], types)
            assert family == current and family not in closed, f"{line!r} outside its metric"
            labels = _parse_labels(match[2]) if match[2] else ()
            key = (match[1], labels)
            assert key not in samples, f"repeated sample {line!r}"
            samples[key] = float(match[3])  # float() accepts +Inf and NaN
    return types, samples


def _value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(labels.items()))]


def _registry(*events: MetricEvent) -> MetricsRegistry:
    registry = MetricsRegistry()
    for event in events:
        registry.observe(event)
    return registry


def llm(model: str = "m", status: str = "ok", seconds: float = 0.1, **kw: object) -> LlmCallEvent:
    return LlmCallEvent(model, "openai", status, seconds, **kw)  # type: ignore[arg-type]


def tool(
    name: str = "t", outcome: str = "ok", seconds: float = 0.1, source: str = "builtin"
) -> ToolCallEvent:
    return ToolCallEvent(name, source, outcome, seconds)


# ---- counters --------------------------------------------------------------------------


def test_llm_requests_counted_per_label_set() -> None:
    """Each (model, status) pair has its own count."""
    registry = _registry(llm("a"), llm("a"), llm("a", "error"), llm("b"))
    assert {("a", "ok"): 2, ("a", "error"): 1, ("b", "ok"): 1} == registry.snapshot()[
        "toolnexus_llm_requests_total"
    ]


def test_tokens_split_prompt_and_completion() -> None:
    """Prompt and completion tokens add up separately, per model."""
    registry = _registry(
        llm("a", prompt_tokens=10, completion_tokens=3),
        llm("a", prompt_tokens=5, completion_tokens=1),
        llm("b", prompt_tokens=7),
    )
    expected = {
        ("a", "prompt"): 15,
        ("a", "completion"): 4,
        ("b", "prompt"): 7,
        ("b", "completion"): 0,
    }
    assert expected == registry.snapshot()["toolnexus_llm_tokens_total"]
    _, samples = parse(registry.render())
    assert 15 == _value(samples, "toolnexus_llm_tokens_total", model="a", kind="prompt")
    assert 4 == _value(samples, "toolnexus_llm_tokens_total", model="a", kind="completion")


def test_cache_and_reasoning_tokens_are_kinds_of_their_own_once_reported() -> None:
    """cache_read, cache_write and reasoning add up per model, and appear only for a model
    that reported some."""
    registry = _registry(
        llm("a", prompt_tokens=10, cache_read_tokens=6, reasoning_tokens=2, completion_tokens=3),
        llm("a", prompt_tokens=5, cache_write_tokens=4),
        llm("b", prompt_tokens=7),
    )
    tokens = registry.snapshot()["toolnexus_llm_tokens_total"]
    assert (tokens[("a", "cache_read")], tokens[("a", "cache_write")]) == (6, 4)
    assert tokens[("a", "reasoning")] == 2
    assert sorted(kind for model, kind in tokens if model == "b") == ["completion", "prompt"]
    _, samples = parse(registry.render())
    assert 6 == _value(samples, "toolnexus_llm_tokens_total", model="a", kind="cache_read")


def test_tool_calls_counted_by_tool_source_and_outcome() -> None:
    """Tool calls are keyed by tool, source and outcome."""
    registry = _registry(tool("read"), tool("read"), tool("read", "error"), tool("x", source="mcp"))
    expected = {
        ("read", "builtin", "ok"): 2,
        ("read", "builtin", "error"): 1,
        ("x", "mcp", "ok"): 1,
    }
    assert expected == registry.snapshot()["toolnexus_tool_calls_total"]


def test_pending_tool_call_counts_as_pending_never_error() -> None:
    """A suspension adds to outcome="pending" and nothing to outcome="error"."""
    registry = _registry(tool("ask", "pending"), tool("ask", "pending"))
    assert {("ask", "builtin", "pending"): 2} == registry.snapshot()["toolnexus_tool_calls_total"]
    _, samples = parse(registry.render())
    assert 2 == _value(
        samples, "toolnexus_tool_calls_total", tool="ask", source="builtin", outcome="pending"
    )
    assert not any('outcome="error"' in line for line in registry.render().splitlines())


def test_pending_tool_call_stays_out_of_tool_duration() -> None:
    """Only finished tool calls are timed; the time until a suspension is not a duration."""
    registry = _registry(tool("ask", "pending", 9.0), tool("ask", "ok", 0.5))
    _, samples = parse(registry.render())
    assert 1 == _value(samples, "toolnexus_tool_duration_seconds_count", tool="ask")
    assert 0.5 == _value(samples, "toolnexus_tool_duration_seconds_sum", tool="ask")


def test_runs_counted_by_status() -> None:
    """Runs are keyed by their status, "error" included."""
    registry = _registry(
        RunEvent("done", 2, 1.0, "m"),
        RunEvent("done", 1, 1.0, "m"),
        RunEvent("error", 0, 0.1, None),
    )
    assert {("done",): 2, ("error",): 1} == registry.snapshot()["toolnexus_runs_total"]


def test_error_class_name_is_not_a_label() -> None:
    """The error name stays on the event: labels are only model and status."""
    registry = _registry(llm("m", "error", error="ProviderError"))
    assert "ProviderError" not in registry.render()
    assert {("m", "error"): 1} == registry.snapshot()["toolnexus_llm_requests_total"]


# ---- histograms ------------------------------------------------------------------------


def test_histogram_buckets_are_cumulative_with_right_sum_and_count() -> None:
    """Bucket le=b counts every observation <= b; _sum and _count cover all of them."""
    registry = MetricsRegistry(duration_buckets=(0.1, 1.0, 10.0))
    for seconds in (0.05, 0.1, 0.5, 2.0, 20.0):
        registry.observe(llm("m", seconds=seconds))
    _, samples = parse(registry.render())
    name = "toolnexus_llm_request_duration_seconds"
    buckets = [_value(samples, f"{name}_bucket", model="m", le=le) for le in ("0.1", "1.0", "10.0")]
    assert [2, 3, 4] == buckets  # 0.1 sits on its bound, so le="0.1" holds it
    assert 5 == _value(samples, f"{name}_count", model="m")
    assert math.isclose(22.65, _value(samples, f"{name}_sum", model="m"))


def test_inf_bucket_equals_count() -> None:
    """The +Inf bucket is the last one and equals _count, for every series."""
    registry = _registry(
        llm("a", seconds=1e6),
        llm("b", seconds=0.0),
        tool("t", seconds=3.0),
        RunEvent("done", 1, 9e5, None),
    )
    text = registry.render()
    _, samples = parse(text)
    counts = {k: v for k, v in samples.items() if k[0].endswith("_count")}
    assert 4 == len(counts)
    for (name, labels), count in counts.items():
        base = name.removesuffix("_count")
        assert count == samples[(f"{base}_bucket", (*labels, ("le", "+Inf")))]
        les = [
            dict(k[1])["le"] for k in samples if k[0] == f"{base}_bucket" and k[1][:-1] == labels
        ]
        assert "+Inf" == les[-1]
        values = [float(le) for le in les]
        assert sorted(values) == values


def test_histogram_labels_and_default_buckets() -> None:
    """LLM durations are labelled by model, tools by tool only, runs not at all; the
    default bounds go from 5 ms for calls and up to hours for runs."""
    registry = _registry(
        llm("m"), tool("t", source="mcp", outcome="error"), RunEvent("done", 1, 1.0, "m")
    )
    _, samples = parse(registry.render())
    label_sets = {
        name: {n for n, _ in labels} - {"le"} for name, labels in samples if name.endswith("_count")
    }
    assert {
        "toolnexus_llm_request_duration_seconds_count": {"model"},
        "toolnexus_tool_duration_seconds_count": {"tool"},
        "toolnexus_run_duration_seconds_count": set(),
    } == label_sets
    assert 0.005 == DURATION_BUCKETS[0] and 60.0 in DURATION_BUCKETS
    assert RUN_DURATION_BUCKETS[-1] >= 3 * 3600
    run_les = [dict(k[1])["le"] for k in samples if k[0] == "toolnexus_run_duration_seconds_bucket"]
    assert len(RUN_DURATION_BUCKETS) + 1 == len(run_les)


def test_empty_registry_renders_every_metric_header() -> None:
    """Before any event every metric has HELP and TYPE, and the unlabelled run histogram
    is present at zero."""
    types, samples = parse(MetricsRegistry().render())
    assert {
        "toolnexus_llm_requests_total": "counter",
        "toolnexus_llm_tokens_total": "counter",
        "toolnexus_tool_calls_total": "counter",
        "toolnexus_runs_total": "counter",
        "toolnexus_llm_request_duration_seconds": "histogram",
        "toolnexus_tool_duration_seconds": "histogram",
        "toolnexus_run_duration_seconds": "histogram",
    } == types
    assert 0 == _value(samples, "toolnexus_run_duration_seconds_count")
    assert 0 == _value(samples, "toolnexus_run_duration_seconds_bucket", le="+Inf")
    assert {"toolnexus_run_duration_seconds"} == {n.rsplit("_", 1)[0] for n, _ in samples}


# ---- rendering -------------------------------------------------------------------------


def test_label_values_are_escaped() -> None:
    """Backslash, double quote and line feed in a label value are escaped, and read back."""
    nasty = 'a"b\\c\nd'
    registry = _registry(llm(nasty), tool(nasty, source=nasty))
    text = registry.render()
    assert 'model="a\\"b\\\\c\\nd"' in text
    _, samples = parse(text)
    assert 1 == _value(samples, "toolnexus_llm_requests_total", model=nasty, status="ok")
    assert 1 == _value(
        samples, "toolnexus_tool_calls_total", tool=nasty, source=nasty, outcome="ok"
    )
    assert 1 == _value(samples, "toolnexus_tool_duration_seconds_bucket", tool=nasty, le="+Inf")


def test_render_is_deterministic() -> None:
    """The same events in any order give the same text, and rendering twice changes nothing."""
    events: list[MetricEvent] = [
        llm("b", prompt_tokens=1),
        llm("a", "error"),
        tool("z", "pending"),
        tool("a"),
        RunEvent("pending", 1, 2.0, "a"),
        RunEvent("done", 3, 5.0, "b"),
    ]
    forward, backward = _registry(*events), _registry(*reversed(events))
    assert forward.render() == backward.render()
    assert forward.render() == forward.render()
    lines = [line for line in forward.render().splitlines() if line.startswith("toolnexus_runs")]
    assert [
        'toolnexus_runs_total{status="done"} 1',
        'toolnexus_runs_total{status="pending"} 1',
    ] == lines


def test_render_parses_as_valid_exposition() -> None:
    """A busy registry's text passes the strict parser, with HELP/TYPE before each metric."""
    registry = _registry(
        *(
            llm(f"m{i % 3}", "error" if i % 4 == 0 else "ok", i / 7, prompt_tokens=i)
            for i in range(30)
        ),
        *(tool(f"t{i % 5}", ("ok", "error", "pending")[i % 3], i / 3) for i in range(30)),
        *(
            RunEvent(("done", "pending", "incomplete", "error")[i % 4], i, i * 100.0, None)
            for i in range(8)
        ),
    )
    types, samples = parse(registry.render())
    assert 7 == len(types)
    assert 30 == sum(v for (n, _), v in samples.items() if n == "toolnexus_llm_requests_total")
    assert 30 == sum(v for (n, _), v in samples.items() if n == "toolnexus_tool_calls_total")
    assert 8 == _value(samples, "toolnexus_run_duration_seconds_count")
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_parser_rejects_broken_text() -> None:
    """The test parser itself refuses what the format forbids, so its passes mean something."""
    good = '# HELP x_total X.\n# TYPE x_total counter\nx_total{a="b"} 1\n'
    parse(good)
    for broken in (
        'x_total{a="b"} 1\n',  # sample before HELP/TYPE
        '# HELP x_total X.\n# TYPE x_total counter\nx_total{a="b\nc"} 1\n',  # raw newline
        '# HELP x_total X.\n# TYPE x_total counter\nx_total{a="b\\q"} 1\n',  # bad escape
        '# HELP x_total X.\n# TYPE x_total counter\nx_total{a="b"} 1',  # no final line feed
        good + '# HELP y Y.\n# TYPE y counter\nx_total{a="c"} 1\n',  # x sample out of its block
    ):
        with pytest.raises((AssertionError, IndexError)):
            parse(broken)


# ---- registry lifecycle, events, cost ---------------------------------------------------


def test_snapshot_is_a_copy_and_reset_forgets() -> None:
    """Mutating a snapshot leaves the registry alone; reset() empties every metric."""
    registry = _registry(llm("m"), tool("t"), RunEvent("done", 1, 1.0, "m"))
    snap = registry.snapshot()
    snap["toolnexus_llm_requests_total"][("m", "ok")] = 99
    assert 1 == registry.snapshot()["toolnexus_llm_requests_total"][("m", "ok")]
    registry.reset()
    assert all(not series for series in registry.snapshot().values())
    assert MetricsRegistry().render() == registry.render()


def test_observe_keeps_one_series_per_label_set_and_no_events() -> None:
    """observe folds events into a fixed set of series: many identical events add no state,
    and the registry holds no reference to an event (no timing is asserted)."""
    registry = MetricsRegistry()
    event = llm("m", prompt_tokens=1)
    ref = weakref.ref(event)
    for _ in range(10_000):
        registry.observe(event)
    snap = registry.snapshot()
    assert {("m", "ok"): 10_000} == snap["toolnexus_llm_requests_total"]
    assert 2 == len(snap["toolnexus_llm_tokens_total"])
    assert 1 == len(registry._histograms()["toolnexus_llm_request_duration_seconds"])
    del event
    gc.collect()
    assert ref() is None


def test_events_refuse_unknown_status_and_bad_numbers() -> None:
    """Statuses outside their sets, negative or NaN seconds and negative counts are refused."""
    with pytest.raises(ValueError):
        llm("m", "pending")
    with pytest.raises(ValueError):
        tool("t", "suspended")
    with pytest.raises(ValueError):
        RunEvent("failed", 1, 1.0, None)
    with pytest.raises(ValueError):
        llm("m", seconds=-1.0)
    with pytest.raises(ValueError):
        tool("t", seconds=math.nan)
    with pytest.raises(ValueError):
        llm("m", prompt_tokens=-1)
    with pytest.raises(ValueError):
        RunEvent("done", -1, 1.0, None)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        llm("m").status = "error"  # type: ignore[misc]


@pytest.mark.parametrize("buckets", [(), (1.0, 1.0), (2.0, 1.0), (1.0, math.inf), (math.nan,)])
def test_bad_buckets_are_refused(buckets: tuple[float, ...]) -> None:
    """Bucket bounds must be non-empty, finite and strictly increasing."""
    with pytest.raises(UsageError):
        MetricsRegistry(duration_buckets=buckets)
    with pytest.raises(UsageError):
        MetricsRegistry(run_buckets=buckets)
