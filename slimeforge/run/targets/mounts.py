"""The one list of host paths a run needs inside a container, for every container target.

Local container mode renders it as `docker run -v P:P:ro|rw`, Slurm's container mode as pyxis's
`--container-mounts=P:P[:ro],...`; both read this function, so a path added here (an eval set, a
new data field) reaches every target at once.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError, Problem
from ..recipe import MOUNT_SEPARATORS, Recipe
from .base import Mount


def container_mounts(recipe: Recipe, run_dir: Path) -> tuple[Mount, ...]:
    """Model, data, every eval set's directory (read-only), checkpoints and the run directory
    (read-write), each once; a path asked for both ways is writable."""
    wanted = [
        Mount(recipe.model_dir, False, "model_dir"),
        Mount(str(Path(recipe.data_path).parent), False, "data_path (its directory)"),
        *(Mount(str(Path(p).parent), False, f"eval_data.{name} (its directory)") for name,
          p in recipe.eval_data.items()),
        Mount(recipe.resolved_checkpoint_dir, True, "checkpoint_dir"),
        Mount(str(run_dir), True, "run directory"),
    ]
    # The recipe's paths were checked by field already; the run directory (--out) is checked here,
    # and every path again: `docker -v` and pyxis split their value at ':' and ','.
    bad = [Problem(m.what,
                   f"holds {', '.join(repr(c) for c in MOUNT_SEPARATORS if c in m.path)}, which splits a container "
                   "mount",
                   m.path, "a path without ':' or ','") for m in wanted if any(c in m.path for c in MOUNT_SEPARATORS)]
    if bad:
        raise ConfigError("container mounts", bad)
    merged: dict[str, Mount] = {}
    for m in wanted:
        seen = merged.get(m.path)
        merged[m.path] = m if seen is None else Mount(m.path, seen.writable or m.writable, seen.what)
    return tuple(merged.values())


def docker_volume_args(mounts: tuple[Mount, ...]) -> list[str]:
    return [x for m in mounts for x in ("-v", f"{m.path}:{m.path}:{'rw' if m.writable else 'ro'}")]


def pyxis_mounts_arg(mounts: tuple[Mount, ...]) -> str:
    """pyxis's --container-mounts value (SRC:DST[:ro], comma-separated), sorted as before."""
    return ",".join(f"{m.path}:{m.path}" + ("" if m.writable else ":ro") for m in sorted(mounts, key=lambda m: m.path))
