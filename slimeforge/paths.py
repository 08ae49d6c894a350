"""Where slimeforge finds its own data files (stacks, templates, recipes) in a checkout."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
TEMPLATES = ROOT / "templates"
