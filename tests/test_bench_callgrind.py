"""benchmarks/peers/_callgrind.py: how park_rate.py --callgrind reads its windows.

The figures that decide issue 41's 0.9 come from these sums, so they are held to a file
written by hand in callgrind's format (names compressed, as callgrind writes them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SOURCE = Path(__file__).resolve().parent.parent / "benchmarks" / "peers" / "_callgrind.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_callgrind", SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_callgrind"] = module  # dataclasses looks the module up by name
    spec.loader.exec_module(module)
    return module


cg = _load()

# Two callers of the collector, the second naming it by its id only; a call to another
# function in between, whose cost must not be taken; the totals line.
PART = """\
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
fl=(1) gcmodule.c
fn=(1) gc_collect_with_callback
10 5
cfn=(2) gc_collect_main
calls=1 20
10 1000
fn=(3) _PyObject_GC_Link
cfi=(1)
cfn=(4) visit_reachable
calls=3 40
+2 777
cfn=(2)
calls=2 20
* 2500
totals: 9000
summary: 9000
"""


def test_read_part_sums_every_call_to_the_collector(tmp_path: Path) -> None:
    path = tmp_path / "part.1"
    path.write_text(PART)
    assert cg.read_part(path) == cg.Part(instructions=9000, collector=3500)


def test_parts_are_taken_in_numeric_order_without_the_last(tmp_path: Path) -> None:
    for k, total in ((1, 7), (2, 8), (10, 9)):
        (tmp_path / f"part.{k}").write_text(f"events: Ir\ntotals: {total}\n")
    (tmp_path / "part").write_text("events: Ir\ntotals: 1\n")
    assert [p.instructions for p in cg.parts_of(tmp_path, "part")] == [7, 8, 9]


def test_windows_take_the_parts_between_the_leads() -> None:
    # Two windows: marks after the parks' lead, 2 windows, the wakes' lead, 2 windows.
    marks = [[10, 1, 0], [14, 1, 1], [20, 2, 1], [20, 2, 1], [21, 2, 1], [21, 2, 2]]
    parts = [cg.Part(100 * k, k) for k in range(1, 7)]
    got = cg.windows(parts, marks, 2, 50)
    assert [w["instructions"] for w in got["park"]] == [200, 300]
    assert [w["collections"] for w in got["park"]] == [[4, 0, 1], [6, 1, 0]]
    assert [w["instructions"] for w in got["wake"]] == [500, 600]
    assert [w["collector"] for w in got["wake"]] == [5, 6]
    assert [w["collections"] for w in got["wake"]] == [[1, 0, 0], [0, 0, 1]]
    with pytest.raises(ValueError):
        cg.windows(parts[:-1], marks, 2, 50)


def test_summary_weighs_every_operation_alike() -> None:
    rows = [
        {"size": 100, "instructions": 1000, "collector": 0, "collections": [1, 0, 0]},
        {"size": 100, "instructions": 4000, "collector": 3000, "collections": [1, 0, 1]},
        {"size": 200, "instructions": 2400, "collector": 400, "collections": [2, 0, 0]},
    ]
    got = cg.summary(rows)
    assert got["mean"] == 7400 / 400
    assert got["median"] == 12
    assert got["range"] == [10, 40]
    assert got["collector"] == 3400 / 400
    assert got["outside_median"] == 10
    assert got["outside_range"] == [10, 10]


# benchmarks/instructions.py reads callgrind's closing lines, with --cache-sim or without.
_INSTRUCTIONS = SOURCE.parent.parent / "instructions.py"


def _read_totals(stderr: str) -> dict[str, int] | None:
    sys.path.insert(0, str(_INSTRUCTIONS.parent))  # it imports _common, _mock, overhead
    try:
        spec = importlib.util.spec_from_file_location("instructions", _INSTRUCTIONS)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(_INSTRUCTIONS.parent))
    totals: dict[str, int] | None = module.read_totals(stderr)
    return totals


def test_instructions_reads_every_event_callgrind_collected() -> None:
    stderr = (
        "==62== \n==62== Events    : Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
        "==62== Collected : 39110076 10530672 5778009 309459 527387 98420 11422 21555 36998\n"
        "==62== \n==62== I   refs:      39,110,076\n"
    )
    assert _read_totals(stderr) == {
        "Ir": 39110076, "Dr": 10530672, "Dw": 5778009, "I1mr": 309459, "D1mr": 527387,
        "D1mw": 98420, "ILmr": 11422, "DLmr": 21555, "DLmw": 36998,
    }  # fmt: skip
    plain = "==7== Events    : Ir\n==7== Collected : 1517036217\n"
    assert _read_totals(plain) == {"Ir": 1517036217}
    # A process that died before its summary, or a line cut short, is no count at all.
    assert _read_totals("==7== Events    : Ir Dr\n") is None
    assert _read_totals("==7== Events    : Ir Dr\n==7== Collected : 12\n") is None


# The same part counted with --cache-sim=yes: every cost line carries the cache events too
# (callgrind may leave a line's trailing zeros off), Ir first.
PART_CACHE = """\
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
fl=(1) gcmodule.c
fn=(1) gc_collect_with_callback
10 5 1 1 1
cfn=(2) gc_collect_main
calls=1 20
10 1000 300 200 40 30 7
totals: 9000 2500 1200 310 270 60 3 2 1
summary: 9000 2500 1200 310 270 60 3 2 1
"""


def test_read_part_sums_the_first_level_misses_when_the_caches_were_simulated(
    tmp_path: Path,
) -> None:
    path = tmp_path / "part.1"
    path.write_text(PART_CACHE)
    assert cg.read_part(path) == cg.Part(instructions=9000, collector=1000, misses=640)
    plain = tmp_path / "part.2"
    plain.write_text(PART)
    assert cg.read_part(plain).misses == 0  # not simulated: none counted, not a guess
    short = tmp_path / "part.3"
    short.write_text(
        PART_CACHE.replace("totals: 9000 2500 1200 310 270 60 3 2 1", "totals: 9000 5")
    )
    assert cg.read_part(short) == cg.Part(instructions=9000, collector=1000, misses=0)
    bad = tmp_path / "part.4"
    bad.write_text(PART_CACHE.replace("totals: 9000", "totals: 9000 1 2 3 4 5 6 7 8 9"))
    with pytest.raises(ValueError, match="totals"):
        cg.read_part(bad)


def test_windows_and_summary_carry_the_misses() -> None:
    parts = [cg.Part(10, 0, 0), cg.Part(2000, 500, 300), cg.Part(10, 0, 0), cg.Part(1800, 0, 100)]
    marks = [[1, 0, 0], [3, 0, 0], [3, 0, 0], [4, 0, 0]]
    split = cg.windows(parts, marks, 1, 10)
    assert split["park"][0]["misses"] == 300 and split["wake"][0]["misses"] == 100
    assert cg.summary(split["park"])["misses"] == 30.0
