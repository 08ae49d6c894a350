"""The SSH transport: exact argv lists, quoting for the remote shell, ssh's own failures."""

from __future__ import annotations

import shlex
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
from helpers import in_ci

from slimeforge.cluster.ssh import SSH, HostUnreachable, SSHOptions, SSHTarget
from slimeforge.errors import CommandError
from slimeforge.proc import Runner

needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None and not in_ci(),
                               reason="the OpenSSH client is not installed")


def test_command_argv_options_and_remote_quoting(tmp_path):
    ssh = SSH(SSHTarget("gpu-a", "10.0.0.11", user="ubuntu", port=2222, key="/keys/id"),
              SSHOptions(config_file="/etc/lab_config", control_dir=str(tmp_path / "cm")))
    tricky = ["python3", "-c", "print('it''s'); import os", "$(touch /tmp/x)", "a b", "`id`", "new\nline", ""]
    argv = ssh.command(tricky, env={"NCCL_SOCKET_IFNAME": "eth0", "X": "a b"})

    assert argv[:3] == ["ssh", "-F", "/etc/lab_config"]
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert opts == [
        "BatchMode=yes",
        "ConnectTimeout=10",
        "ServerAliveInterval=5",
        "ServerAliveCountMax=3",
        "ControlMaster=auto",
        f"ControlPath={tmp_path / 'cm'}/%C",
        "ControlPersist=60",
        "LogLevel=ERROR",
    ]
    assert (argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "ubuntu" and argv[argv.index("-i")
        + 1] == "/keys/id")
    # `--` then the address: an address can never be taken for an option.
    assert argv[-3:-1] == ["--", "10.0.0.11"]
    # ONE string for the remote shell, which splits it back into exactly our argv.
    assert shlex.split(argv[-1]) == ["env", "NCCL_SOCKET_IFNAME=eth0", "X=a b", *tricky]


def test_unset_settings_defer_to_the_ssh_config(tmp_path):
    argv = SSH(SSHTarget("b", "b-alias"), SSHOptions(control_dir=str(tmp_path))).command(["true"])
    assert "-F" not in argv and "-p" not in argv and "-l" not in argv and "-i" not in argv
    assert argv[-2:] == ["b-alias", "true"]


def test_extra_options_are_passed(tmp_path):
    argv = SSH(SSHTarget("b", "b"), SSHOptions(control_dir=str(tmp_path), extra={"StrictHostKeyChecking": "accept-new"},
                                               proxy_jump="ops@bastion:2222")).command(["true"])
    assert argv[argv.index("StrictHostKeyChecking=accept-new") - 1] == "-o"
    assert argv[argv.index("ops@bastion:2222") - 1] == "-J"
    assert not any(a.startswith("ProxyCommand") for a in argv)


def test_dry_run_records_and_creates_nothing(tmp_path):
    runner = Runner(dry_run=True)
    ssh = SSH(SSHTarget("a", "10.0.0.1"), SSHOptions(control_dir=str(tmp_path / "cm")), runner)
    result = ssh.run(["ray", "start", "--head"], step="ray")
    assert result.ok and runner.history == [ssh.command(["ray", "start", "--head"])]
    assert not (tmp_path / "cm").exists()


def test_cwd_is_applied_on_the_host(tmp_path):
    runner = Runner(dry_run=True)
    ssh = SSH(SSHTarget("a", "10.0.0.1"), SSHOptions(control_dir=str(tmp_path)), runner)
    ssh.run(["ls", "-l"], cwd="/opt/my dir")
    assert shlex.split(runner.history[-1][-1]) == ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", "/opt/my dir",
                                                   "ls", "-l"]


@needs_ssh
def test_unreachable_host_raises_host_unreachable_with_ssh_words(short_tmp):
    tmp_path = short_tmp  # ssh's control socket path must stay under 108 bytes whatever pytest's basetemp is
    with socket.socket() as s:  # a port with nothing listening: connection refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ssh = SSH(SSHTarget("nowhere", "127.0.0.1", port=port), SSHOptions(control_dir=str(tmp_path / "cm"),
                                                                       connect_timeout=5))
    with pytest.raises(HostUnreachable) as err:
        ssh.run(["true"], step="probe", timeout=60)
    assert err.value.returncode == 255
    assert err.value.step == "nowhere: probe"
    assert "Connection refused" in str(err.value) and str(port) in str(err.value)
    assert isinstance(err.value, CommandError)
    assert (tmp_path / "cm").stat().st_mode & 0o777 == 0o700


@pytest.fixture
def short_tmp():
    """A directory with a short path (pytest's tmp_path under xdist can pass the socket limit)."""
    path = Path(tempfile.mkdtemp(prefix="sf", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
