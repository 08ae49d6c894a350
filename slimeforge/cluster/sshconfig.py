"""What an inventory may tell ssh: an allow list, for `ssh.options` and for an `ssh.config` file.

An inventory is shared like a recipe, and every `cluster.*` task (even `cluster.status`) runs ssh
with what it says. ssh has many ways to run a program on this machine or to carry something out
to a host (ProxyCommand, LocalCommand, KnownHostsCommand, XAuthLocation, Match exec, forwarding,
SendEnv, Include of another file, ...), and new ones come with new OpenSSH releases. So this is an
allow list, not a block list: the options slimeforge needs and documents pass (names matched
case-insensitively, each value by its own grammar); anything else is refused, naming the option
and listing the accepted ones. A bastion is `ssh.proxy_jump`; a command proxy is the explicit
`ssh.proxy_command`, printed by `cluster.up --dry-run`.

An ssh config file named by the inventory (`ssh.config`) is held to the same list, plus the
keywords that say where and as whom to log in (Host, HostName, User, Port, IdentityFile,
ProxyJump, ...). A config file of your own with anything else is passed on the command line:
`--ssh-config FILE` of cluster.up, cluster.status, cluster.down and run, which ssh reads as is.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

from .. import readback
from ..errors import Problem
from ..schema import text_problem

YES_NO = re.compile(r"(?i:yes|no)")
ALGORITHMS = re.compile(r"[+^-]?[A-Za-z0-9@._-]{1,128}(?:,[A-Za-z0-9@._-]{1,128}){0,63}")
FILE = re.compile(r"(?i:none)|[~/%A-Za-z0-9_.@+-][^\"'`$;|&<>]{0,4095}")  # paths (ssh expands ~ and %d, %u, %h)
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")
SMALL_INT = re.compile(r"[1-9][0-9]{0,2}")
INT = re.compile(r"0|[1-9][0-9]{0,5}")
USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
PORT = re.compile(r"[1-9][0-9]{0,4}")
HOST_NAME = re.compile(r"(?:%h|[A-Za-z0-9_])(?:%h|[A-Za-z0-9_.-]){0,252}")  # DNS names, `%h.example.com`
HOST_PATTERNS = re.compile(r"!?[A-Za-z0-9_.*?:%\[\]-]{1,253}(?:[ \t]+!?[A-Za-z0-9_.*?:%\[\]-]{1,253}){0,63}")
JUMP_HOST = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}@)?"
                       r"(?:\[[0-9A-Fa-f:.%A-Za-z]{2,64}\]|[A-Za-z0-9_][A-Za-z0-9_.-]{0,252})(?::[0-9]{1,5})?")

# name (lower case) -> (the name ssh documents, the value's grammar, what is accepted)
OPTIONS: dict[str, tuple[str, re.Pattern[str], str]] = {
    k.lower(): (k, pattern, accepted) for k, pattern, accepted in [
        ("StrictHostKeyChecking", re.compile(r"(?i:yes|no|accept-new|off|ask)"), "yes, accept-new, no"),
        ("UserKnownHostsFile", FILE, "a known_hosts file"),
        ("GlobalKnownHostsFile", FILE, "a known_hosts file"),
        ("CheckHostIP", YES_NO, "yes or no"),
        ("HashKnownHosts", YES_NO, "yes or no"),
        ("UpdateHostKeys", re.compile(r"(?i:yes|no|ask)"), "yes, no or ask"),
        ("VerifyHostKeyDNS", re.compile(r"(?i:yes|no|ask)"), "yes, no or ask"),
        ("HostKeyAlias", NAME, "a host name"),
        ("HostKeyAlgorithms", ALGORITHMS, "a comma-separated algorithm list"),
        ("PubkeyAcceptedAlgorithms", ALGORITHMS, "a comma-separated algorithm list"),
        ("PubkeyAcceptedKeyTypes", ALGORITHMS, "a comma-separated algorithm list"),
        ("CASignatureAlgorithms", ALGORITHMS, "a comma-separated algorithm list"),
        ("KexAlgorithms", ALGORITHMS, "a comma-separated algorithm list"),
        ("Ciphers", ALGORITHMS, "a comma-separated algorithm list"),
        ("MACs", ALGORITHMS, "a comma-separated algorithm list"),
        ("IdentitiesOnly", YES_NO, "yes or no"),
        ("IdentityFile", FILE, "a private key file"),
        ("CertificateFile", FILE, "a certificate file"),
        ("PubkeyAuthentication", re.compile(r"(?i:yes|no|unbound|host-bound)"), "yes or no"),
        ("PreferredAuthentications", re.compile(r"[a-z0-9@.-]{1,64}(?:,[a-z0-9@.-]{1,64}){0,15}"), "e.g. publickey"),
        ("GSSAPIAuthentication", YES_NO, "yes or no"),
        ("ConnectionAttempts", SMALL_INT, "1..999"),
        ("AddressFamily", re.compile(r"(?i:any|inet|inet6)"), "any, inet or inet6"),
        ("BindAddress", re.compile(r"[0-9A-Fa-f:.]{2,45}"), "an address of this machine"),
        ("BindInterface", re.compile(r"[A-Za-z0-9_.:@-]{1,15}"), "an interface name"),
        ("Compression", YES_NO, "yes or no"),
        ("TCPKeepAlive", YES_NO, "yes or no"),
        ("IPQoS", re.compile(r"[A-Za-z0-9]{1,16}(?: [A-Za-z0-9]{1,16})?"), "e.g. lowdelay throughput"),
        ("RekeyLimit", re.compile(r"(?i:default|none|[0-9]{1,12}[KMG]?)(?: (?i:none|[0-9]{1,9}[smhdw]?))?"),
         "e.g. 1G 1h"),
    ]
}

# Only in an ssh config file (the inventory has its own keys for these, or slimeforge sets them).
CONFIG_ONLY: dict[str, tuple[str, re.Pattern[str], str]] = {
    k.lower(): (k, pattern, accepted) for k, pattern, accepted in [
        ("Host", HOST_PATTERNS, "host patterns"),
        ("HostName", HOST_NAME, "an IP address or a DNS name (%h allowed)"),
        ("User", USER, "a user name"),
        ("Port", PORT, "1..65535"),
        ("ProxyJump", re.compile(rf"(?i:none)|{JUMP_HOST.pattern}(?:,{JUMP_HOST.pattern}){{0,7}}"),
         "[user@]host[:port], comma-separated, or none"),
        ("ConnectTimeout", INT, "seconds"),
        ("ServerAliveInterval", INT, "seconds"),
        ("ServerAliveCountMax", INT, "a count"),
        ("BatchMode", YES_NO, "yes or no"),
        ("LogLevel", re.compile(r"(?i:quiet|fatal|error|info|verbose|debug[123]?)"),
         "QUIET, FATAL, ERROR, INFO, VERBOSE, DEBUG"),
    ]
}

# Why a well-known option is refused, where the inventory has a way to say it (hint, not the list).
INSTEAD = {
    "proxycommand": "a command proxy is ssh.proxy_command (explicit, shown by `invoke cluster.up --dry-run`)",
    "proxyjump": "a bastion is ssh.proxy_jump: [user@]host[:port]",
    "hostname": "a host's address is hosts[].address",
    "user": "the login is ssh.user (or a host's user)",
    "port": "the port is ssh.port (or a host's port)",
    "connecttimeout": "the timeout is ssh.connect_timeout",
    "include": "name the file as ssh.config (held to this list), or pass your own with --ssh-config FILE",
    "match": "Match blocks (Match exec runs a command) belong in your own ssh config: --ssh-config FILE",
}
MAX_CONFIG = 256 * 1024
LINE_RE = re.compile(r"([A-Za-z0-9]{1,64})(?:[ \t]*=[ \t]*|[ \t]+)(.{1,4096})")  # `Keyword value` or `Keyword=value`


def accepted(names: dict[str, tuple[str, re.Pattern[str], str]]) -> str:
    return ", ".join(sorted(v[0] for v in names.values()))


def _ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value.split("%", 1)[0] if value.lower().startswith("fe80") else value)
    except ValueError:
        return False
    return True


def option_problem(field: str, key: str, value: object,
                   allowed: dict[str, tuple[str, re.Pattern[str], str]]) -> Problem | None:
    """None when `key value` is in `allowed` with a value of its grammar; else what is wrong."""
    spec = allowed.get(key.lower()) if re.fullmatch(r"[A-Za-z0-9]{1,64}", key) else None
    if spec is None:
        hint = INSTEAD.get(key.lower(), "")
        return Problem(field,
                       "is not an ssh option slimeforge passes from an inventory" + (f" ({hint})" if hint else ""), key,
                       accepted(allowed))
    name, pattern, what = spec
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
    if text is None or text_problem(text) or not (pattern.fullmatch(text) or (name == "HostName" and _ip(text))):
        return Problem(field, f"is not a value of {name}", value, what)
    return None


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


def config_problems(path: Path, field: str = "ssh.config") -> list[Problem]:
    """Every line of the ssh config file at `path` that is not on the allow list (the file is read
    through the one reader: a regular file, at most 256 KiB, UTF-8)."""
    label = f"{field} ({path})"
    what = f"an ssh config with only: {accepted({**OPTIONS, **CONFIG_ONLY})}; or pass your own with --ssh-config FILE"
    try:
        data = readback.read_bytes(path, label, what, max_bytes=MAX_CONFIG, follow_symlinks=True)
        if data is None:
            return [Problem(field, "names no file on this machine", str(path),
                            "an ssh config file, or leave it out to use ~/.ssh/config")]
        text = readback.decode(path, label, what, data)
    except readback.RecordError as exc:
        return exc.problems
    problems: list[Problem] = []
    allowed = {**OPTIONS, **CONFIG_ONLY}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{field} ({os.path.basename(path)} line {n})"
        m = LINE_RE.fullmatch(line)
        if m is None:
            problems.append(Problem(where, "is not `Keyword value`", line[:200],
                                    "one ssh_config keyword and its value per line"))
            continue
        if (p := option_problem(where, m.group(1), _unquote(m.group(2).strip()), allowed)) is not None:
            problems.append(p)
    return problems
