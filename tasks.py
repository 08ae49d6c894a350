"""slimeforge's command line: thin invoke tasks over the `slimeforge` package.

Each task parses its options, calls one library function and prints the outcome; the functions
work without invoke (the SlimeRunner API uses the same ones). Heavy libraries (ray, boto3, docker)
are imported inside the functions that need them, so `invoke --list` and dry runs start fast.
"""

from __future__ import annotations

import functools
import json
import sys

from invoke import Collection, Exit, task

from slimeforge.errors import SlimeforgeError


def clean_errors(fn):
    """Print our errors as messages, not tracebacks, and exit 2 (1 is a failed job or build)."""

    @functools.wraps(fn)
    def wrapper(c, *args, **kwargs):
        try:
            return fn(c, *args, **kwargs)
        except SlimeforgeError as exc:
            raise Exit(f"error: {exc}", code=2) from None

    return wrapper


# --- stack -----------------------------------------------------------------------------------


@task(help={"cuda": "stack flavor (cu13, cu129) or a stack YAML path", "as_json": "print JSON"})
@clean_errors
def stack_show(c, cuda="cu13", as_json=False):
    """Print a stack's resolved pins and ordered install steps."""
    from slimeforge.stack import load_stack

    stack = load_stack(cuda)
    if as_json:
        print(json.dumps({"id": stack.id, "hash": stack.hash, "pins": stack.pins(), "steps": stack.plan()}, indent=2))
        return
    print(f"stack {stack.id}  (version {stack.version}, CUDA {stack.cuda}, Python {stack.python}, driver >= R{stack.driver_min})")
    width = max(len(k) for k in stack.pins())
    for key, value in stack.pins().items():
        print(f"  {key:<{width}}  {value}")
    print("steps:")
    for i, step in enumerate(stack.plan(), 1):
        what = step.get("requirements") or step.get("packages") or []
        extra = f" @ {step['commit'][:12]}" if step["kind"] == "source" else ""
        print(f"  {i:2}. {step['name']:<20} {step['kind']:<9}{extra} {' '.join(what)}")


# --- run -------------------------------------------------------------------------------------


@task(
    positional=["recipe"],
    iterable=["set_"],
    help={
        "recipe": "recipe YAML, e.g. recipes/gsm8k.yaml",
        "dry_run": "validate and render the run directory, print the plan, start nothing",
        "out": "run directory (default runs/<exp_id>)",
        "set_": "override a recipe key, key=value (repeatable)",
        "cluster": "launch on the cluster of this inventory (brought up with cluster.up; default: the recipe's cluster)",
    },
    default=True,
)
@clean_errors
def run_start(c, recipe, dry_run=False, out=None, set_=None, cluster=None):
    """Validate a recipe, render its run directory and launch it (--dry-run: render only)."""
    from pathlib import Path

    from slimeforge.recipe import load_recipe
    from slimeforge.render import build_run_dir, write_run_dir
    from slimeforge.yamlio import parse_set

    rec, stack = load_recipe(recipe, parse_set(set_ or []))
    target = Path(out) if out else Path("runs") / rec.exp_id
    if not dry_run:
        from slimeforge.launch import launch

        options = {}
        if cluster or rec.cluster:
            from slimeforge.cluster import address

            options["address"] = address(cluster or rec.cluster).dashboard  # the head's Jobs API
        code = launch(rec, stack, out=target, recipe_path=recipe, **options)
        if code:
            raise Exit(code=code)
        return
    run = build_run_dir(rec, stack, target, recipe)
    write_run_dir(run)
    print(f"recipe {recipe}: valid ({rec.exp_id}, stack {stack.id})")
    print(f"run directory {run.path}:")
    for name in run.files:
        print(f"  {name}")
    print("would run:")
    for argv in run.plan["commands"]:
        print("  " + " ".join(argv))
    print(f"  (train.py and {len(run.args)} arguments; see {run.path / 'slime.args'})", file=sys.stderr)


# --- cluster ---------------------------------------------------------------------------------


@task(
    positional=["inventory"],
    help={
        "inventory": "cluster inventory YAML, e.g. recipes/clusters/example.yaml",
        "dry_run": "print the per-host plan; connect to nothing, start nothing",
        "nccl_check": "also run an NCCL all-reduce across each host's GPUs and report bus bandwidth",
    },
)
@clean_errors
def cluster_up(c, inventory, dry_run=False, nccl_check=False):
    """Bring up a Ray cluster on the inventory's hosts over SSH: checks on every host first, then Ray."""
    from slimeforge import cluster

    if dry_run:
        print("\n".join(cluster.up(inventory, dry_run=True, nccl_check=nccl_check)))
        return
    addr = cluster.up(inventory, nccl_check=nccl_check)
    print(f"cluster is up: GCS {addr.gcs}, dashboard and Jobs API {addr.dashboard}")
    print(f"launch on it: invoke run RECIPE --cluster {inventory}")


@task(positional=["inventory"], help={"inventory": "cluster inventory YAML", "as_json": "print JSON"})
@clean_errors
def cluster_status(c, inventory, as_json=False):
    """Show each host of a cluster: our Ray process, its node, GPUs (Ray / nvidia-smi), Python and Ray versions."""
    from slimeforge import cluster

    rows = cluster.status(inventory)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cluster {inventory}", title_justify="left")
    columns = ["host", "role", "address", "node_ip", "ray_process", "node", "gpus_ray", "gpus_seen", "python", "ray", "error"]
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if row.get(col) is None else str(row[col]) for col in columns))
    Console().print(table)


@task(positional=["inventory"], help={"inventory": "cluster inventory YAML"})
@clean_errors
def cluster_down(c, inventory):
    """Stop the Ray processes that cluster.up started on the inventory's hosts, and nothing else."""
    from slimeforge import cluster

    cluster.down(inventory)


ns = Collection()
ns.add_collection(Collection("stack", show=stack_show))
ns.add_collection(Collection("run", start=run_start))
ns.add_collection(Collection("cluster", up=cluster_up, status=cluster_status, down=cluster_down))
