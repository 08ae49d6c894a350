"""Issue 33, the hosts side: a case per class (tests/hosts_hostile.py), each answered clearly.

- a host's record that names another's process (a `sleep 300`, with or without Ray's argv, the
  token, a legacy shape) or another's container (a name, an option, a short id): refused, the
  sleep alive, no docker command run with it;
- a record that is a FIFO, a directory, /dev/zero, not UTF-8, nested, mistyped or huge: an error
  naming the file, never a hang or a traceback;
- an inventory option or ssh config directive that runs a command or forwards; docker_args and
  volumes that shift the image or an option: refused naming the field, nothing run;
- IPv6 hosts and bastions, and the allowed options, arguments and volumes: accepted.
benchmarks/hostile_hosts.py prints the same table with counts per class. The property tests hold the
node agent's record reader to the same with any bytes, deep nesting, odd digits and any value in
any field (SLIMEFORGE_FUZZ_EXAMPLES=N explores N random ones)."""

from __future__ import annotations

import collections
import json
import os
import tempfile

import hosts_hostile as hh
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slimeforge.scripts import hostrecord


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return hh.table(tmp_path_factory.mktemp("hosts-hostile"))


def test_every_case_is_answered_right(rows):
    wrong = [f"{kind} {case} ({klass}): {outcome}: {detail}" for kind, klass, case, outcome,
             detail in rows if outcome not in hh.GOOD]
    assert not wrong, "\n".join(wrong)


def test_bad_input_is_refused_and_good_input_accepted(rows):
    for kind, _, case, outcome, _ in rows:
        good = kind == "inventory" and next(c for c in hh.INVENTORY_CASES if c[0] == case)[3] is None
        assert outcome == ("accepted" if good else "refused"), (kind, case)


def test_a_refused_record_is_named_with_what_was_found(rows):
    for kind, _, case, outcome, detail in rows:
        if kind == "agent":
            assert outcome == "refused" and (f"{case}/ray.json" in detail or "is not the `ray "
                                                                             "start`" in detail), (case, detail)


def test_every_class_has_cases(rows):
    classes = collections.Counter(klass for _, klass, *_ in rows)
    assert set(classes) == {"acts on another's process", "acts on another's container", "hang", "traceback",
                            "runs commands",
                            "image or option shift", "false refusal", "silent"}
    assert min(classes.values()) >= 2


# --- property tests: the node agent's record reader (scripts/hostrecord.py) ----------------------

_EXPLORE = int(os.environ.get("SLIMEFORGE_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_EXPLORE or 120, deadline=10_000, suppress_health_check=[HealthCheck.too_slow],
                derandomize=not _EXPLORE,
                database=None)
GOOD_RECORD = {"pid": 4242, "starttime": 7, "boot_id": "0f0e0d0c-0b0a-4908-8706-050403020100", "argv": ["/v/bin/ray",
                                                                                                        "start",
                                                                                                            "--block"],
               "token": "ab" * 16, "cluster": "lab", "started_at": 1.5}
# Odd digits (Unicode digits int() takes: ² ٣ ５), deep nesting, every JSON type in every field.
ODD = st.sampled_from(["²", "٣", "５", "4242\n", " 4242", "4_242", "0x10", "1e3", "NaN", "Infinity", "-0", "true"])
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | ODD,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=3), max_leaves=20)


def _read(data: bytes):
    with tempfile.TemporaryDirectory(prefix="sf-hostrecord-") as tmp:
        with open(os.path.join(tmp, "ray.json"), "wb") as f:
            f.write(data)
        try:
            return hostrecord.read_record(tmp)
        except hostrecord.BadRecord as exc:
            assert str(exc).startswith(os.path.join(tmp, "ray.json") + ":"), str(exc)
            return None


@FUZZ
@given(st.sampled_from(sorted(GOOD_RECORD)), JSON_VALUES)
def test_a_record_with_any_value_in_any_field_is_typed_or_refused(key, value):
    doc = _read(json.dumps({**GOOD_RECORD, key: value}).encode())
    if doc is not None:  # accepted only as a record the agent writes: a whole-number pid, a token...
        assert hostrecord.record_problem(doc) is None and type(doc["pid"]) is int and not isinstance(doc["pid"], bool)


@FUZZ
@given(st.binary(max_size=256)
       | st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n)
       | st.integers(1, 5000).map(lambda n: b'{"a":' * n))
def test_any_bytes_are_a_record_or_an_error_naming_the_file(data):
    doc = _read(data)
    assert doc is None or hostrecord.record_problem(doc) is None
