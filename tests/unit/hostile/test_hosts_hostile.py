"""Issue 33, the hosts side: a case per class (tests/hosts_hostile.py), each answered clearly.

- a host's record that names another's process (a `sleep 300`, with or without Ray's argv, the
  token, a legacy shape) or another's container (a name, an option, a short id): refused, the
  sleep alive, no docker command run with it;
- a record that is a FIFO, a directory, /dev/zero, not UTF-8, nested, mistyped or huge: an error
  naming the file, never a hang or a traceback;
- an inventory option or ssh config directive that runs a command or forwards; docker_args and
  volumes that shift the image or an option: refused naming the field, nothing run;
- IPv6 hosts and bastions, and the allowed options, arguments and volumes: accepted.
benchmarks/hostile_hosts.py prints the same table with counts per class."""

from __future__ import annotations

import collections

import hosts_hostile as hh
import pytest


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return hh.table(tmp_path_factory.mktemp("hosts-hostile"))


def test_every_case_is_answered_right(rows):
    wrong = [f"{kind} {case} ({klass}): {outcome}: {detail}" for kind, klass, case, outcome, detail in rows if outcome not in hh.GOOD]
    assert not wrong, "\n".join(wrong)


def test_bad_input_is_refused_and_good_input_accepted(rows):
    for kind, _, case, outcome, _ in rows:
        good = kind == "inventory" and next(c for c in hh.INVENTORY_CASES if c[0] == case)[3] is None
        assert outcome == ("accepted" if good else "refused"), (kind, case)


def test_a_refused_record_is_named_with_what_was_found(rows):
    for kind, _, case, outcome, detail in rows:
        if kind == "agent":
            assert outcome == "refused" and (f"{case}/ray.json" in detail or "is not the `ray start`" in detail), (case, detail)


def test_every_class_has_cases(rows):
    classes = collections.Counter(klass for _, klass, *_ in rows)
    assert set(classes) == {"acts on another's process", "acts on another's container", "hang", "traceback", "runs commands",
                            "image or option shift", "false refusal", "silent"}
    assert min(classes.values()) >= 2
