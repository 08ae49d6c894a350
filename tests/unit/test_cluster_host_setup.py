"""cluster.up's one seam, bringup.HostSetup: the environment phase asks the setup it is given for each
host's environment (no ssh here: the setup answers from data) and holds every host to the head's."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from slimeforge.cluster import bringup
from slimeforge.cluster.hosttable import HostTable
from slimeforge.cluster.inventory import Host, Inventory, load_inventory
from slimeforge.cluster.ssh import SSH

ROOT = Path(__file__).resolve().parents[2]


class Recorded(bringup.DefaultSetup):
    """The default setup's checks, an environment read from a table: what a test passes to up()."""

    def __init__(self, envs: dict[str, bringup.EnvFacts]):
        self.envs, self.asked = envs, []

    def environment(self, inv: Inventory, host: Host, remote: SSH) -> bringup.EnvFacts:
        self.asked.append(host.name)
        return self.envs[host.name]


def bring_up() -> bringup.Bringup:
    inv = load_inventory(ROOT / "recipes" / "clusters" / "example.yaml")
    table = HostTable(f"cluster {inv.name}", [(h.name, h.role) for h in inv.hosts], bringup.PHASES,
                      stream=io.StringIO(), live=False)
    return bringup.Bringup(inv, bringup.make_nodes(inv), table)


def test_each_host_gets_the_environment_its_setup_makes():
    b, setup = bring_up(), Recorded({})
    setup.envs = {n.name: bringup.EnvFacts("sha256:" + "a" * 64, "3.12.1", "2.49.0") for n in b.nodes}
    bringup.environment_phase(b, setup, nccl_check=False)
    assert sorted(setup.asked) == sorted(n.name for n in b.nodes) and len(b.nodes) > 1
    assert all(n.env == setup.envs[n.name] for n in b.nodes)


def test_a_host_whose_environment_differs_from_the_heads_stops_the_bring_up():
    b, setup = bring_up(), Recorded({})
    worker = next(n for n in b.nodes if not n.host.is_head)
    setup.envs = {n.name: bringup.EnvFacts("sha256:" + "a" * 64, "3.12.1", "2.49.0") for n in b.nodes}
    setup.envs[worker.name] = bringup.EnvFacts("sha256:" + "b" * 64, "3.12.1", "2.48.0")
    with pytest.raises(bringup.ClusterError) as err:
        bringup.environment_phase(b, setup, nccl_check=False)
    assert list(err.value.failures) == [worker.name]
    assert "Ray 2.48.0 differs from the head's 2.49.0" in err.value.failures[worker.name]

