"""slimeforge/scripts/compile_queue.py's pure rules: which calls are compiles (and of what object), and
the committed cost table read by the queue's own grammar."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "slimeforge" / "scripts"
sys.path.insert(0, str(SCRIPTS))
from compile_queue import KEY_RE, compiled_object, load_costs  # noqa: E402


@pytest.mark.parametrize("args,obj", [
    (["-MMD", "-MF", "x.o.d", "-O3", "-c", "/s/x.cpp", "-o", "/b/x.o", "-std=c++17"], "/b/x.o"),  # torch's compile rule
    (["-MD", "-MF", "k.o.d", "-c", "-c", "/s/k.cu", "-o", "/b/k.o", "-gencode=arch=compute_90,code=sm_90"], "/b/k.o"),
    (["-shared", "a.o", "b.o", "-o", "x.so"], None),  # a link
    (["-v"], None), (["-dumpfullversion", "-dumpversion"], None),  # torch's compiler checks
    (["-c", "x.cpp"], None), (["-c", "x.cpp", "-o"], None),
])
def test_what_is_a_compile(args, obj):
    assert compiled_object(args) == obj


def test_the_committed_table_reads_back():
    costs = load_costs(str(SCRIPTS / "compile_costs.json"))
    assert len(costs) == 65 and all(KEY_RE.fullmatch(k) and k.endswith(".o") for k in costs)
    # the measured long poles: apex's softmax kernels first
    assert max(costs, key=costs.__getitem__) == "scaled_upper_triang_masked_softmax_cuda.o"


def test_a_forwarded_request_is_an_agent_sign_request_and_read_back_by_its_fields():
    # BuildKit's docker client reads what a container sends as SSH agent requests: the queue's request
    # line rides as a sign request's data, with a well-formed key the client parses.
    from compile_queue import NO_KEY, SIGN_REQUEST, frame, sign_request_line

    msg = frame(SIGN_REQUEST, NO_KEY, b"nvcc softmax_cuda.o", tail=bytes(4))
    assert int.from_bytes(msg[:4], "big") == len(msg) - 4 and msg[4] == SIGN_REQUEST
    assert sign_request_line(msg[4:]) == "nvcc softmax_cuda.o"
    assert sign_request_line(msg[4:-10]) is None  # a field runs past the message
    assert sign_request_line(frame(11)[4:]) is None  # another request (a key list)
    assert sign_request_line(b"") is None
