"""The Ray head a launch starts and records, and the address of a dashboard.

Both launch paths (launch.py and the rendered launch.sh) record the head's pid in one state
directory per GCS port; preflight reads it (a port held by our own earlier head is no problem) and
launch stops exactly that process. Kept apart from both, so that launch needs only preflight's
entry point and preflight needs nothing of launch.
"""

from __future__ import annotations

import os
from pathlib import Path

HEAD_PID = "head.pid"


def state_dir(ray_port: int, environ: dict[str, str] | None = None) -> Path:
    """The same directory launch.sh uses: one per GCS port, so two heads on one host never mix."""
    env = os.environ if environ is None else environ
    base = env.get("SLIMEFORGE_STATE_DIR") or f"{env.get('XDG_STATE_HOME') or Path.home() / '.local' / 'state'}/slimeforge"
    return Path(base) / f"ray-{ray_port}"


def recorded_head(state_dir: Path | None) -> int | None:
    """The pid of the Ray head an earlier launch recorded, when that process still runs."""
    if state_dir is None:
        return None
    try:
        pid = int((state_dir / HEAD_PID).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if b"--head" in cmdline else None


def dashboard_url(address: str) -> str:
    return address if address.startswith("http") else f"http://{address}"
