"""JSON on the hot path: ``json.loads`` and a compact ``json.dumps``, minus their Python steps.

Every run decodes each model reply (``HttpModel``, each streamed event) and each tool call's
arguments (the codecs), and encodes each request body (``HttpModel``; the tools' part once
per toolkit, ``codecs/_tools.py``); those use this module. Everything else (stored rows,
tool results, serve, the few arguments a codec encodes again) uses ``json`` itself: no
benchmark shows a difference there.

The standard functions wrap C code in a few Python steps per call (``json.loads``: type
checks, encoding detection, two regular-expression matches for the whitespace around the
value; ``json.dumps`` with separators: a new encoder and a closure per call). For the usual
input, these helpers call the same C code directly and give the same results.

Kept because ``benchmarks/instructions.py`` shows it beyond its noise (issue 36; 3.11.7,
``--runs 200 --base 50``): 1,561,469 instructions per run with plain ``json``, ratio to the
floor 1.189; 1,501,842 and 1,504,927 with this module, ratios 1.162 and 1.154 (the floor's
own count moved by 1.8 % across those processes).

Rules of this module:

- The result, and every error, is exactly what ``json.loads`` / ``json.dumps`` give: input
  the fast step does not take as it is (leading whitespace, a byte-order mark, bytes that
  are not UTF-8, anything after the value, a syntax error) goes to ``json.loads`` itself,
  which decides and words the error. A document nested too deeply raises
  ``RecursionError`` either way.
- Without CPython's C accelerator (``_json``), the encoder is ``JSONEncoder.encode`` as it
  is, and the decoder scans with ``json``'s pure-Python scanner, which behaves alike.
"""

from __future__ import annotations

import json
import json.decoder
import json.encoder
from collections.abc import Callable
from typing import Any

__all__ = ("canonical", "compact", "compact_encoder", "json_string", "loads")

# JSON's own whitespace (RFC 8259), which may follow a value; str.isspace would take more.
_WHITESPACE = " \t\n\r"

# The default decoder's scanner: the value at an index, and where it ends. (It and the C
# encoder below are not in typeshed's stubs, hence the Any.)
_DECODER: Any = json.decoder.JSONDecoder()
_scan: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once
# What the scanner is given (bytes decoded first); anything else goes to json.loads. A tuple,
# not ``str | bytes``, which would build a union on every call.
_SCANNED = (str, bytes)


def loads(data: str | bytes | bytearray) -> Any:
    """``json.loads(data)``: the same value, or the same error."""
    if isinstance(data, _SCANNED):
        try:
            text = data.decode() if isinstance(data, bytes) else data
            value, end = _scan(text, 0)
        except (StopIteration, UnicodeDecodeError):
            pass  # json.loads says what is wrong, or reads what UTF-8 alone cannot
        else:
            if end == len(text) or not text[end:].strip(_WHITESPACE):
                return value
    return json.loads(data)


def compact_encoder(
    *,
    ensure_ascii: bool,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> Callable[[Any], str]:
    """``json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii,
    sort_keys=sort_keys, default=default)`` as a function.

    Circular references raise ``ValueError`` and values JSON cannot hold ``TypeError`` (when
    there is no ``default``), as with ``json.dumps``.
    """
    encoder = json.JSONEncoder(
        separators=(",", ":"), ensure_ascii=ensure_ascii, sort_keys=sort_keys, default=default
    )
    c_json: Any = json.encoder
    make: Callable[..., Callable[[Any, int], list[str]]] | None = c_json.c_make_encoder
    escape = c_json.c_encode_basestring_ascii if ensure_ascii else c_json.c_encode_basestring
    if make is None or escape is None:
        return encoder.encode
    default_of = encoder.default  # the ``default`` given, else the one that raises TypeError
    join = "".join
    # C encoders not in use. Each holds its map of the containers being encoded (how it
    # finds circular references, json.dumps's check_circular), which is empty again after
    # an encoding that succeeds; one that raised may have left entries, so it is dropped.
    # Taken from the list and put back (atomic steps): a ``default`` that encodes again, or
    # another thread, gets an encoder of its own. Making one costs about 3,000 instructions,
    # which a request body and a digest each paid (canonical: 16,593 instructions for a
    # gate's {"tool", "arguments"} made anew, 14,785 reused; callgrind).
    idle: list[Callable[[Any, int], list[str]]] = []
    take, put = idle.pop, idle.append

    def encode(value: Any) -> str:
        try:
            c_encode = take()
        except IndexError:
            c_encode = make({}, default_of, escape, None, ":", ",", sort_keys, False, True)
        text = join(c_encode(value, 0))  # raising, it is not put back
        put(c_encode)
        return text

    return encode


compact = compact_encoder(ensure_ascii=False)
"""Compact JSON, non-ASCII kept as it is: how request bodies are encoded."""

canonical = compact_encoder(ensure_ascii=False, sort_keys=True, default=repr)
"""Compact JSON with sorted keys, non-ASCII kept as it is, and ``repr`` of what JSON cannot
hold: the text every digest of this package is taken over (``audit.canonical_digest``)."""

json_string: Callable[[str], str] = json.encoder.encode_basestring
"""A str as the JSON string :data:`compact` and :data:`canonical` write for it (quoted,
escaped, non-ASCII kept as it is): json's own, in C where there is C."""
