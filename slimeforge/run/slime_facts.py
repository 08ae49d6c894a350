"""What slime at a pinned commit accepts: model types and flags (images/slime/<commit>.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from .. import paths


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
    doc = yaml.safe_load(path.read_text())
    flags = frozenset(f for group in doc["renderable_flags"].values() for f in group)
    return SlimeFacts(commit, tuple(doc["model_types"]), flags, dict(doc.get("removed_flags", {})))


def model_types_in(slime_dir: str | Path) -> list[str] | None:
    """Model types of a local slime checkout, or None when there is no checkout at that path."""
    models = Path(slime_dir) / "scripts" / "models"
    if not models.is_dir():
        return None
    return sorted(p.stem for p in models.glob("*.sh"))
