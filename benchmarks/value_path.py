"""The path of a recipe's `num_nodes` to the Ray submission (issue 41 item 8), measured by running it.

    python benchmarks/value_path.py [--nodes 2] [--list]

Writes recipes/gsm8k.yaml with `num_nodes: N` and a two-host inventory (host mode, 8 GPUs a host) to a
temporary directory, then runs the run task's dry run on them (slimeforge/cli.py run_start, as
`invoke run RECIPE --cluster INVENTORY --dry-run` does: nothing is started, no host is reached) under
a profiler, from the task until the Ray submission is planned (ClusterTarget.plan returns: the
`ray job submit` argv and the job.sh that carries `--actor-num-nodes N`; checked), and counts, over the
project's files (slimeforge/ and tasks/; code run while a module is imported left out):

    files        every file a function of which runs on the way
    value files  the files whose functions are called with the value itself: the parsed recipe
                 mapping that holds `num_nodes`, the Recipe, what carries it on (ResolvedRun, RunDir,
                 LaunchPlan), or the slime arguments holding `--actor-num-nodes`
    reads        the files whose code reads `Recipe.num_nodes` itself (an attribute read, hooked)
    back up      steps of the value's path (its files in first-call order) into a higher layer than
                 the step before (as cuda_path.py counts them: a lower layer's helper, such as
                 yamlio or schema, returning to its caller counts); and caller -> callee edges into a
                 higher layer (callbacks), those that pass the value counted apart

Layers as benchmarks/cuda_path.py reads them (the import-linter contracts of pyproject.toml). What the
dry run does not run, a launch adds after the plan: the preflight (cluster/runcheck.InventoryChecks:
the gate and the static fit read num_nodes again, through the run layer's ClusterChecks interface,
called, not imported) and jobsubmit.submit -> jobsapi.JobsApi.submit, where the value travels inside
job.sh in the working_dir, no longer as a value.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from cuda_path import call_tracer, higher, layer_ranks, project, rank  # noqa: E402  (the same layers, read the same way)

FLAG = "--actor-num-nodes"
CARRIERS = {"Recipe", "ResolvedRun", "RunDir", "LaunchPlan"}


def carries(value: object) -> bool:
    """Whether an argument is the value or something that holds it (see the module docstring)."""
    if type(value).__name__ in CARRIERS:
        return True
    if isinstance(value, Mapping):
        return "num_nodes" in value
    if isinstance(value, list | tuple):
        return any(v == FLAG for v in value if isinstance(v, str))
    return False


def inputs(tmp: Path, nodes: int) -> tuple[Path, Path]:
    """The recipe (gsm8k.yaml with num_nodes) and an inventory it fits."""
    data = yaml.safe_load((ROOT / "recipes" / "gsm8k.yaml").read_text())
    data.update(num_nodes=nodes, mode="host", install_prefix="/opt/slimeforge")
    recipe = tmp / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(data))
    hosts = [{"name": f"h{i}", "address": f"10.213.9.{i + 1}", "gpus": 8,
              **({"role": "head"} if i == 0 else {})} for i in range(nodes)]
    inv = tmp / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"name": "lab", "mode": "host", "prefix": "/opt/slimeforge", "hosts": hosts}))
    return recipe, inv


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--list", action="store_true", help="list the files")
    args = ap.parse_args()
    os.chdir(ROOT)
    from slimeforge import cli
    from slimeforge.run.recipe import Recipe
    from slimeforge.run.targets import jobsubmit

    contracts = layer_ranks()
    calls: list[tuple[str, str | None, bool]] = []  # file, caller file, called with the value
    reads: list[str] = []
    done = [False]

    profile = call_tracer(carries, calls, done)

    own_getattribute = Recipe.__getattribute__

    def watched_read(self, name):
        if name == "num_nodes" and not done[0]:
            f = sys._getframe(1)
            if (rel := project(f.f_code.co_filename)) is not None:
                reads.append(rel)
        return own_getattribute(self, name)

    plan = jobsubmit.ClusterTarget.plan
    planned: list = []

    def watched_plan(self, run):
        out = plan(self, run)
        planned.append(out)
        done[0] = True
        return out

    Recipe.__getattribute__ = watched_read  # type: ignore[method-assign]
    jobsubmit.ClusterTarget.plan = watched_plan  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory(prefix="sf-value-path-") as tmp:
        recipe, inv = inputs(Path(tmp), args.nodes)
        sys.setprofile(profile)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
                cli.run_start.body(None, recipe=str(recipe), cluster=str(inv), dry_run=True, out=str(Path(tmp) / "run"))
        except SystemExit as exc:
            raise SystemExit(f"the dry run failed ({exc}): {err.getvalue()[-2000:]}") from None
        finally:
            sys.setprofile(None)
            Recipe.__getattribute__ = own_getattribute  # type: ignore[method-assign]
    if not planned:
        raise SystemExit("the submission was not planned: is ClusterTarget.plan still where it is?")
    job = planned[0].rundir.files.get("job.sh", "") + " ".join(planned[0].rundir.args)
    if f"{FLAG} {args.nodes}" not in job and f"{FLAG}={args.nodes}" not in job:
        raise SystemExit(f"the planned job does not carry {FLAG} {args.nodes}: the path measured is not the value's")

    def module(rel: str) -> str:
        return rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")

    files = list(dict.fromkeys(rel for rel, _, _ in calls))
    value_files = list(dict.fromkeys(rel for rel, _, carried in calls if carried))
    read_files = list(dict.fromkeys(reads))
    ranks = {f: rank(module(f), contracts) for f in {*files, *read_files}}
    value_ups = [(a, b) for a, b in zip(value_files, value_files[1:], strict=False) if higher(ranks[a], ranks[b])]
    edges = {(c, r) for r, c, _ in calls if c and c != r}
    edge_ups = sorted((c, r) for c, r in edges if higher(ranks[c], ranks[r]))
    value_edge_ups = sorted({(c, r) for r, c, carried in calls if carried and c and c != r and higher(ranks[c],
                                                                                                      ranks[r])})
    print(f"invoke run RECIPE (num_nodes: {args.nodes}) --cluster INVENTORY --dry-run, up to the planned Ray "
          "submission:")
    print(f"  files:        {len(files)}")
    print(f"  value files:  {len(value_files)}")
    print(f"  reads:        {len(read_files)} file(s) read Recipe.num_nodes: {', '.join(read_files)}")
    print(f"  back up:      {len(value_ups)} steps of the value's path, {len(edge_ups)} caller -> callee edges, "
          f"{len(value_edge_ups)} of them calls with the value")
    if args.list:
        print("value files, in first-call order:\n" + "\n".join(f"  {f}" for f in value_files))
        print("steps back up:\n" + "\n".join(f"  {a} -> {b}" for a, b in value_ups))
        print("edges back up:\n" + "\n".join(f"  {a} -> {b}" + (" (with the "
                                                                "value)" if (a, b) in value_edge_ups else "") for a,
                                             b in edge_ups))
        print("other files:\n" + "\n".join(f"  {f}" for f in files if f not in value_files))


if __name__ == "__main__":
    main()
