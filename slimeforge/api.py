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
from typing import TYPE_CHECKING, Any, Literal, overload

import yaml

from .atomic import write_output
from .errors import ConfigError, Problem
from .run.recipe import RUNNER_FIELDS, Recipe, load_recipe_data
from .run.recipecheck import parse_recipe
from .run.rundir import RunDir, write_run_dir

if TYPE_CHECKING:
    from .run.launch import LaunchRequest
    from .run.targets.base import LaunchPlan


def _signature() -> inspect.Signature:
    """`SlimeRunner(*, exp_id, ..., num_gpus=8, ...)`, read from the recipe schema, so help(),
    IDEs and inspect.signature show every field and its default; required ones have none."""
    params = []
    for name, field in Recipe.model_fields.items():
        if field.is_required():
            default = inspect.Parameter.empty
        else:
            default = field.get_default(call_default_factory=True)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=field.annotation))
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
        return (f"SlimeRunner(exp_id={self.recipe.exp_id!r}, model_type={self.recipe.model_type!r}, "
               f"stack={self.stack.id!r})")

    def to_dict(self) -> dict[str, object]:
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
            write_output(path, yaml.safe_dump(self.to_dict(), sort_keys=False), where="SlimeRunner.to_yaml",
                         field="path")
        except OSError as exc:
            raise ConfigError("SlimeRunner.to_yaml", [Problem("path", f"cannot be written: {exc.strerror}",
                                                              str(path))]) from None
        return path

    def request(self, num_rollout: int | None = None, out: str | os.PathLike | None = None,
                **options: Any) -> LaunchRequest:
        """The one LaunchRequest of this runner, for render() and train() alike (run/launch.py).

        Without mode, image or install_prefix (in the keyword arguments or `options`) it runs in
        place: host mode in this interpreter's environment, with slime and Megatron at slime_dir /
        megatron_dir. `num_rollout` None keeps the recipe's."""
        from .run.launch import LAUNCH_OPTIONS, LaunchRequest, sequences_as_tuples

        unknown = sorted(set(options) - set(LAUNCH_OPTIONS))
        if unknown:
            raise ConfigError("SlimeRunner.train", [Problem(k, "is not a launch option", options[k],
                                                            ", ".join(LAUNCH_OPTIONS)) for k in unknown])
        chosen = [k for k in ("mode", "image", "install_prefix") if self._kwargs.get(k) is not None]
        chosen += [k for k in ("mode", "image", "prefix") if options.get(k) is not None]
        data = self._kwargs if num_rollout is None else {**self._kwargs, "num_rollout": num_rollout}
        return LaunchRequest(recipe=self._source, data=data, out=None if out is None else str(out), in_place=not chosen,
                             **sequences_as_tuples(options))

    def plan(self, num_rollout: int | None = None, out: str | os.PathLike | None = None, **options: Any) -> LaunchPlan:
        """What train() with these arguments would run: the request resolved as a dry run (mode,
        layout, environment, commands) and planned; writes nothing, starts nothing."""
        from .run.launch import resolve

        target, run = resolve(self.request(num_rollout, out, **options), dry_run=True)
        return target.plan(run)

    def render(self, out: str | os.PathLike | None = None, num_rollout: int | None = None) -> RunDir:
        """Validate and write the run directory (default runs/<exp_id>) that train() would launch:
        the same resolution (in place unless mode, image or install_prefix); starts nothing."""
        return _written(self.plan(num_rollout, out)).rundir

    dry_run = render

    @overload
    def train(self, num_rollout: int = 1, out: str | os.PathLike | None = None, *, dry_run: Literal[False] = False,
              **options: Any) -> int: ...
    @overload
    def train(self, num_rollout: int = 1, out: str | os.PathLike | None = None, *, dry_run: Literal[True],
              **options: Any) -> LaunchPlan: ...

    def train(self, num_rollout: int = 1, out: str | os.PathLike | None = None, *, dry_run: bool = False,
              **options: Any) -> int | LaunchPlan:
        """Preflight, start Ray, submit, stream logs; blocks until the job ends and returns its exit code.

        `dry_run=True`: the LaunchPlan this call would run (its run directory written, as render()
        writes it; nothing started, no preflight). `options`: the launch options of `invoke run`,
        by keyword (address, mode, image, prefix, catalog, skip_checks, cluster, ...). The same
        request (request()), checks, target and errors as `invoke run` (run/launch.py)."""
        from .run.launch import run_recipe

        if dry_run:
            return _written(self.plan(num_rollout, out, **options))
        return run_recipe(self.request(num_rollout, out, **options), dry_run=False)


def _written(plan: LaunchPlan) -> LaunchPlan:
    """A dry run's run directory, written as `invoke run --dry-run` writes it: never over a live
    run's record (an ended one's goes to history/<n>/)."""
    from .run.runrecord import guard_render

    guard_render(plan.rundir.path, exp_id=plan.run.recipe.exp_id)
    write_run_dir(plan.rundir)
    return plan


SlimeRunner.__signature__ = _signature()  # type: ignore[attr-defined]
SlimeRunner.__init__.__signature__ = _signature().replace(  # type: ignore[attr-defined]
    parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *_signature().parameters.values()])
