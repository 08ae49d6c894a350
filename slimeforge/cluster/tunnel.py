"""The Jobs API through an ssh tunnel, for a head whose dashboard this machine cannot reach
directly (a security group that opens only ssh, a bastion in front of the cluster).

    ssh -N -L 127.0.0.1:LOCAL:HEAD_IP:DASHBOARD_PORT -- HEAD

built by cluster/ssh.py's one argv builder, so it goes the way every other ssh of the inventory
goes (its ssh config, user, key, port, `-J` bastion, ProxyCommand), on a connection of its own
(never a ControlMaster's: the forward must end with our process). It is a child process we start
and own (its pid), ready once its local port accepts a connection, and stopped by that pid when
the `with` block ends (or at exit): after the submission and the log following, which use it.

`jobs_api(...)` decides: ssh.tunnel (inventory) or --tunnel (command line) is `always`, `never`
or `auto` (the default): tunnel when a TCP connect to the dashboard fails within REACH_TIMEOUT_S.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import SlimeforgeError
from ..proc import Runner
from .inventory import Inventory
from .ssh import SSH

MODES = ("auto", "always", "never")
REACH_TIMEOUT_S = 3.0  # a dashboard on the same network answers in milliseconds; a dropped SYN never does
READY_EXTRA_S = 15.0  # beyond ssh's ConnectTimeout: key exchange, login, a bastion hop
PORT_TRIES = 3  # a local port picked free may be taken before ssh binds it


class TunnelError(SlimeforgeError):
    pass


def reachable(host: str, port: int, timeout: float = REACH_TIMEOUT_S) -> bool:
    """Whether a TCP connection to host:port opens within `timeout` seconds."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def free_local_port() -> int:
    """A loopback port nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def forward_spec(local_port: int, remote_host: str, remote_port: int) -> str:
    """`-L`'s argument; an IPv6 destination in brackets, as ssh reads it."""
    host = f"[{remote_host}]" if ":" in remote_host else remote_host
    return f"127.0.0.1:{local_port}:{host}:{remote_port}"


def tunnel_argv(ssh: SSH, local_port: int, remote_host: str, remote_port: int) -> list[str]:
    """The exact argv of the tunnel through `ssh`'s host to remote_host:remote_port."""
    return [
        *ssh.base_argv(multiplex=False),
        # No remote command and no shell: the connection only carries the forward.
        "-N",
        # A forward that cannot be set up (the local port taken meanwhile) ends ssh with an
        # error, instead of a connection that forwards nothing while we wait for it.
        "-o", "ExitOnForwardFailure=yes",
        # Bound to loopback only: the dashboard has no authentication, and nobody on this
        # machine's networks may reach the cluster through our tunnel.
        "-L", forward_spec(local_port, remote_host, remote_port),
        # `--` ends ssh's options, so an address can never be read as one.
        "--", ssh.target.address,
    ]  # fmt: skip


@dataclass
class Tunnel:
    """A local port forwarded to remote_host:remote_port through `ssh`'s host; a context manager."""

    ssh: SSH
    remote_host: str
    remote_port: int
    ready_timeout: float = 30.0
    local_port: int | None = None
    proc: subprocess.Popen | None = None
    _log: Path | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> Tunnel:
        last = ""
        for _ in range(PORT_TRIES):
            last = self._try(free_local_port())
            if not last:
                atexit.register(self.stop)  # a caller that never reaches stop() leaves no ssh behind
                return self
            if "already in use" not in last and "cannot listen" not in last.lower():
                break
        raise TunnelError(f"{self.ssh.name}: cannot tunnel to the Jobs API at {self.remote_host}:{self.remote_port} "
                          f"over ssh: {last}; "
                          "check that `ssh` reaches the head with the inventory's settings (`invoke cluster.status "
                          "INVENTORY`), "
                          "or open the dashboard port to this machine (docs/cluster.md#ports)")

    def _try(self, port: int) -> str:
        """Start ssh forwarding `port`; "" once ready, else why not (ssh stopped)."""
        self.local_port = port
        fd, log = tempfile.mkstemp(prefix="sf-tunnel-", suffix=".log")
        os.close(fd)
        self._log = Path(log)
        argv = tunnel_argv(self.ssh, port, self.remote_host, self.remote_port)
        # Its own session: a terminal's Ctrl-C reaches only us, and the tunnel still carries
        # the job's stop that submit() sends on Ctrl-C.
        self.proc = self.ssh.runner.start(argv, step=f"{self.ssh.name}: tunnel", log=log, new_session=True)
        if self.proc is None:  # a dry run
            return ""
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                why = self._log_text() or f"ssh exited with status {self.proc.returncode}"
                self.stop()
                return why
            if reachable("127.0.0.1", port, timeout=1.0):
                return ""
            time.sleep(0.1)
        self.stop()
        return f"no forward on 127.0.0.1:{port} after {self.ready_timeout:g}s"

    def _log_text(self) -> str:
        try:
            return " | ".join(line.strip() for line in (self._log.read_text(errors="replace") if self._log
                                                        else "").splitlines() if line.strip())[-500:]
        except OSError:
            return ""

    def stop(self) -> None:
        """End the ssh we started (by its pid: SIGTERM, then SIGKILL) and remove its log."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> Tunnel:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def dashboard_endpoint(url: str) -> tuple[str, int]:
    """(host, port) of http://HOST:PORT (IPv6 unbracketed)."""
    parts = urlsplit(url)
    if not parts.hostname or parts.port is None:
        raise TunnelError(f"the Jobs API address {url!r} is not http://HOST:PORT")
    return parts.hostname, parts.port


def jobs_api(inv: Inventory, dashboard: str, *, mode: str, dry_run: bool, stack: contextlib.ExitStack | None = None,
             runner: Runner | None = None, say=print) -> tuple[str, str | None]:
    """The address to reach the cluster's Jobs API at, and how (None: directly; else a note).
    A tunnel it starts lives as long as `stack` (else until this process exits)."""
    if mode not in MODES:
        raise TunnelError(f"--tunnel / ssh.tunnel: {mode!r} is not one of {', '.join(MODES)}")
    host, port = dashboard_endpoint(dashboard)
    head = inv.head
    if mode == "never":
        return dashboard, None
    why = "asked for (ssh.tunnel: always or --tunnel)" if mode == "always" else ""
    if not why:
        if dry_run or reachable(host, port):
            return dashboard, None  # a dry run starts nothing: it connects to nothing either
        why = f"{host}:{port} does not answer from here within {REACH_TIMEOUT_S:g}s"
    via = f"the Jobs API through an ssh tunnel to {head.name} ({why})"
    if dry_run:
        return dashboard, via
    ssh = SSH(head.ssh, inv.ssh_options, runner)
    tunnel = Tunnel(ssh, host, port, ready_timeout=inv.ssh_options.connect_timeout + READY_EXTRA_S).start()
    if stack is not None:
        stack.callback(tunnel.stop)
    say(f"[slimeforge] cluster {inv.name}: {via}: {tunnel.address} -> {host}:{port} (ssh pid {tunnel.pid})")
    return tunnel.address, via
