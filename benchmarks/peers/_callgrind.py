"""Windows of a callgrind count, for ``park_rate.py --callgrind``: read and summed.

The counted process (``run_<name>.py park-count``) ends a part of the count after each
window of parks or wakes (callgrind's ``--dump-before=getppid``), and notes the collections
of each generation at each of those marks. A part's file gives its instructions and, from
its calls to the collector's entry, the instructions of the collections that fell in it
(the collector's own passes with what they free and finalize), so that a reader sees
whether two windows are alike: a full collection walks every tracked object of the
process, and one more or one fewer in a window moves it by tens of thousands of
instructions per park.

Standard library only, as the rest of ``benchmarks/peers``.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The function every cyclic collection of CPython 3.11 to 3.13 goes through, whatever
# started it (an allocation, gc.collect()); it does not call itself.
COLLECTOR = "gc_collect_main"

# With callgrind's --cache-sim=yes: its names for the first-level misses (instruction
# reads, data reads, data writes), summed into Part.misses.
L1_MISSES = ("I1mr", "D1mr", "D1mw")

_NAMED = re.compile(r"\((\d+)\)(?: (.*))?$")


@dataclass(frozen=True)
class Part:
    instructions: int
    collector: int  # inclusive: the collections that ran in this part
    misses: int = 0  # first-level cache misses, if the count simulated the caches


def read_part(path: Path, collector: str = COLLECTOR) -> Part:
    """A callgrind output file's total and the inclusive cost of its calls to ``collector``.

    In the format, a ``calls=`` line is followed by the position and the inclusive cost of
    those calls, to the function the last ``cfn=`` named; names are compressed as
    ``(id) name`` the first time and ``(id)`` after, in one table with ``fn=``'s. Costs are
    in the order of the ``events:`` line, instructions (``Ir``) first.
    """
    names: dict[str, str] = {}
    events = ["Ir"]
    totals: list[int] | None = None
    inside = 0
    callee = ""
    cost_follows = False
    with path.open() as lines:
        for line in lines:
            if cost_follows:
                cost_follows = False
                if callee == collector:
                    inside += int(line.split()[1])
            elif line.startswith("calls="):
                cost_follows = True
            elif line.startswith(("fn=", "cfn=")):
                name = line.split("=", 1)[1].strip()
                named = _NAMED.match(name)
                if named is not None:
                    key, full = named.groups()
                    if full is not None:
                        names[key] = full
                    name = names[key]
                if line.startswith("cfn="):
                    callee = name
            elif line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("totals:"):
                totals = [int(value) for value in line.split()[1:]]
    if totals is None:
        raise ValueError(f"{path}: no totals line")
    if events[0] != "Ir" or len(totals) > len(events):
        raise ValueError(f"{path}: totals {totals} for events {events}")
    # callgrind may leave trailing zero costs off a line
    by_event = dict(zip(events, totals + [0] * (len(events) - len(totals)), strict=True))
    return Part(by_event["Ir"], inside, sum(by_event.get(name, 0) for name in L1_MISSES))


def parts_of(directory: Path, stem: str) -> list[Part]:
    """The numbered parts ``stem.1``, ``stem.2``... in order (not the last, unnumbered one,
    which is what ran after the last mark)."""
    numbered = [p for p in directory.glob(f"{stem}.*") if p.suffix[1:].isdigit()]
    return [read_part(p) for p in sorted(numbered, key=lambda p: int(p.suffix[1:]))]


def windows(
    parts: list[Part], marks: list[list[int]], count: int, size: int
) -> dict[str, list[dict[str, Any]]]:
    """The parks' and the wakes' windows of one process.

    ``marks`` are the collections per generation at each mark: after the lead of parks,
    after each of ``count`` windows of parks, after the lead of wakes and after each
    window of wakes. Part ``k`` ends at mark ``k`` (part 0 is the start, the imports, the
    warm-up and the lead of parks; part ``count + 1`` the lead of wakes).
    """
    if len(marks) != 2 * count + 2 or len(parts) != len(marks):
        raise ValueError(f"{len(parts)} parts and {len(marks)} marks for {count} windows")

    def window(k: int) -> dict[str, Any]:
        return {
            "size": size,
            "instructions": parts[k].instructions,
            "collector": parts[k].collector,
            "misses": parts[k].misses,
            "collections": [b - a for a, b in zip(marks[k - 1], marks[k], strict=True)],
        }

    return {
        "park": [window(k) for k in range(1, count + 1)],
        "wake": [window(k) for k in range(count + 2, 2 * count + 2)],
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per operation over windows (of one or several processes): the mean (every window's
    instructions over every window's operations), the median and range of the windows, the
    collector's share in the mean, the rest's median and range, and the collections of
    each generation in each window; and the first-level cache misses' mean, when counted."""
    ops = sum(w["size"] for w in rows)
    each = [w["instructions"] / w["size"] for w in rows]
    rest = [(w["instructions"] - w["collector"]) / w["size"] for w in rows]
    return {
        "windows": len(rows),
        "mean": sum(w["instructions"] for w in rows) / ops,
        "median": statistics.median(each),
        "range": [min(each), max(each)],
        "collector": sum(w["collector"] for w in rows) / ops,
        "misses": sum(w.get("misses", 0) for w in rows) / ops,
        "outside_median": statistics.median(rest),
        "outside_range": [min(rest), max(rest)],
        "collections": [w["collections"] for w in rows],
    }
