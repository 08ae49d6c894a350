"""Issue 33's corpus (tests/reader_hostile.py): every file read through the one reader and every
value by its grammar. Each case is refused clearly naming what it expects, or (a good neighbour)
accepted, or passes its own check of the outcome (a hint, the user's files kept); never a hang,
a traceback, a silent acceptance, lost files or advice from a file's contents."""

from __future__ import annotations

import pytest
import reader_hostile as rh


@pytest.mark.parametrize("case", rh.CASES, ids=[c.name for c in rh.CASES])
def test_every_hostile_file_and_value_is_answered_right(tmp_path, case):
    outcome, detail = rh.judge(case, tmp_path)
    assert outcome in rh.RIGHT, f"{case.name} ({case.kind}): {outcome}: {detail}"
    if outcome == "refused":
        assert len(max(detail.splitlines(), key=len)) < 300, detail  # values shown cut short


def test_the_corpus_has_a_case_of_every_class_and_good_neighbours():
    kinds = {c.kind for c in rh.CASES}
    assert kinds == {"hang", "traceback", "silent", "data loss", "wrong hint", "good"}
    assert len({c.name for c in rh.CASES}) == len(rh.CASES)
