"""Small helpers shared by test modules (a module of its own: several conftest.py files exist)."""

import os
import random
import socket
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """The one reading of CI: `.ci/run` exports CI=true (as every CI service does), and every
    "fail instead of skipping in CI" guard asks here (the lab conftests read the same variable)."""
    return bool(os.environ.get("CI"))


def absent(why: str) -> NoReturn:
    """A component a test needs is missing: skip by name, but fail under CI, where .ci/run installs
    it (a green CI run with a tier silently skipped proves nothing)."""
    if in_ci():
        pytest.fail(f"CI must have this (.ci/run installs it): {why}")
    pytest.skip(why)


_HANDED_OUT: set[int] = set()  # free_port never gives one port twice in a process: a recipe's three ports must differ


def free_port() -> int:
    """A port free now, between Ray's worker ports (10002-19999 by default) and the kernel's
    ephemeral range (32768- here): a port the kernel hands out (bind to 0) can be taken a moment
    later by a Ray process of the same test binding its own ephemeral ports. Never one it gave
    before in this process: nothing listens on it yet, so a second draw could return it."""
    low = 32768
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    top = max(20001, min(low, 32768))
    for _ in range(200):
        port = random.randrange(20000, top)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket() as s:  # the range is full: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The seed's required SlimeRunner fields, valid as they are (recipe and rendering tests start here).
SEED_RECIPE = {
    "exp_id": "gsm8k-3b-smoke",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5",
    "s3_bucket": "my-rollouts",
    "model_dir": "/models/Qwen2.5-3B-Instruct",
    "data_path": "/data/gsm8k.jsonl",
    "model_type": "qwen2.5-3B",
}
