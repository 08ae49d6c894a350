"""Issue 42.9: exit codes by one rule (docs/exit-codes.md). A status or a dry run that finds what
would refuse the real command exits 2 after its whole report: cluster.status with a host that does
not answer, publish --dry-run of an image that is not here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from slimeforge.cluster.statustable import HostsDown, check_answered
from slimeforge.image.publish.publish import PublishError, PublishOptions, local_image, plan

ROOT = Path(__file__).resolve().parents[2]
ID = "sha256:" + "cd" * 32


def rows(*answered: bool) -> list[dict]:
    return [{"host": f"h{i}", "answered": a,
             **({} if a else {"error": "ssh: connect to host 10.0.0.9 port 22: Connection refused"})}
            for i, a in enumerate(answered, 1)]


def test_cluster_status_fails_when_a_host_does_not_answer():
    check_answered("lab.yaml", rows(True, True))  # every host answered: 0
    with pytest.raises(HostsDown) as exc:
        check_answered("lab.yaml", rows(True, False, False))
    assert exc.value.exit_code == 2 and exc.value.hosts == ["h2", "h3"]
    assert "cluster lab.yaml: 2 of 3 host(s) do not answer (h2, h3)" in str(exc.value) and "ssh" in str(exc.value)


def test_cluster_status_of_an_unreachable_cluster_prints_every_row_then_exits_2(tmp_path):
    inventory = tmp_path / "lab.yaml"
    inventory.write_text("name: gone\nmode: host\nprefix: /opt/slimeforge\nssh: {user: root, connect_timeout: 2, "
                         "port: 1}\n"
                         "hosts:\n  - {name: a, address: 127.0.0.1, role: head, gpus: 1}\n")
    r = subprocess.run([sys.executable, "-m", "invoke", "cluster.status", str(inventory)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Connection refused" in r.stdout  # the table first, with ssh's words
    assert "1 of 1 host(s) do not answer (a)" in r.stderr and "Traceback" not in r.stderr


class Engine:
    """The Docker SDK's answer to inspect_image, as publish reads it."""

    def __init__(self, images: dict[str, str]):
        self.api = self
        self.images = images

    def inspect_image(self, ref: str) -> dict:
        if ref not in self.images:
            raise ImageNotFound(f"No such image: {ref}")
        return {"Id": self.images[ref]}


def test_publish_dry_run_checks_the_local_image_as_the_publish_does():
    p = plan(PublishOptions(image="slimerl/slime:latest", registry="reg.example.com:5000/team/slime"))
    with pytest.raises(PublishError) as exc:
        local_image(p, Engine({}))
    assert exc.value.exit_code == 2 and str(exc.value) == ("slimerl/slime:latest: no such local image; see `docker "
                                                          "images`")
    assert local_image(p, Engine({"slimerl/slime:latest": ID})) == ID


def test_the_rule_is_written_down():
    text = (ROOT / "docs" / "exit-codes.md").read_text()
    rule = re.search(r"## One rule\n(.+?)\n## ", text, re.S)
    assert rule, "docs/exit-codes.md states the rule in its own section"
    assert "cluster.status" in rule.group(1) and "publish --dry-run" in rule.group(1) and "doctor" in rule.group(1)
