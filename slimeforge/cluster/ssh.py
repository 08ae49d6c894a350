"""Running argv lists on remote hosts through the OpenSSH client (`ssh`), one `SSH` per host.

Why the OpenSSH client and not a Python SSH library:
- It honours everything users already configured: `~/.ssh/config` (Host aliases, ProxyJump,
  IdentityFile, per-host User/Port, Match blocks), the ssh-agent, known_hosts, hardware keys.
  asyncssh reads only part of ssh_config and has no ControlMaster; paramiko reads less still.
- fabric 3 (paramiko underneath) requires invoke < 3, and slimeforge's CLI is invoke 3.
- ControlMaster/ControlPersist gives connection reuse for free: the first command to a host opens
  a master connection, every later one (probe, checks, install, ray start, status) rides on it.
- Every command goes through `slimeforge.proc.Runner`, so tests and `--dry-run` see exact argv lists.

`SSH.run` has the signature of `proc.Runner.run` (both are a `proc.CommandRunner`): code written
against one (the doctor's host checks, for one) runs unchanged on a remote host when handed an `SSH`.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CommandError, SlimeforgeError
from ..proc import CommandRunner, Result, Runner

# ssh exits 255 when ssh itself failed (resolve, connect, authenticate, host key); a remote
# command's own exit status is passed through unchanged.
SSH_FAILED = 255


class HostUnreachable(CommandError):
    """ssh could not reach or log in to the host (ssh's own exit status 255)."""


@dataclass(frozen=True)
class SSHTarget:
    """Where to log in. `address` is an IP, a DNS name or a Host alias from the ssh config;
    user/port/key left as None defer to the ssh config (and its defaults), as a user expects."""

    name: str
    address: str
    user: str | None = None
    port: int | None = None
    key: str | None = None


@dataclass(frozen=True)
class SSHOptions:
    config_file: str | None = None
    connect_timeout: int = 10
    alive_interval: int = 5
    alive_count_max: int = 3
    control_persist: int = 60
    control_dir: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)  # the allow list of sshconfig.OPTIONS (none runs a command)
    proxy_jump: str | None = None  # -J: a bastion
    proxy_command: str | None = None  # ProxyCommand: the inventory's explicit command proxy (e.g. AWS SSM)
    tunnel: str = "auto"  # the Jobs API over ssh: auto, always, never (tunnel.py; no option of ssh's own)


def default_control_dir() -> str:
    # SHORT on purpose: a Unix socket path is limited to 108 bytes and ssh's %C token alone is 40.
    return f"/tmp/sf-ssh-{os.getuid()}"


def ensure_control_dir(path: str) -> Path:
    """Create the private directory for ControlMaster sockets (mode 0700, ours)."""
    d = Path(path)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        # Someone else's socket directory could hand us their master connection (or steal ours).
        raise SlimeforgeError(f"{d}: the ssh control socket directory must be owned by you with mode 0700")
    return d


class SSH:
    """Runs commands on one host. Remote argv lists are quoted with shlex.join, because ssh
    sends a single string that the remote login shell parses again."""

    def __init__(self, target: SSHTarget, options: SSHOptions | None = None, runner: Runner | None = None):
        self.target = target
        self.options = options or SSHOptions()
        self.runner = runner or Runner()
        self._control_dir = self.options.control_dir or default_control_dir()
        self._control_dir_ready = False

    @property
    def name(self) -> str:
        return self.target.name

    def base_argv(self, *, multiplex: bool = True) -> list[str]:
        """`ssh` and its options, without destination and command. multiplex=False: a connection
        of its own, never a ControlMaster's (a tunnel: its forward must end when its process does)."""
        o = self.options
        argv = ["ssh"]
        if o.config_file:
            # An ssh config made for this cluster, in place of ~/.ssh/config (ssh reads one or the other).
            argv += ["-F", o.config_file]
        argv += [
            # No tty: output comes back byte for byte (no \r), and nothing waits for a terminal.
            "-T",
            # Never prompt: with many hosts in parallel a password or passphrase prompt would hang
            # unseen. Keys come from the agent, the ssh config or `key:` in the inventory.
            "-o", "BatchMode=yes",
            # An unreachable host fails in seconds instead of the TCP default (minutes).
            "-o", f"ConnectTimeout={o.connect_timeout}",
            # A host that dies or drops off the network mid-command is noticed within
            # interval * count seconds instead of hanging until TCP gives up (hours).
            "-o", f"ServerAliveInterval={o.alive_interval}",
            "-o", f"ServerAliveCountMax={o.alive_count_max}",
        ]
        if multiplex:
            argv += [
                # Reuse one connection per host for the dozen commands a bring-up sends: the first
                # command opens a master, the others skip the TCP and key exchange handshakes.
                "-o", "ControlMaster=auto",
                # %C is a hash of (local host, remote host, port, user): short and unique per login.
                "-o", f"ControlPath={self._control_dir}/%C",
                # Keep the master for a while after the last command, so `cluster.status` right
                # after `cluster.up` is quick too; it exits by itself afterwards.
                "-o", f"ControlPersist={o.control_persist}",
            ]
        else:
            argv += [
                # Neither use a master nor become one: a forward asked of a master would live on in
                # the master after our process ends, and a master would keep our process alive.
                "-o", "ControlMaster=no",
                "-o", "ControlPath=none",
            ]
        # No "Warning: Permanently added ..." banners mixed into captured output.
        argv += ["-o", "LogLevel=ERROR"]
        for key, value in o.extra.items():
            # The inventory's ssh.options, for what ssh_config cannot say per cluster (none that runs a command).
            argv += ["-o", f"{key}={value}"]
        if o.proxy_jump:
            argv += ["-J", o.proxy_jump]
        if o.proxy_command:
            # Runs on this machine for every connection: only from ssh.proxy_command, which the user wrote as such.
            argv += ["-o", f"ProxyCommand={o.proxy_command}"]
        t = self.target
        if t.port is not None:
            argv += ["-p", str(t.port)]
        if t.user is not None:
            argv += ["-l", t.user]
        if t.key is not None:
            # Added to (not replacing) the agent's keys and the config's IdentityFile.
            argv += ["-i", os.path.expanduser(t.key)]
        return argv

    def command(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """The local argv that runs `argv` on the host (env via `env K=V`, not sent by ssh)."""
        remote = [str(a) for a in argv]
        if env:
            remote = ["env", *(f"{k}={v}" for k, v in env.items()), *remote]
        # `--` ends ssh's options, so an address can never be read as one.
        return [*self.base_argv(), "--", self.target.address, shlex.join(remote)]

    def run(
        self,
        argv: Sequence[str],
        *,
        step: str = "",
        check: bool = True,
        capture: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        """Run `argv` on the host; raises HostUnreachable when ssh itself failed, CommandError
        when the remote command failed (with check=True)."""
        if cwd is not None:
            argv = ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", cwd, *argv]
        local = self.command(argv, env)
        step = f"{self.target.name}: {step or argv[0]}"
        if not self.runner.dry_run and not self._control_dir_ready:
            ensure_control_dir(self._control_dir)
            self._control_dir_ready = True
        # An empty stdin, not ours: ssh forwards stdin, and with parallel hosts a terminal's
        # input must never go to one of them.
        result = self.runner.run(local, step=step, check=False, capture=capture,
                                 input=input if input is not None else "", timeout=timeout)
        if result.returncode == SSH_FAILED:
            raise HostUnreachable(step, local, SSH_FAILED,
                                  (result.stderr or result.stdout).strip() or "ssh failed (exit 255)")
        if check and result.returncode != 0:
            raise CommandError(step, local, result.returncode, result.stdout + result.stderr)
        return result

    def close(self) -> None:
        """Ask the master connection (if any) to exit now rather than after ControlPersist."""
        if self.runner.dry_run:
            return
        if not Path(self._control_dir).is_dir():
            return
        argv = [*self.base_argv(), "-O", "exit", "--", self.target.address]
        self.runner.run(argv, step=f"{self.target.name}: close", check=False, input="", timeout=10)


if TYPE_CHECKING:  # mypy holds both runners to the one signature: a change to either that breaks it fails here
    _LOCAL: type[CommandRunner] = Runner
    _REMOTE: type[CommandRunner] = SSH
