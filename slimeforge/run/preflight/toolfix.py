"""What a failing tool said, and a fix only where its words say what is wrong.

    tool_message(exc)          the tool's own message, verbatim (its last lines), after the command
    known_fix(exc, fallback)   the fix its message matches, else `fallback`

Docker, ssh and nvidia-smi explain their own failures ("lookup registry.invalid: no such host",
"could not select device driver"), and their last line is often the least of it ("Run 'docker
run --help' for more information"): a finding shows the whole message, and names a cause only when
one of the patterns below matched it. Nothing is guessed from an exit status alone.
"""

from __future__ import annotations

import re

from ...errors import CommandError
from ...schema import printable

MESSAGE_LINES = 12  # a tool's message is a few lines; a flood (a stack trace) is cut to its end
LINE_CHARS = 500

# (what the tool's message says, the fix that follows from it); the first match wins.
KNOWN: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.I), fix) for p, fix in (
    # Docker Engine
    (r"Cannot connect to the Docker daemon|error during connect|docker\.sock: connect: no such file",
     "start Docker Engine (`sudo systemctl start docker`), or point DOCKER_HOST at a running engine"),
    (r"permission denied while trying to connect to the Docker daemon",
     "add this user to the docker group (`sudo usermod -aG docker $USER`, then log in again), or run as root"),
    (r"could not select device driver .* with capabilities: \[\[gpu\]\]",
     "install the NVIDIA Container Toolkit and register it with Docker (`sudo nvidia-ctk runtime configure "
     "--runtime=docker`, "
     "then restart Docker)"),
    (r"nvidia-container-cli: (initialization error|.*driver)",
     "the NVIDIA Container Toolkit cannot reach the driver: check `nvidia-smi` on the host (driver loaded, same "
     "version as "
     "its libraries)"),
    (r"lookup \S+.*no such host|Temporary failure in name resolution|server misbehaving",
     "the image's registry host does not resolve from here: check the image name, or DNS and the proxy settings"),
    (r"pull access denied|unauthorized|no basic auth credentials|denied: ",
     "log in to the image's registry (`docker login REGISTRY`; ECR: `aws ecr get-login-password | docker login ...`), "
     "or check the image name"),
    (r"manifest unknown|manifest for \S+ not found|No such image",
     "the image is not there: build it (`invoke build`), pull it, or check its name and tag"),
    # nvidia-smi
    (r"Driver/library version mismatch",
     "the loaded NVIDIA driver and its libraries differ: reboot, or reload the driver"),
    (r"couldn't communicate with the NVIDIA driver|NVIDIA-SMI has failed",
     "the NVIDIA driver is not loaded: load it (`sudo modprobe nvidia`) or reinstall it"),
    (r"No devices were found", "the driver sees no GPU: check that this host has one (a VM: its GPU passthrough)"),
    # ssh
    (r"Permission denied \(publickey",
     "the host refuses this key: add it to the host's authorized_keys, or name the right one "
     "in the inventory (ssh.identity_file)"),
    (r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED",
     "the host's key is not the one known_hosts holds: check it (`ssh-keygen -F HOST`), then update known_hosts"),
    (r"Could not resolve hostname", "the host name does not resolve: check it in the inventory, or DNS"),
    (r"Connection refused|Connection timed out|No route to host",
     "nothing answers on the host's ssh port: check the host is up, the port, and the firewall"),
))


def tool_message(exc: BaseException) -> str:
    """The command and the tool's own words, verbatim (each line printable, the last MESSAGE_LINES)."""
    if isinstance(exc, CommandError):
        lines = [printable(line)[:LINE_CHARS] for line in exc.output.strip().splitlines() if line.strip()]
        said = lines[-MESSAGE_LINES:]
        head = f"`{' '.join(exc.argv)}` exited with {exc.returncode}"
        return head + (":\n" + "\n".join(said) if said else " and printed nothing")
    return printable(str(exc))


def known_fix(exc: BaseException, fallback: str) -> str:
    """The fix the tool's message names by its words; else `fallback` (what to do without knowing the cause)."""
    text = exc.output if isinstance(exc, CommandError) else str(exc)
    for pattern, fix in KNOWN:
        if pattern.search(text):
            return fix
    return fallback
