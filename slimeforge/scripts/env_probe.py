"""What an environment is, read with ITS python (standard library only): prints one JSON object
with the Python and Ray versions, the interpreter, and, given a path, that file's sha256.

    python - [LOCK_PATH] < env_probe.py        (or python -c "$(cat env_probe.py)" [LOCK_PATH])

The one versions probe: preflight reads a host's Ray and Python with it, and cluster.up reads each
host's environment (host mode: the install's venv; container mode: inside the image) with it.
"""

import hashlib
import json
import platform
import sys


def ray_version() -> "str | None":
    try:
        from importlib import metadata

        return metadata.version("ray")
    except Exception:  # noqa: BLE001 - no Ray (or no metadata): reported as null
        return None


def facts(lock_path: "str | None" = None) -> "dict[str, str | None]":
    """Python, Ray and the interpreter; with `lock_path`, that file's sha256 (or why it is unreadable)."""
    out: dict[str, str | None] = {"python": platform.python_version(), "ray": ray_version(),
                                  "executable": sys.executable}
    if lock_path:
        try:
            with open(lock_path, "rb") as f:
                out["lock_sha256"] = hashlib.sha256(f.read()).hexdigest()
        except OSError as exc:
            out["lock_error"] = str(exc)
    return out


# `python - < env_probe.py` and `python -c TEXT` run it as __main__; image_probe.py imports it.
if __name__ == "__main__":
    print(json.dumps(facts(sys.argv[1] if len(sys.argv) > 1 else None)))
