"""Which registry host is reached how: the TLS trust the Docker daemon uses too, Docker's rule for
plain HTTP, and where a credential may go (the same host, its own domain; never across a redirect
that leaves the origin).

In: a registry host[:port] (and the daemon's insecure-registries). Out: an SSL context, yes/no
answers, the redirect handler that drops Authorization. registry.py's RegistryAPI asks these.
"""

from __future__ import annotations

import ipaddress
import ssl
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from ..imageref import DOCKER_HUB

DOCKER_CERTS_DIR = Path("/etc/docker/certs.d")


def tls_context(registry: str, certs_dir: Path = DOCKER_CERTS_DIR) -> ssl.SSLContext:
    """The system's CAs plus the registry's own from `<certs_dir>/<host:port>/`, where the Docker
    daemon reads them too, so we trust exactly what the daemon that pushes trusts."""
    ctx = ssl.create_default_context()
    host_dir = certs_dir / registry
    if host_dir.is_dir():
        for ca in sorted(host_dir.glob("*.crt")):
            ctx.load_verify_locations(cafile=str(ca))
        for cert in sorted(host_dir.glob("*.cert")):
            ctx.load_cert_chain(str(cert), str(cert.with_suffix(".key")))
    return ctx


def api_host(registry: str) -> str:
    return "registry-1.docker.io" if registry == DOCKER_HUB else registry


# --- where a credential may go ---------------------------------------------------------------------
# The rules (docs/publish.md):
#  1. Plain HTTP only to a registry the Docker daemon itself would speak plain HTTP to: a loopback
#     one (127.0.0.0/8, ::1, localhost) or one in the daemon's insecure-registries. HTTPS is tried
#     first, as Docker does; the fall-back happens only when the server does not speak TLS at all.
#  2. A password (Basic) goes only to the registry's own host, and over plain HTTP only on loopback.
#  3. A redirect to another host, or from https to http, loses the Authorization header.
#  4. A Bearer token service (the challenge's realm) gets the password only over https (or plain
#     HTTP on loopback, to a loopback registry) and only on the registry's host or a host of the
#     registry's own domain (registry.gitlab.com -> gitlab.com, registry-1.docker.io ->
#     auth.docker.io); anywhere else the token is asked for without it.
#  5. A TLS protocol error (WRONG_VERSION_NUMBER: the server speaks plain HTTP) is never retried.


def host_name(host_port: str) -> str:
    """`host` of `host[:port]` or `[v6]:port`, lowercased, without a trailing dot."""
    if host_port.startswith("["):
        return host_port[1:].split("]", 1)[0].lower()
    name = host_port.rsplit(":", 1)[0] if host_port.count(":") == 1 else host_port
    return name.lower().rstrip(".")


def is_loopback(host_port: str) -> bool:
    name = host_name(host_port)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def plain_http_allowed(registry: str, insecure: Iterable[str] = ()) -> bool:
    """Docker's rule for a registry it may reach over plain HTTP: loopback, or named in the daemon's
    insecure-registries (as host[:port], or a CIDR holding the registry's IP address)."""
    if is_loopback(registry):
        return True
    name = host_name(registry)
    for entry in insecure:
        if entry.lower().rstrip("/") in (registry.lower(), name):
            return True
        try:
            if ipaddress.ip_address(name) in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def daemon_insecure_registries(docker) -> list[str]:
    """The daemon's insecure registries (RegistryConfig of `docker info`); [] when it cannot say."""
    try:
        config = docker.info().get("RegistryConfig") or {}
    except Exception:  # noqa: BLE001 - any failure means: only the built-in loopback rule applies
        return []
    cidrs = [str(c) for c in config.get("InsecureRegistryCIDRs") or []]
    hosts = ([str(h) for h, c in (config.get("IndexConfigs") or {}).items() if isinstance(c, dict)
              and c.get("Secure") is False])
    return cidrs + hosts


def same_site(a: str, b: str) -> bool:
    """Whether host `b` belongs to the registry host `a`: the same host, `a`'s parent domain, or a
    sibling under that parent (only for hosts of three labels or more, so no public suffix counts)."""
    a, b = host_name(a), host_name(b)
    if a == b:
        return True
    for name in (a, b):
        try:
            ipaddress.ip_address(name)
            return False  # an address is only ever itself
        except ValueError:
            pass
    pa, pb = a.split("."), b.split(".")
    if len(pa) < 3:
        return False
    parent = ".".join(pa[1:])
    return b == parent or (len(pb) >= 3 and ".".join(pb[1:]) == parent)


class KeepAuthOnSameOrigin(urllib.request.HTTPRedirectHandler):
    """urllib forwards every header on a redirect, Authorization included; drop it when the
    redirect leaves the origin (another host or port) or goes from https to http."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            old, nxt = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(new.full_url)
            if (old.scheme, old.netloc.lower()) != (nxt.scheme, nxt.netloc.lower()):
                new.remove_header("Authorization")
                new.unredirected_hdrs.pop("Authorization", None)
        return new
