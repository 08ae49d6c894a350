"""benchmarks/real_stack.py reads the install's lines: each step's `done in`, each piece compiled
side by side (`compiled in`), and records the machine a figure came from (cores, load beside)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from real_stack import COMPILED, STEP_DONE, machine  # noqa: E402

OUT = """slimeforge: step 6/20 transformer-engine: compiled in 2488s
slimeforge: step 8/20 torch-memory-saver: compiled in 24s
slimeforge: step 6/20 transformer-engine: done in 2631s
slimeforge: step 7/20 apex: compiling 2/5 (40 %), 2401s so far
slimeforge: step 20/20 finalize: done in 51s
"""


def test_the_compiled_pieces_and_the_steps_are_read_apart():
    compiled = {m.group(1): int(m.group(2)) for m in COMPILED.finditer(OUT)}
    assert compiled == {"transformer-engine": 2488, "torch-memory-saver": 24}
    done = {m.group(1): int(m.group(2)) for m in STEP_DONE.finditer(OUT)}
    assert done == {"transformer-engine": 2631, "finalize": 51}


def test_the_machine_names_its_cores_and_the_load_beside():
    m = machine()
    assert m["cores"] and m["cores"] >= 1 and len(m["loadavg"]) == 3 and all(float(x) >= 0 for x in m["loadavg"])
