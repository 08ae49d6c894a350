"""Host addresses of an inventory: IPv4, IPv6 (validated by `ipaddress`), DNS names and ssh config
aliases, and the forms each consumer needs.

  hosts[].address   ssh's destination (after `--`): an IPv6 address bare (`fd00::11`), which ssh
                    takes as it is; written `[fd00::11]` in the inventory, it is unbracketed
  ssh.proxy_jump    `-J [user@]host[:port][,...]`: an IPv6 host in brackets (`[fd00::1]:2222`),
                    which ssh needs to tell the port from the address; a bare one is bracketed
  host:port         Ray's --address, the dashboard's URL, messages: `[fd00::11]:6379` (hostport)
"""

from __future__ import annotations

import ipaddress
import re

from ..scripts.node_agent import hostport

__all__ = ["address_problem", "hostport", "jump_hosts", "ssh_address", "unique_key"]

# a DNS name or an alias
NAME_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_-]{1,63}){0,126}\.?")
ZONE_RE = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # fe80::1%eth0: an interface name
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    addr, _, zone = text.partition("%")
    if zone and not ZONE_RE.fullmatch(zone):
        return None
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return None
    return ip if not zone or ip.version == 6 else None


def ssh_address(value: str) -> str:
    """The destination ssh is given: `[fd00::11]` unbracketed, anything else as written."""
    return value[1:-1] if value.startswith("[") and value.endswith("]") else value


def address_problem(value: str) -> str | None:
    """Why `value` is not an IP address (v4 or v6, bracketed or not), DNS name or ssh alias."""
    bare = ssh_address(value)
    if bare != value or ":" in bare or "%" in bare:
        ip = _ip(bare)
        return None if ip is not None and ip.version == 6 else ("is not an IP address (IPv6: fd00::11 or [fd00::11]; a "
                                                               "port is `port:`, not part of the address)")
    return None if NAME_RE.fullmatch(value) and len(value) <= 253 else ("is not an IP address, host name or ssh config "
                                                                       "alias")


def unique_key(value: str) -> str:
    """One host however it is spelt: an IP in its canonical form, a name in lower case without the root dot."""
    ip = _ip(ssh_address(value))
    return ip.compressed if ip is not None else value.lower().rstrip(".")


def _jump(part: str) -> str | None:
    """One `[user@]host[:port]` of a bastion list, IPv6 bracketed; None when it is not one."""
    user, at, rest = part.rpartition("@")
    if at and not USER_RE.fullmatch(user):
        return None
    if rest.startswith("["):
        host, close, after = rest[1:].partition("]")
        if not close or (after and not after.startswith(":")):
            return None
        port = after[1:] if after else None
    elif rest.count(":") > 1:  # a bare IPv6 address: it cannot carry a port
        host, port = rest, None
    else:
        host, colon, port_text = rest.partition(":")
        port = port_text if colon else None
    if port is not None and not (re.fullmatch(r"[0-9]{1,5}", port) and 1 <= int(port) <= 65535):
        return None
    if ":" in host or rest.startswith("["):
        ip = _ip(host)
        if ip is None or ip.version != 6:
            return None
        zone = host.partition("%")[2]
        host = f"[{ip.compressed}{'%' + zone if zone else ''}]"
    elif address_problem(host):
        return None
    return f"{user + '@' if at else ''}{host}{':' + port if port is not None else ''}"


def jump_hosts(value: str) -> str | None:
    """`ssh -J`'s argument for a bastion list (comma-separated), IPv6 hosts bracketed; None when it is not one."""
    parts = [_jump(part) for part in value.split(",")]
    return None if any(p is None for p in parts) or len(parts) > 8 else ",".join(p for p in parts if p)
