"""`SlimeRunner`: the seed's Python API, on the same validation and rendering as the tasks.

    from slimeforge import SlimeRunner
    SlimeRunner(exp_id="gsm8k-3b-smoke", agent_runtime_arn="arn:aws:bedrock-agentcore:...",
                s3_bucket="my-bucket", model_dir="/models/Qwen2.5-3B-Instruct",
                data_path="/data/gsm8k.jsonl", model_type="qwen2.5-3B").train(num_rollout=1)

The constructor takes exactly the seed's fields and defaults, plus slimeforge's run options
(num_rollout, stack, mode, checkpoint_dir, ...), all keyword-only. A YAML dump of the keyword
arguments is a recipe, and `from_yaml` reads any recipe (with `extends:`).

Unlike `invoke run` (a recipe's `mode`, default container), a SlimeRunner that names no mode,
image or install_prefix trains in place, where slime is installed (docs/api.md).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import yaml

from . import paths
from .atomic import write_output
from .errors import ConfigError, Problem
from .image.stack import Stack
from .run.recipe import RUNNER_FIELDS, Recipe, load_recipe_data
from .run.recipecheck import parse_recipe
from .run.rundir import RunDir, build_run_dir, write_run_dir


def _signature() -> inspect.Signature:
    """`SlimeRunner(*, exp_id, ..., num_gpus=8, ...)`, read from the recipe schema, so help(),
    IDEs and inspect.signature show every field and its default; required ones have none."""
    params = []
    for name, field in Recipe.model_fields.items():
        if field.is_required():
            default = inspect.Parameter.empty
        else:
            default = field.get_default(call_default_factory=True)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=field.annotation))
    # Required first: a signature may not list a parameter without default after one with.
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
    return inspect.Signature(params, return_annotation=None)


class SlimeRunner:
    def __init__(self, **kwargs: Any):
        self._kwargs = dict(kwargs)
        self._source = "SlimeRunner(...)"
        self.recipe, self.stack = parse_recipe(self._kwargs, self._source)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, **overrides: Any) -> SlimeRunner:
        data = load_recipe_data(path, overrides)
        obj = cls.__new__(cls)
        obj._kwargs, obj._source = data, str(path)
        obj.recipe, obj.stack = parse_recipe(data, str(path))
        return obj

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("recipe", "stack"):
            raise AttributeError(name)
        return getattr(self.recipe, name)

    def __repr__(self) -> str:
        return f"SlimeRunner(exp_id={self.recipe.exp_id!r}, model_type={self.recipe.model_type!r}, stack={self.stack.id!r})"

    def to_dict(self) -> dict[str, Any]:
        """The keyword arguments: the seed's fields always, run options where they were given."""
        out = {k: getattr(self.recipe, k) for k in RUNNER_FIELDS}
        out.update({k: v for k, v in self._kwargs.items() if k not in RUNNER_FIELDS})
        return out

    def to_yaml(self, path: str | os.PathLike) -> Path:
        """Write the keyword arguments as a recipe file (replaced atomically); returns its path."""
        path = Path(path)
        # write_output: a new name or a regular file only; a device node, a FIFO, a directory or a
        # symlink (/dev/stdout) is refused, never replaced by a file.
        try:
            write_output(path, yaml.safe_dump(self.to_dict(), sort_keys=False), where="SlimeRunner.to_yaml", field="path")
        except OSError as exc:
            raise ConfigError("SlimeRunner.to_yaml", [Problem("path", f"cannot be written: {exc.strerror}", str(path))]) from None
        return path

    def _with(self, num_rollout: int | None) -> tuple[Recipe, Stack]:
        if num_rollout is None or num_rollout == self.recipe.num_rollout:
            return self.recipe, self.stack
        return parse_recipe({**self._kwargs, "num_rollout": num_rollout}, self._source)

    def render(self, out: str | os.PathLike | None = None, num_rollout: int | None = None) -> RunDir:
        """Validate and write the run directory (default runs/<exp_id>); starts nothing."""
        recipe, stack = self._with(num_rollout)
        run = build_run_dir(recipe, stack, out or paths.run_dir(recipe.exp_id), self._source)
        write_run_dir(run)
        return run

    dry_run = render

    def train(self, num_rollout: int = 1, out: str | os.PathLike | None = None, **options: Any) -> int:
        """Preflight, start Ray, submit, stream logs; blocks until the job ends and returns its exit code.

        Without mode, image or install_prefix (in the keyword arguments or `options`) it runs in
        place: this interpreter, with slime and Megatron at slime_dir / megatron_dir (slime's
        container, or the environment its bare-metal script built). `options`: the launch options
        of `invoke run`, by keyword (address, mode, image, prefix, catalog, skip_checks, cluster, ...).
        The same request, checks, target and errors as `invoke run` (run/launch.py)."""
        from .run.launch import LAUNCH_OPTIONS, LaunchRequest, run_recipe, sequences_as_tuples

        unknown = sorted(set(options) - set(LAUNCH_OPTIONS))
        if unknown:
            raise ConfigError("SlimeRunner.train", [Problem(k, "is not a launch option", options[k], ", ".join(LAUNCH_OPTIONS)) for k in unknown])
        chosen = [k for k in ("mode", "image", "install_prefix") if self._kwargs.get(k) is not None]
        chosen += [k for k in ("mode", "image", "prefix") if options.get(k) is not None]
        req = LaunchRequest(recipe=self._source, data={**self._kwargs, "num_rollout": num_rollout}, out=None if out is None else str(out),
                            in_place=not chosen, **sequences_as_tuples(options))
        return run_recipe(req, dry_run=False)


SlimeRunner.__signature__ = _signature()  # type: ignore[attr-defined]
SlimeRunner.__init__.__signature__ = _signature().replace(  # type: ignore[attr-defined]
    parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *_signature().parameters.values()])
