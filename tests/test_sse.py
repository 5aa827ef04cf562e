"""The incremental SSE parser (toolnexus_async/_codecs/_sse.py): bytes in, events out, pure."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from toolnexus_async import UsageError
from toolnexus_async._core.codecs._sse import SSEEvent, SSEParser

# A realistic stream: named events, CRLF, a comment, multi-line data, multi-byte UTF-8
# (two-, three- and four-byte characters), an id, a retry, and an event with no data.
REALISTIC = (
    ": keep-alive\r\n"
    "\r\n"
    "event: message_start\r\n"
    'data: {"text": "12 °C in Zürich"}\r\n'
    "\r\n"
    "id: 7\r\n"
    "data: first line\r\n"
    "data: second line — 🌍\r\n"
    "\r\n"
    "event: ping\r\n"
    "\r\n"
    "retry: 1500\r\n"
    "data:€\r\n"
    "\r\n"
).encode()

REALISTIC_EVENTS = [
    SSEEvent("message_start", '{"text": "12 °C in Zürich"}'),
    SSEEvent("message", "first line\nsecond line — 🌍", id="7"),
    SSEEvent("message", "€", id="7", retry=1500),
]


def parse(chunks: Iterable[bytes]) -> tuple[list[SSEEvent], SSEParser]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events, parser


def test_the_realistic_stream_parses_to_the_expected_events():
    """One chunk: named events, comments, multi-line data, id and retry come out right."""
    events, parser = parse([REALISTIC])
    assert events == REALISTIC_EVENTS
    assert not parser.pending


def test_every_single_split_gives_the_same_events():
    """Cut anywhere (inside a UTF-8 character, between CR and LF), the events are the same."""
    assert any(b >= 0xF0 for b in REALISTIC)  # a four-byte character is there to be cut
    for cut in range(len(REALISTIC) + 1):
        events, parser = parse([REALISTIC[:cut], REALISTIC[cut:]])
        assert events == REALISTIC_EVENTS, f"cut at byte {cut}"
        assert not parser.pending


def test_every_pair_of_splits_gives_the_same_events():
    """Three pieces, cut at every pair of positions of a CRLF stream with multi-byte text."""
    raw = "data: é🌍\r\ndata: x\r\n\r\nevent: e\rdata: ü\r\r".encode()
    expected = [SSEEvent(data="é🌍\nx"), SSEEvent("e", "ü")]
    for i in range(len(raw) + 1):
        for j in range(i, len(raw) + 1):
            events, _ = parse([raw[:i], raw[i:j], raw[j:]])
            assert events == expected, f"cuts at {i}, {j}"


def test_byte_at_a_time_gives_the_same_events():
    """Fed one byte per call, the parser still produces exactly the same events."""
    events, _ = parse(REALISTIC[i : i + 1] for i in range(len(REALISTIC)))
    assert events == REALISTIC_EVENTS


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_each_line_ending_is_a_line_ending(eol: str):
    """LF, CRLF and a lone CR each end a line, and a doubled one ends the event."""
    raw = f"event: a{eol}data: 1{eol}data: 2{eol}{eol}data: 3{eol}{eol}".encode()
    events, _ = parse([raw])
    assert events == [SSEEvent("a", "1\n2"), SSEEvent("message", "3")]


def test_mixed_line_endings_in_one_stream():
    """A stream may mix the three endings; each is honoured where it stands."""
    events, _ = parse([b"data: a\rdata: b\r\n\ndata: c\n\r\n"])
    assert events == [SSEEvent(data="a\nb"), SSEEvent(data="c")]


def test_cr_then_lf_in_the_next_chunk_is_one_line_ending():
    """A CRLF cut between CR and LF is one ending, not a line and a blank line."""
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\ndata: b\r\n\r\n") == [SSEEvent(data="a\nb")]


def test_a_cr_ended_line_before_the_cut_does_not_swallow_the_next_chunks_lf():
    """Only a CR that ends the chunk can pair with an LF in the next one."""
    raw = b"data: a\rdata: b\n\ndata: c\n\n"
    expected = [SSEEvent(data="a\nb"), SSEEvent(data="c")]
    assert parse([raw])[0] == expected
    for i in range(len(raw) + 1):
        for j in range(i, len(raw) + 1):
            events, _ = parse([raw[:i], raw[i:j], raw[j:]])
            assert events == expected, f"cuts at {i}, {j}"


def test_an_event_ending_in_cr_is_dispatched_without_waiting_for_more_bytes():
    """With lone-CR endings, the event comes out as soon as its blank line ends."""
    parser = SSEParser()
    assert parser.feed(b"data: now\r\r") == [SSEEvent(data="now")]


def test_comments_are_ignored_and_a_comment_only_block_is_no_event():
    """Lines starting with ':' are dropped; they neither dispatch nor end an event."""
    events, parser = parse([b": hello\n\ndata: a\n: in the middle\ndata: b\n\n:bye\n"])
    assert events == [SSEEvent(data="a\nb")]
    assert not parser.pending


def test_only_one_leading_space_after_the_colon_is_stripped():
    """'data:x' and 'data: x' are both 'x'; 'data:  x' keeps one space."""
    events, _ = parse([b"data:x\n\ndata: x\n\ndata:  x\n\n"])
    assert [e.data for e in events] == ["x", "x", " x"]


def test_empty_data_lines_still_make_an_event():
    """'data' without a colon and 'data:' are empty lines of data, joined like the rest."""
    events, _ = parse([b"data\n\ndata:\ndata:\n\n"])
    assert [e.data for e in events] == ["", "\n"]


def test_a_block_without_data_is_not_dispatched():
    """An 'event:' line alone does not make an event, and its name does not leak onward."""
    events, _ = parse([b"event: ping\n\ndata: after\n\n"])
    assert events == [SSEEvent("message", "after")]


def test_the_event_name_is_reset_after_each_event():
    """A named event does not lend its name to the next one."""
    events, _ = parse([b"event: a\ndata: 1\n\ndata: 2\n\n"])
    assert [e.event for e in events] == ["a", "message"]


def test_unknown_fields_are_ignored():
    """Fields other than event, data, id and retry change nothing."""
    events, _ = parse([b"foo: bar\ndata: x\nDATA: y\nevent2: z\n\n"])
    assert events == [SSEEvent(data="x")]


def test_the_last_event_id_persists_and_an_id_with_nul_is_ignored():
    """'id' sets the last event id for this and later events; one holding NUL is dropped."""
    events, _ = parse([b"id: 1\ndata: a\n\ndata: b\n\nid: 2\x00\ndata: c\n\nid\ndata: d\n\n"])
    assert [e.id for e in events] == ["1", "1", "1", ""]


def test_retry_takes_only_digits_and_belongs_to_its_own_block():
    """'retry' needs ASCII digits; the value rides on its own event only."""
    events, _ = parse([b"retry: 250\ndata: a\n\ndata: b\n\nretry: 1s\ndata: c\n\n"])
    assert [e.retry for e in events] == [250, None, None]


def test_a_leading_byte_order_mark_is_skipped_even_when_cut():
    """A UTF-8 BOM at the very start is not part of the first field name."""
    raw = b"\xef\xbb\xbfdata: x\n\n"
    for cut in range(len(raw) + 1):
        events, _ = parse([raw[:cut], raw[cut:]])
        assert events == [SSEEvent(data="x")], f"cut at byte {cut}"


def test_invalid_utf8_is_replaced_not_fatal():
    """A bad byte becomes U+FFFD, as the spec decodes the stream."""
    events, _ = parse([b"data: a\xffb\n\n"])
    assert events == [SSEEvent(data="a\ufffdb")]


@pytest.mark.parametrize(
    "tail",
    [b"data: cut", b"data: whole line\n", b"event: x\n", b"data: \xf0\x9f"],
    ids=["partial-line", "no-blank-line", "fields-only", "partial-utf8"],
)
def test_close_mid_event_drops_it_and_reports_pending(tail: bytes):
    """An event without its blank line is not dispatched at close, and pending says so."""
    parser = SSEParser()
    assert parser.feed(b"data: done\n\n" + tail) == [SSEEvent(data="done")]
    assert parser.pending
    assert parser.close() == []
    assert parser.pending


def test_a_clean_end_is_not_pending():
    """A stream that ends on its blank line (or after a comment) is not pending."""
    parser = SSEParser()
    parser.feed(b"data: x\n\n: trailing comment\n")
    assert parser.close() == []
    assert not parser.pending


def test_feed_after_close_is_refused():
    """Bytes after the end of the stream are a caller's bug, reported as such."""
    parser = SSEParser()
    parser.close()
    with pytest.raises(UsageError, match="after close"):
        parser.feed(b"data: x\n\n")
