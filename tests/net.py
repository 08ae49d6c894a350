"""Small helpers shared by test modules (a module of its own: several conftest.py files exist)."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
