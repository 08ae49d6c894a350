"""Option values the tasks resolve before they call the library: a whole number, an inventory read
with the user's own ssh config, --cluster/--address as the Jobs API to ask. A value refused exits 2
naming the option (docs/exit-codes.md), before anything is started.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from typing import TYPE_CHECKING

from invoke import Exit

if TYPE_CHECKING:
    from slimeforge.cluster.inventory import Inventory
    from slimeforge.run.targets.jobsubmit import Cluster


def count(option: str, value: object) -> int | None:
    """A whole number given on the command line (an option without a default arrives as a string)."""
    if value is None:
        return None
    text = str(value)
    if not re.fullmatch(r"[0-9]{1,3}", text):
        raise Exit(f"error: {option}: {text!r} is not a whole number (0..100)", code=2)
    return int(text)


def cluster_jobs_api(inventory: str, dry_run: bool, ssh_config: str | None = None, tunnel: str | None = None,
                     tunnels: ExitStack | None = None) -> Cluster:
    """The cluster `cluster.up` brought up from this inventory: its Jobs API (over ssh where needed), environment and checks."""
    from slimeforge.cluster.runcheck import cluster_env

    return cluster_env(inventory, dry_run=dry_run, ssh_config=ssh_config, tunnel=tunnel, tunnels=tunnels)


def inventory_of(path: str, ssh_config: str | None) -> Inventory:
    """The inventory at `path`, its ssh options replaced by the user's own config file where given."""
    from slimeforge.cluster.inventory import load_inventory

    return load_inventory(path, ssh_config=ssh_config)


def jobs_api_of(cluster: str | None, address: str | None, ssh_config: str | None) -> str | None:
    """--cluster INVENTORY / --address URL of run.status/logs/stop: the Jobs API to ask; None: neither given."""
    from slimeforge.run.headstate import check_address

    if cluster and address:
        raise Exit("error: --cluster and --address both name a cluster; give one", code=2)
    if address:
        return check_address(address)
    return cluster_jobs_api(cluster, False, ssh_config).address if cluster else None
