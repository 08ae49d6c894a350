"""cluster.down on the real netns lab leaves alone what slimeforge did not start (issue 33): a
recorded `sleep 300` that is not Ray, and a container it did not label for this cluster (a
throwaway one from the local test base image, named like the registry people run beside it).
Each refusal is a row of down's table; the processes, the container and the records are left."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from cluster_helpers import inventory_data, write_inventory

from slimeforge.cluster import raycluster as cluster
from slimeforge.cluster.bringup import ClusterError
from slimeforge.proc import pid_alive

pytestmark = [pytest.mark.ssh, pytest.mark.docker]
TOKEN = "7e" * 16


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def test_down_refuses_a_recorded_sleep_and_an_unlabelled_container(lab, tmp_path, base_image):
    name = f"{lab.tag}-refuse"
    inv = write_inventory(tmp_path / "lab.yaml", inventory_data(lab, name))
    state = lab.workdir / "state" / name
    sleeper = subprocess.Popen(["sleep", "300"])
    container = f"registry-sf-{os.getpid()}"
    cid = subprocess.run(["docker", "run", "--detach", "--name", container, base_image, "sleep", "300"],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        # h1: the sleep's own pid, start time and boot id, recorded as if it were our `ray start`.
        h1 = {"pid": sleeper.pid, "starttime": _start_time(sleeper.pid), "boot_id": boot, "argv": ["/opt/sf/bin/ray",
                                                                                                   "start", "--block"],
              "token": TOKEN, "cluster": name, "started_at": 1.0}
        # h2: the container's full id, recorded as if cluster.up had started it.
        h2 = {"container": cid, "argv": ["docker", "run"], "token": TOKEN, "cluster": name, "started_at": 1.0}
        for host, rec in (("h1", h1), ("h2", h2)):
            (state / host).mkdir(parents=True)
            (state / host / "ray.json").write_text(json.dumps(rec))

        with pytest.raises(ClusterError) as err:
            cluster.down(inv, control_dir=lab.control_dir, stream=io.StringIO(), timeout=5)

        table = err.value.table.text()
        row = {line.split()[0]: line for line in table.splitlines()[1:]}
        assert "FAILED" in row["h1"] and (f"refused: pid {sleeper.pid} is not the `ray start` slimeforge "
                                         "recorded") in row["h1"]
        assert "FAILED" in row["h2"] and f"refused: container {cid[:12]} (/{container}) carries labels" in row["h2"]
        assert "ok" in row["h3"] and "nothing recorded" in row["h3"]
        assert "refused on 2 host(s)" in str(err.value) and "left alone" in str(err.value)
        assert sleeper.poll() is None and pid_alive(sleeper.pid)
        running = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", cid], capture_output=True, text=True)
        assert running.stdout.strip() == "true"
        assert (state / "h1" / "ray.json").exists() and (state / "h2" / "ray.json").exists()  # the evidence is kept
    finally:
        sleeper.kill()
        sleeper.wait()
        subprocess.run(["docker", "rm", "-f", "--", cid], capture_output=True)
