"""Which layout a run is rendered for: slimeforge's own, or the image's.

    SLIMEFORGE                                 an image `invoke build` made (or an install prefix)
    layout_of_image(recipe, pull=...) -> (Layout, recipe, note)   container mode: probe the image, choose
    layout_from_facts(facts, recipe) -> (Layout, recipe)           the choice, from the probe's answer
    layout_here(recipe, environ) -> Layout     in place (SlimeRunner where slime is installed): this environment's

slimeforge's layout is what its build and install make: the stack's venv, the empty libcudart.so.12
at /opt/slimeforge/cudart-decoy, cuDNN and the CUDA libraries under the venv's site-packages, all
put first on the job's LD_LIBRARY_PATH (run/flags.py's runtime_env_vars). None of those paths is
in an image slimeforge did not build (slime's official one: slime at /root/slime, Megatron-LM at
/root/Megatron-LM, its own python3 and libraries), and replacing its LD_LIBRARY_PATH would hide
its own. So a run in such an image is rendered for the image's layout: train.py of the slime the
probe found there, that Megatron first on PYTHONPATH with the image's own PYTHONPATH after it,
the image's python3 (launch.sh's `python3`), and no variable of slimeforge's layout; what the
recipe adds to LD_LIBRARY_PATH goes after the image's own entries. The plan says which (plan.json
"layout", and a note of the dry run).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import paths
from ..errors import CommandError, ConfigError, Problem, SlimeforgeError
from ..schema import excerpt, text_problem
from .recipe import Recipe

if TYPE_CHECKING:
    from .imageprobe import ImageFacts

SLIMEFORGE_NAME, IMAGE_NAME = "slimeforge", "image"


@dataclass(frozen=True)
class Layout:
    name: str  # SLIMEFORGE_NAME or IMAGE_NAME
    why: str  # how it was chosen, one line (plan.json, the dry run's note)
    # The image's own search paths (IMAGE_NAME only; None: unset there), kept after what the run adds.
    pythonpath: str | None = None
    ld_library_path: str | None = None
    # Megatron-LM is where `import megatron` resolves in the image (not at the recipe's
    # megatron_dir): it needs no PYTHONPATH entry, and its directory (site-packages, maybe) gets
    # none ahead of the standard library.
    megatron_imported: bool = False

    @property
    def is_slimeforge(self) -> bool:
        return self.name == SLIMEFORGE_NAME

    def record(self) -> dict[str, str | None]:
        """plan.json's "layout"."""
        return asdict(self)


SLIMEFORGE = Layout(SLIMEFORGE_NAME, "slimeforge's own layout (an image `invoke build` made, or an install prefix)")


def search_path(*parts: str | None) -> str:
    """Entries of PATH-like values joined in order, each once, without empty ones (an empty
    PYTHONPATH entry would put the working directory on sys.path)."""
    return ":".join(dict.fromkeys(e for part in parts if part for e in part.split(":") if e))


def image_layout(facts: ImageFacts, megatron_imported: bool = False) -> Layout:
    """The layout of an image slimeforge did not build, from its probe (imageprobe.ImageFacts)."""
    how = " (by `import megatron`)" if megatron_imported else ""
    found = f"slime at {facts.slime_dir or '(not found)'}, Megatron-LM at {facts.megatron_dir or '(not found)'}{how}"
    return Layout(IMAGE_NAME,
                  f"the image's own layout: image {facts.short_id} has no /opt/slimeforge; {found}, its python3",
                  facts.pythonpath, facts.ld_library_path, megatron_imported)


def layout_of_image(recipe: Recipe, *, pull: bool, docker: str = "docker") -> tuple[Layout, Recipe, str | None]:
    """Container mode: the layout of the recipe's image, and the recipe with slime_dir and
    megatron_dir where the probe found them in it (a foreign image only), and a note when the image
    could not be probed (then slimeforge's layout, as before; the preflight says what it learns).
    `pull`: a launch pulls the image as `docker run` would; a dry run probes only an image here."""
    from .imageprobe import image_facts  # only container mode with an image needs docker

    image = recipe.image or ""
    try:
        facts = image_facts(image, recipe.slime_dir, recipe.megatron_dir, docker=docker, pull=pull)
    except (SlimeforgeError, OSError) as exc:
        # Docker's own words, cut between lines: a cut inside one read as "Error respon): rendered ...".
        said = (f"{exc.step}: {excerpt(exc.output)}" if isinstance(exc, CommandError) and exc.output.strip()
                else excerpt(str(exc)))
        return SLIMEFORGE, recipe, f"the image's layout is not known ({said}): rendered for slimeforge's layout"
    return (*layout_from_facts(facts, recipe), None)


def layout_from_facts(facts: ImageFacts, recipe: Recipe) -> tuple[Layout, Recipe]:
    """The layout the probe's answer (imageprobe.ImageFacts) calls for, and the recipe with
    slime_dir and megatron_dir where the probe found slime and Megatron in a foreign image (where
    `import slime` / `import megatron` resolve there when the recipe's paths hold none)."""
    if facts.slimeforge_image:
        return Layout(SLIMEFORGE_NAME, f"slimeforge's own layout: image {facts.short_id} has /opt/slimeforge"), recipe
    found = {k: v for k, v in (("slime_dir", facts.slime_dir), ("megatron_dir",
                                                                facts.megatron_dir)) if v and v != getattr(recipe, k)}
    # The probe takes the recipe's megatron_dir when it holds megatron/, else where `import megatron` resolves.
    return image_layout(facts, "megatron_dir" in found), recipe.model_copy(update=found) if found else recipe


def layout_here(recipe: Recipe, environ: dict[str, str], python: str) -> Layout:
    """In place (host mode in this environment: slime's container, or the environment its
    bare-metal script built): slimeforge's layout only where slimeforge built it (/opt/slimeforge
    here); else this environment's own, keeping its PYTHONPATH and LD_LIBRARY_PATH after what the
    run adds. Their values reach the run directory: text without control characters, or a
    ConfigError naming the variable."""
    if Path(paths.IMAGE_STATE).is_dir():
        return Layout(SLIMEFORGE_NAME, f"slimeforge's own layout: {paths.IMAGE_STATE} is here")
    bad = [Problem(k, f"{why}: it is kept in the job's environment", environ[k], "a ':'-separated list of directories")
           for k in ("PYTHONPATH", "LD_LIBRARY_PATH") if k in environ and (why := text_problem(environ[k]))]
    if bad:
        raise ConfigError("this environment", bad)
    return Layout(IMAGE_NAME,
                  f"this environment's own layout (in place; no {paths.IMAGE_STATE} here): slime at "
                  f"{recipe.slime_dir}, "
                  f"Megatron-LM at {recipe.megatron_dir}, {python}", environ.get("PYTHONPATH"),
                  environ.get("LD_LIBRARY_PATH"))
