"""An inventory cannot smuggle a command: ssh.options is an allow list (sshconfig.OPTIONS, matched
case-insensitively), so every option that runs one (or loads code, or forwards) on this machine is
refused; a bastion is ssh.proxy_jump; a command proxy is the explicit ssh.proxy_command, which
`cluster.up --dry-run` shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slimeforge.cluster.inventory import load_inventory
from slimeforge.cluster.raycluster import plan
from slimeforge.cluster.sshconfig import INSTEAD, OPTIONS
from slimeforge.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def inventory(tmp_path: Path, ssh: dict) -> Path:
    data = {"mode": "host", "prefix": "/opt/sf", "ssh": ssh, "hosts": [{"name": "a", "address": "10.0.0.1",
                                                                        "role": "head", "gpus": 1}]}
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("key", ["ProxyCommand", "proxycommand", "PROXYCOMMAND", "LocalCommand", "PermitLocalCommand",
                                 "KnownHostsCommand",
                                 "Match", "Include", "RemoteCommand", "PKCS11Provider", "SecurityKeyProvider",
                                 "ProxyUseFdpass", "ProxyJump",
                                 "XAuthLocation", "ForwardAgent", "RemoteForward", "LocalForward", "DynamicForward",
                                 "SendEnv", "SetEnv",
                                 "Hostname", "ForwardX11", "Tunnel", "ControlPath", "StreamLocalBindUnlink"])
def test_options_off_the_allow_list_are_refused_listing_the_accepted(tmp_path, key):
    marker = tmp_path / "ran"
    with pytest.raises(ConfigError) as err:
        load_inventory(inventory(tmp_path, {"options": {key: f"touch {marker}"}}))
    (problem,) = [p for p in err.value.problems if p.where == f"ssh.options.{key}"]
    assert "is not an ssh option slimeforge passes from an inventory" in problem.message and problem.value == key
    assert "StrictHostKeyChecking" in problem.accepted and "UserKnownHostsFile" in problem.accepted
    if key.lower() in INSTEAD:
        assert INSTEAD[key.lower()] in problem.message
    assert not marker.exists()


def test_cluster_status_on_a_proxycommand_inventory_runs_nothing(tmp_path):
    """The issue's case: `invoke cluster.status INVENTORY` executed the inventory's ProxyCommand."""
    marker = tmp_path / "ran"
    path = inventory(tmp_path, {"options": {"ProxyCommand": f"touch {marker}"}})
    r = subprocess.run([sys.executable, "-m", "invoke", "cluster.status", str(path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "ssh.options.ProxyCommand" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()


def test_allowed_options_pass_in_any_case_and_values_are_held_to_their_grammar(tmp_path):
    options = {"StrictHostKeyChecking": "accept-new", "connectionattempts": "3", "ADDRESSFAMILY": "inet6"}
    inv = load_inventory(inventory(tmp_path, {"options": options}))
    assert dict(inv.ssh_options.extra) == options
    assert {"stricthostkeychecking", "userknownhostsfile", "identitiesonly"} <= set(OPTIONS)
    for key, value in (("UserKnownHostsFile", "a\nProxyCommand x"), ("StrictHostKeyChecking", "maybe"),
                       ("ConnectionAttempts", "0")):
        with pytest.raises(ConfigError, match=f"is not a value of {key}"):
            load_inventory(inventory(tmp_path, {"options": {key: value}}))


@pytest.mark.parametrize("jump,ok", [("bastion", "bastion"), ("ops@bastion.example:2222", "ops@bastion.example:2222"),
                                     ("a,b@c:22", "a,b@c:22"),
                                     ("[fd00::1]:2222", "[fd00::1]:2222"), ("fd00::1", "[fd00::1]"),
                                     ("ops@2001:db8::7", "ops@[2001:db8::7]"),
                                     ("10.0.0.1:22", "10.0.0.1:22"),
                                     ("-oProxyCommand=x", False), ("a b", False), ("a;touch x", False), ("", False),
                                     ("[fd00::zz]", False),
                                     ("[10.0.0.1]:22", False), ("h:99999", False), ("[fd00::1]x", False)])
def test_proxy_jump_grammar(tmp_path, jump, ok):
    path = inventory(tmp_path, {"proxy_jump": jump})
    if ok:
        inv = load_inventory(path)
        argv = inv.head.ssh and plan(inv, control_dir=str(tmp_path))
        assert f"-J {ok}" in "\n".join(argv)
    else:
        with pytest.raises(ConfigError, match="ssh.proxy_jump"):
            load_inventory(path)


def test_proxy_command_is_explicit_and_shown_by_the_dry_run(tmp_path):
    command = "aws ssm start-session --target %h --document-name AWS-StartSSHSession --parameters portNumber=%p"
    inv = load_inventory(inventory(tmp_path, {"proxy_command": command}))
    lines = plan(inv, control_dir=str(tmp_path))
    assert any("ssh.proxy_command" in line and "THIS machine" in line and command in line for line in lines)
    assert any(f"ProxyCommand={command}" in line for line in lines)  # the ssh argv of each host, as it will run
    with pytest.raises(ConfigError, match="ssh.proxy_command"):
        load_inventory(inventory(tmp_path, {"proxy_command": "x\ny"}))


@pytest.mark.parametrize("make", [lambda p: p.write_bytes(b"\xff\xfe"),
                                  lambda p: p.write_text('{"gcs": "x; rm -rf /", "dashboard": "http://h:1"}'),
                                  lambda p: __import__("os").mkfifo(p), lambda p: p.symlink_to("/dev/zero")])
def test_a_bad_cluster_state_record_is_an_error_naming_the_file(tmp_path, monkeypatch, make):
    from slimeforge.cluster.clusterrecord import address, state_file

    monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(tmp_path / "state"))
    inv = load_inventory(inventory(tmp_path, {}))
    path = state_file(inv)
    path.parent.mkdir(parents=True)
    make(path)
    with pytest.raises(ConfigError) as err:
        address(inv)
    assert str(err.value).startswith(str(path)) and "cluster state" in str(err.value)
