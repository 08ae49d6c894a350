"""The Ray head a launch starts and records, and the address of a dashboard.

launch.sh records the head it starts in one state directory per GCS port, as head.json: its pid,
its start time (/proc/PID/stat field 22) and the boot id, and the run it was started for (exp_id
and the run token of the run directory). Preflight reads it (a port held by our own earlier head is
no problem), run.status/run.stop prove a head is this run's with it (run/ownership.py). Kept apart
from launch and preflight, so that neither needs the other.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any

from .. import readback
from ..errors import ConfigError, Problem
from ..scripts import headrecord
from . import ownership
from .ownership import HeadRecord

HEAD_RECORD = headrecord.RECORD


def state_dir(ray_port: int, environ: dict[str, str] | None = None) -> Path:
    """The same directory launch.sh uses: one per GCS port, so two heads on one host never mix."""
    env = os.environ if environ is None else environ
    base = (env.get("SLIMEFORGE_STATE_DIR")
            or f"{env.get('XDG_STATE_HOME') or Path.home() / '.local' / 'state'}/slimeforge")
    return Path(base) / f"ray-{ray_port}"


def _head_problem(doc: Any) -> str | None:
    # The grammar of scripts/headrecord.py, which writes the record; records older than issue 33 (no argv) are still
    # read.
    return headrecord.record_problem(doc, legacy=True)


def read_head(sdir: Path | None) -> HeadRecord | None:
    """The head record launch.sh wrote on this port (validated); None when there is none."""
    if sdir is None:
        return None
    doc = readback.read_json(sdir / HEAD_RECORD, HEAD_RECORD, "the head record launch.sh writes", _head_problem,
                             max_bytes=headrecord.MAX_RECORD)
    return None if doc is None else headrecord.from_doc(doc)


def recorded_head(sdir: Path | None) -> int | None:
    """The pid of the Ray head an earlier launch recorded, when that very process (pid, start time,
    boot id) still runs; None otherwise, and for a record that is not one."""
    try:
        head = read_head(sdir)
    except readback.RecordError:
        return None
    return head.pid if head is not None and ownership.head_alive(head, ownership.proc_facts(head.pid)) else None


# A Ray dashboard (Jobs API) address: scheme, host and an optional port; no user, path, query or
# fragment (a URL with userinfo sends it as credentials; a path would be silently joined).
_URL_RE = re.compile(r"(?P<scheme>https?)://(?:\[(?P<v6>[0-9A-Fa-f:.]{2,45})\]|(?P<host>[A-Za-z0-9.-]{1,253}))(?::(?P<port>[0-9]{1,5}))?/?")
_DNS_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
ADDRESS_ACCEPTED = "http(s)://HOST[:PORT] (HOST an IPv4 address, [IPv6] or a DNS name; PORT 1..65535), e.g. http://10.0.0.1:8265"


def address_problem(address: str) -> str | None:
    """Why `address` is not a Jobs API URL (ADDRESS_ACCEPTED), or None."""
    m = _URL_RE.fullmatch(address) if len(address) <= 300 else None
    if m is None:
        return "is not a URL of the form http(s)://HOST[:PORT], without user, path, query or spaces"
    if m["v6"] is not None:
        try:
            ipaddress.IPv6Address(m["v6"])
        except ValueError:
            return "holds an IPv6 address that is not one"
    else:
        host = m["host"].rstrip(".")
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                return "holds an IPv4 address that is not one"
        elif not host or not all(_DNS_LABEL_RE.fullmatch(label) for label in host.split(".")):
            return "holds a host name that is not a DNS name"
    if m["port"] is not None and not 1 <= int(m["port"]) <= 65535:
        return "names a port outside 1..65535"
    return None


def check_address(address: str, where: str = "--address") -> str:
    """`address` if it is a Jobs API URL, else a ConfigError naming `where`."""
    if why := address_problem(address):
        raise ConfigError("command line", [Problem(where, why, address, ADDRESS_ACCEPTED)])
    return address


def dashboard_url(address: str) -> str:
    return address if address.startswith("http") else f"http://{address}"
