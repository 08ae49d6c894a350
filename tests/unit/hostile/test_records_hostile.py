"""Every record of a run directory (and the head record of its state directory) replaced in turn by
garbage, non-UTF-8, a FIFO, a directory, a symlink to /dev/zero and 10 MB: every `run.*` command
answers (a 5 s watchdog catches a hang) with a clear error, never a traceback, and acts on nothing
(no signal, no docker stop, no scancel, no Jobs API stop request, the run directory unchanged).
benchmarks/hostile_records.py prints the same table."""

from __future__ import annotations

import pytest
import records_hostile as rh
from helpers import free_port


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return rh.table(tmp_path_factory.mktemp("hostile-records"), free_port())


def test_the_table_covers_every_record_variant_and_command(rows):
    assert len(rows) == (len(rh.RAY_RECORDS) + len(rh.SLURM_RECORDS)) * len(rh.VARIANTS) * 5


def test_every_command_answers_clearly_and_acts_on_nothing(rows):
    bad = []
    for kind, name, variant, cmd, ans in rows:
        problems = []
        if ans.code is None:
            problems.append("no answer (hung)")
        elif ans.code == 0:
            problems.append("exit 0")
        if "TRACEBACK" in ans.text or "Traceback" in ans.text:
            problems.append("traceback")
        if ans.acted:
            problems.append(f"acted: {ans.acted}")
        # A bad record of the run directory is named in the answer (the head record is the state
        # directory's: the answer there is about the job the run recorded, or the head record).
        if not name.startswith("state/") and name not in ans.text:
            problems.append(f"does not name {name}")
        if problems:
            bad.append(f"{kind} {name} [{variant}] {cmd}: {problems}: {rh.summary(ans.text)}")
    assert not bad, "\n".join(bad)


def test_a_hostile_head_record_is_named_when_the_head_is_to_be_stopped(rows):
    for _kind, name, _variant, cmd, ans in rows:
        if name == "state/head.json" and cmd == "run.stop --head":
            assert ("refused: the head record is not one slimeforge wrote, so no process is "
                   "stopped") in ans.text, ans.text
            assert "head.json" in ans.text
