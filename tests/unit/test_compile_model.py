"""benchmarks/compile_model.py: the cores shared by nice weight, a scheme's grammar, and a small set
run through the model whose answer is worked out by hand (to 0.25 s: the model steps 0.05 s, and
each finished job hands its core on at the next step)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from compile_model import calibrate, parse_scheme, shares, simulate  # noqa: E402

# apex with two extensions (in setup.py's order amp_C, then syncbn) and TE with one file.
SHAPES = {"apex": {"ext": {"amp_C": ["a.o"], "syncbn": ["s.o"]}, "cu": {"a.o"}},
          "te": {"ext": {"temp": ["t.o"]}}}
COST = {"apex/setup": 1.0, "apex/amp_C/a.o": 4.0, "apex/syncbn/s.o": 2.0, "apex/tail": 0.5,
        "te/setup": 1.0, "te/temp/t.o": 2.0, "te/tail": 0.5, "tms/all": 0.0}


def test_shares_by_weight_at_most_one_core_each() -> None:
    assert shares([1024, 1024, 1024], 2) == pytest.approx([2 / 3] * 3)
    assert shares([1024, 110], 4) == [1.0, 1.0]
    # nice 10 against nice 0 on one core: about a tenth
    assert shares([1024, 1024 / 1.25**10], 1)[1] == pytest.approx(0.097, abs=0.002)


def test_apex_alone_threads_and_files() -> None:
    # Two threads on two cores: setup 1 s, both files at once (s.o ends at 3), a.o ends at 5, tail 0.5.
    assert simulate(COST, SHAPES, ("alone", 2, 1), 2)["apex"] == pytest.approx(5.5, abs=0.25)
    # One thread: amp_C first (1 -> 5), then syncbn (5 -> 7), then the tail.
    assert simulate(COST, SHAPES, ("alone", 1, 1), 2)["apex"] == pytest.approx(7.5, abs=0.25)


def test_the_costliest_file_first_under_one_bound() -> None:
    # One file at a time on two cores, the costliest first: a.o 1 -> 5, then s.o (equal to t.o, and
    # first in the queues) 5 -> 7 and apex's tail; t.o 7 -> 9 and TE's tail.
    ends = simulate(COST, SHAPES, ("longest", 1), 2)
    assert ends["apex"] == pytest.approx(7.5, abs=0.25)
    assert ends["te"] == pytest.approx(9.5, abs=0.25)
    assert ends["wall"] == pytest.approx(9.5, abs=0.25)


def test_scheme_grammar() -> None:
    assert parse_scheme("fixed:8:4:6:0") == ("fixed", 8, 4, 6, 0)
    assert parse_scheme("pool:32:10") == ("pool", 32, 10)
    assert parse_scheme("longest:20") == ("longest", 20)
    for bad in ("fixed:8:4:0:0", "pool:32:20", "pool:32", "alone:0:4", "longest:20\n", "x:1"):
        with pytest.raises(SystemExit, match="--scheme"):
            parse_scheme(bad)


def test_the_model_gives_back_the_measured_set() -> None:
    # Host A's `first` set (docs/build.md "Where apex's time goes"): 164.3 s measured, apex alone 150.4 s.
    result = json.loads((ROOT / "benchmarks" / "data" / "compile-h200-a.json").read_text())
    cost, shapes = calibrate(result, "first")
    assert simulate(cost, shapes, ("apexpool", 24, 16, 10), 16)["wall"] == pytest.approx(164.3, abs=2)
    assert simulate(cost, shapes, ("alone", 16, 4), 16)["apex"] == pytest.approx(150.4, abs=5)
    with pytest.raises(SystemExit, match="no such set"):
        calibrate(result, "parallel")
