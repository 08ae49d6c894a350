"""What slime at a pinned commit accepts: model types and flags (images/slime/<commit>.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .. import paths
from ..errors import ConfigError, Problem
from ..yamlio import read_yaml


@dataclass(frozen=True)
class SlimeFacts:
    commit: str
    model_types: tuple[str, ...]
    renderable_flags: frozenset[str]
    removed_flags: dict[str, str]


@lru_cache(maxsize=8)
def load_facts(commit: str) -> SlimeFacts | None:
    path = paths.IMAGES / "slime" / f"{commit}.yaml"
    if not path.exists():
        return None
    doc = read_yaml(path)  # the one reader, then every field used typed
    groups, types, removed = doc.get("renderable_flags"), doc.get("model_types"), doc.get("removed_flags", {})
    if not (isinstance(groups, dict) and all(isinstance(g, list) and all(isinstance(f, str) for f in g) for g
                                             in groups.values())
            and isinstance(types, list) and all(isinstance(t, str) for t in types)
            and isinstance(removed, dict) and all(isinstance(v, str) for v in removed.values())):
        raise ConfigError(str(path), [Problem("file", "is not a slime facts file", show_value=False,
                                              accepted="renderable_flags: {group: [flags]}, model_types: [names], "
                                                       "removed_flags: {flag: why}")])
    flags = frozenset(f for group in doc["renderable_flags"].values() for f in group)
    return SlimeFacts(commit, tuple(doc["model_types"]), flags, dict(doc.get("removed_flags", {})))


def model_types_in(slime_dir: str | Path) -> list[str] | None:
    """Model types of a local slime checkout, or None when there is no checkout at that path."""
    models = Path(slime_dir) / "scripts" / "models"
    if not models.is_dir():
        return None
    return sorted(p.stem for p in models.glob("*.sh"))
