"""Option values the tasks resolve before they call the library: a whole number, an inventory read
with the user's own ssh config, --cluster/--address as the Jobs API to ask. A value refused exits 2
naming the option (docs/exit-codes.md), before anything is started. And clean_errors, which every
task wears: an error the library raises, as its message and the exit status its class carries.
"""

from __future__ import annotations

import functools
import re
import sys
from contextlib import ExitStack
from typing import TYPE_CHECKING

from invoke import Exit

from slimeforge.errors import SlimeforgeError

if TYPE_CHECKING:
    from slimeforge.cluster.inventory import Inventory
    from slimeforge.run.targets.jobsubmit import Cluster


def clean_errors(fn):
    """Print our errors as messages, not tracebacks, with the exit status their class carries: 2 bad
    input or a refused precondition, 1 a failed job, build, install or push (errors.py; the one
    mapping, docs/exit-codes.md). An error whose details were printed already (a preflight's table)
    says only its one line. A closed stdout (`| head`) ends the task quietly: 141, as SIGPIPE would."""

    @functools.wraps(fn)
    def wrapper(c, *args, **kwargs):
        try:
            result = fn(c, *args, **kwargs)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
            return result
        except SlimeforgeError as exc:
            raise Exit(f"error: {exc.headline()}", code=exc.exit_code) from None
        except BrokenPipeError:
            from slimeforge.console import quiet_on_closed_pipe

            raise Exit(code=quiet_on_closed_pipe()) from None

    return wrapper


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
    """The cluster `cluster.up` brought up from this inventory: its Jobs API (over ssh where needed), environment and
    checks."""
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
