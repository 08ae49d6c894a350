"""slimeforge's command line: thin invoke tasks over the `slimeforge` package, run two ways: the
installed `slimeforge` command (`main`, from any directory) and `invoke TASK` in a checkout (its
tasks/ package re-exports this module's `ns` for Invoke).

Each task parses its options, calls one library function and prints the outcome; the functions work without invoke (the
SlimeRunner API uses the same ones). Beside it: clihelp.py (invoke's parser and help as people expect them),
clioptions.py (option values resolved; clean_errors, an error as its exit status) and cliviews.py (what the tasks print,
as text or a --json document). Heavy libraries (ray, boto3, docker) are imported inside the functions that need them, so
`invoke --list` and dry runs start fast (benchmarks/start_bench.py): this module imports Invoke and slimeforge's small
core only.
"""

from __future__ import annotations

import contextlib
import sys
import textwrap

from invoke import Collection, Exit

from slimeforge import clihelp, paths
from slimeforge.clihelp import task
from slimeforge.clioptions import clean_errors, cluster_jobs_api, count, inventory_of, jobs_api_of
from slimeforge.console import diag, json_doc, shell_lines
from slimeforge.errors import SlimeforgeError

JSON_HELP = "print the result as one JSON document (its schema: docs/json.md); diagnostics stay on stderr"


# --- stack -----------------------------------------------------------------------------------


@task(help={"cuda": "stack flavor (cu13, cu129) or a stack YAML path", "json_": JSON_HELP})
@clean_errors
def stack_show(c, cuda="cu13", json_=False):
    """Print a stack's resolved pins and ordered install steps."""
    from slimeforge.cliviews import stack_view

    print(stack_view(cuda, json_))


# An ssh config the inventory may not name (one with ProxyCommand, Match exec, forwarding, ...):
# the user's own, passed by the user (docs/cluster.md#ssh).
SSH_CONFIG_HELP = "your own ssh config file for the hosts (ssh -F), used as is in place of the inventory's ssh.config"


# --- run -------------------------------------------------------------------------------------


@task(
    positional=["recipe"],
    iterable=["set_", "skip_check"],
    help={
        "recipe": "recipe YAML, e.g. recipes/gsm8k.yaml",
        "dry_run": "validate and render the run directory, print the plan, start nothing",
        "out": "run directory (default runs/<exp_id>)",
        "set_": "override a recipe key, key=value (repeatable)",
        "address": "submit to a running Ray cluster (its dashboard, http://HOST:8265) instead of starting a head",
        "mode": "host (a prefix `invoke install` made, or checkouts) or container (the recipe's image); default: the "
                "recipe's",
        "image": "container mode: the image to run (default: the recipe's image); any slime image, "
                 "docs/run.md#any-slime-image",
        "prefix": "host mode: the install prefix (slime, Megatron-LM and the venv come from there)",
        "catalog": "the flag catalog (flags.json) to check flags against (default: from the image or install)",
        "skip_check": "turn this preflight check's errors into warnings (repeatable; see `invoke doctor "
                      "--list-checks`)",
        "no_network": "leave out the checks that need the network (AWS, the cluster)",
        "cluster": "launch on the cluster of this inventory (brought up with cluster.up; default: the recipe's "
                   "cluster)",
        "ssh_config": SSH_CONFIG_HELP,
        "tunnel": "--cluster: reach the Jobs API through an ssh tunnel to the head even when it answers directly "
                  "(default: only when not; docs/cluster.md#ports)",
        "slurm": "submit to Slurm: Ray starts inside an sbatch allocation (docs/slurm.md)",
        "partition": "--slurm: the partition (default: the cluster's default)",
        "account": "--slurm: the account to charge",
        "time": "--slurm: the time limit, [D-]HH:MM:SS",
        "nodes": "--slurm: nodes (default: the recipe's num_nodes)",
        "squashfs_dir": "--slurm, container mode: import the image once to a squashfs in this shared directory; every "
                        "node reads it",
        "json_": "with --dry-run: " + JSON_HELP,
        "detach": "--cluster/--address: return once the job runs, printing how to follow, inspect and stop it (Ctrl-C "
                  "while following detaches too)",
        "max_restarts": "--cluster: resubmit the run, resuming from its checkpoint, when a node or the head was lost "
                        "(up to N times; default: the recipe's max_restarts, 0)",
    },
    default=True,
)
@clean_errors
def run_start(c, recipe, dry_run=False, out=None, set_=None, address=None, mode=None, image=None, prefix=None,
              catalog=None, skip_check=None, no_network=False, cluster=None, slurm=False, partition=None,
              account=None, time=None, nodes=None, squashfs_dir=None, ssh_config=None, json_=False, tunnel=False,
              detach=False, max_restarts=None):
    """Validate a recipe, preflight, start Ray, submit, stream the logs (--dry-run: print the plan, start nothing)."""
    from slimeforge.run.launch import LaunchRequest, run_recipe

    if json_ and not dry_run:
        raise Exit("error: --json: the plan is printed as JSON by a dry run; add --dry-run (a launch streams the "
                   "job's logs)", code=2)
    req = LaunchRequest(recipe=recipe, out=out, overrides=tuple(set_ or ()), address=address, mode=mode, image=image,
                        prefix=prefix, catalog=catalog, skip_checks=tuple(skip_check or ()),
                        network_checks=not no_network, cluster=cluster, slurm=slurm, partition=partition,
                        account=account, time=time, nodes=None if nodes is None else str(nodes),
                        squashfs_dir=squashfs_dir, detach=detach, max_restarts=count("--max-restarts", max_restarts))
    with contextlib.ExitStack() as tunnels:  # an ssh tunnel to the Jobs API lives until the job's logs end
        code = run_recipe(req, dry_run=dry_run, plan_json=json_,
                          find_cluster=lambda inventory, dry: cluster_jobs_api(inventory, dry, ssh_config,
                                                                               "always" if tunnel else None, tunnels))
    if code:
        raise Exit(code=code)


# --- launch ----------------------------------------------------------------------------------

RUN_HELP = {"run": "the run directory or the recipe that was launched, e.g. runs/gsm8k-3b-smoke; with "
                   "--cluster/--address: the exp_id or submission id of a job on that cluster",
            "cluster": "find the job on the cluster of this inventory, from any machine (RUN: its exp_id or "
                       "submission id)",
            "address": "find the job on the Ray cluster at this address, http://HEAD:8265 (RUN: its exp_id or "
                       "submission id)",
            "ssh_config": SSH_CONFIG_HELP}


@task(positional=["run"], help={**RUN_HELP, "json_": JSON_HELP})
@clean_errors
def run_status(c, run, json_=False, cluster=None, address=None, ssh_config=None):
    """Status of a launched run's job (and whether the Ray head slimeforge started is up; a Slurm run: its job).
    With --cluster/--address: the job found on that cluster by its exp_id or submission id, from any machine."""
    from slimeforge.cliviews import status_view
    from slimeforge.run.launch import run_dir_of, target_of

    api = jobs_api_of(cluster, address, ssh_config)
    if api is not None:
        from slimeforge.run.targets.jobs import remote_status

        st = remote_status(api, run)
        print(status_view("ray-job", st.data, st.lines, json_))
        return
    path = run_dir_of(run)
    target = target_of(path)
    st = target.status(path)
    print(status_view("slurm" if target.name == "slurm" else "ray-job", st.data, st.lines, json_))


@task(positional=["run"], help={**RUN_HELP,
                                "follow": "keep streaming until the job ends (Ctrl-C stops following, never the job)"})
@clean_errors
def run_logs(c, run, follow=False, cluster=None, address=None, ssh_config=None):
    """Print a launched run's job logs (from the cluster; job.log keeps them too; a Slurm run: its output file).
    With --cluster/--address: the job found on that cluster by its exp_id or submission id, from any machine."""
    from slimeforge.run.launch import run_dir_of, target_of

    api = jobs_api_of(cluster, address, ssh_config)
    try:
        if api is not None:
            from slimeforge.run.targets.jobs import remote_logs

            code = remote_logs(api, run, follow, sys.stdout, lambda text: print(text, file=sys.stderr))
        else:
            path = run_dir_of(run)
            code = target_of(path).logs(path, follow, sys.stdout)
    except KeyboardInterrupt:  # the user stopped reading: done, and the job goes on
        print("\n[slimeforge] stopped following; the job goes on (`invoke run.stop` stops it)", file=sys.stderr)
        return
    if code:
        raise Exit(code=code)


@task(positional=["run"], help={**RUN_HELP,
                                "head": "also stop the Ray head (and container) that slimeforge started for it"})
@clean_errors
def run_stop(c, run, head=False, cluster=None, address=None, ssh_config=None):
    """Stop a launched run's job; --head also stops the Ray head (or container) slimeforge started for it.
    Each is first proved to be this run's; anything else is refused. A Slurm run: scancel of its
    recorded job, proved to be this run's (Ray in the allocation ends with it). Exit 0 when what was
    asked for was stopped or had already ended; 1 with the reason otherwise. With --cluster/--address:
    the job found on that cluster by its exp_id or submission id (proved slimeforge's by its metadata)."""
    from slimeforge.run.launch import run_dir_of, target_of

    api = jobs_api_of(cluster, address, ssh_config)
    if api is not None:
        from slimeforge.run.targets.jobs import remote_stop

        if head:
            raise Exit("error: --head stops a head slimeforge started for a run on this machine; a cluster's head: "
                       "`invoke cluster.down`", code=2)
        code = remote_stop(api, run)
        if code:
            raise Exit(code=code)
        return
    path = run_dir_of(run)
    code = target_of(path).stop(path, head=head)
    if code:
        raise Exit(code=code)


@task(
    positional=["recipe"],
    may_omit=["recipe"],
    iterable=["skip_check", "set_"],
    help={
        "recipe": "check this recipe too (model vs config.json, data, checkpoint dir, flags, AWS), e.g. "
                  "recipes/gsm8k.yaml; without: host checks only",
        "set_": "override a recipe key, key=value (repeatable)",
        "cuda": "without a recipe: the stack whose driver and architectures to check (default cu13)",
        "address": "the running cluster to compare Ray and Python versions with",
        "mode": "host or container (default: the recipe's)",
        "image": "container mode: the image (its flag catalog and model scripts)",
        "prefix": "host mode: the install prefix",
        "catalog": "the flag catalog (flags.json)",
        "skip_check": "turn this check's errors into warnings (repeatable)",
        "no_network": "leave out the checks that need the network",
        "list_checks": "list the checks and exit",
        "kernels": "also run every compiled piece on this host's GPU (the install's or image's kernel check; seconds "
                   "per piece)",
        "json_": JSON_HELP,
    },
)
@clean_errors
def doctor(c, recipe=None, set_=None, cuda=None, address=None, mode=None, image=None, prefix=None, catalog=None,
           skip_check=None, no_network=False, list_checks=False, kernels=False, json_=False):
    """Preflight: report every problem (with its fix) that would stop a launch, before anything starts."""
    from slimeforge.run import preflight as doc

    if list_checks:
        from slimeforge.cliviews import checks_view

        print(checks_view(json_))
        return
    report = doc.doctor(recipe, list(set_ or ()), cuda=cuda, address=address, mode=mode, image=image, prefix=prefix,
                        catalog=catalog, skip=list(skip_check or ()), network=not no_network, gpu_checks=kernels)
    print(json_doc("slimeforge.doctor/1", report.to_json()) if json_ else report.table())
    if report.errors:
        raise Exit(code=2)  # a refused precondition (docs/exit-codes.md)


# --- publish ---------------------------------------------------------------------------------


@task(
    iterable=["tag"],
    help={
        "cuda": "publish the newest build of this flavor (build/<flavor>-<hash>/report.json)",
        "image": "publish any local image instead (REF); its record goes to --record or stdout",
        "registry": "destination REGISTRY[/REPOSITORY]; an ECR host (<account>.dkr.ecr.<region>.amazonaws.com) uses "
                    "ECR",
        "build_dir": "a build directory, or a directory holding <flavor>-* builds (default build/)",
        "tag": "with --image: a tag to push (repeatable; the image's own tag is pushed too)",
        "record": "with --image: write the publish record (JSON) to this file",
        "username": "registry user; the password comes from --password-stdin or --password-env",
        "password_stdin": "read the password from standard input",
        "password_env": "read the password from this environment variable",
        "ecr_endpoint": "ECR API endpoint URL (default: AWS's, or AWS_ENDPOINT_URL_ECR)",
        "ecr_push_host": "push to this registry host instead of ECR's own (a test registry)",
        "tag_immutability": "ECR: create a missing repository with immutable tags (--no-tag-immutability: mutable)",
        "scan_on_push": "ECR: create a missing repository with scan on push (--no-scan-on-push: off)",
        "compression": "layer compression: gzip (default; every runtime reads it) or zstd (faster to unpack; "
                       "docs/publish.md)",
        "dry_run": "print what would be pushed where, push nothing",
    },
)
@clean_errors
def publish(c, cuda=None, image=None, registry=None, build_dir=None, tag=None, record=None, username=None,
            password_stdin=False, password_env=None, ecr_endpoint=None, ecr_push_host=None,
            tag_immutability=True, scan_on_push=True, dry_run=False, compression="gzip"):
    """Push an image to a registry or ECR by digest, verify it there, and record the digest."""
    from slimeforge.image.publish import publish as pub

    opts = pub.PublishOptions(cuda=cuda, image=image, registry=registry, build_dir=build_dir, tags=tag or [],
                              record=record, username=username, password_stdin=password_stdin,
                              password_env=password_env, ecr_endpoint=ecr_endpoint, ecr_push_host=ecr_push_host,
                              tag_immutability=tag_immutability, scan_on_push=scan_on_push, compression=compression)
    plan = pub.plan(opts)
    if dry_run:
        print("\n".join(pub.describe(plan)))
        # What the publish checks first, the dry run checks too: the local image is there (exit 2 if not).
        print(f"local image: {plan.source.image} is {pub.local_image(plan)}")
        print("nothing was pushed (dry run)")
        return
    pub.publish(plan, pub.read_credentials(plan, sys.stdin))


# --- lock ------------------------------------------------------------------------------------


@task(
    iterable=["source"],
    help={
        "cuda": "stack flavor (cu13, cu129)",
        "stack": "lock any stack file instead (a YAML path); its lock goes to locks/ beside it",
        "source": "NAME=PATH: a local checkout of a source (the patches are read from slime's), instead of fetching it",
        "all": "lock every flavor under images/",
        "check": "offline: the committed lock satisfies every pin, holds every step's packages, mixes no CUDA majors",
        "complete": "fill only the outside facts the committed lock lacks (router wheel sha256, base digest); "
                    "resolves nothing",
        "upgrade": "resolve at a new cutoff (now) instead of the lock's: what no pin names moves to its newest",
        "base_digest": "sha256:... of the base image (else asked of its registry)",
        "router_sha256": "sha256 of the router wheel (else downloaded once and hashed)",
        "index_url": "an index instead of PyPI (a mirror)",
    },
)
@clean_errors
def lock(c, cuda=None, stack=None, all=False, check=False, complete=False, upgrade=False, base_digest=None,  # noqa: A002
         router_sha256=None, index_url=None, source=None):
    """Resolve a flavor into its lock, images/locks/pylock.<flavor>.toml.

    --check verifies the committed lock; --complete fills what it lacks from outside, resolving nothing."""
    from slimeforge.image.lock import lockcheck, lockfacts, uvlock
    from slimeforge.image.stack import available_flavors

    if sum((check, complete, upgrade)) > 1:
        raise Exit("error: --check, --complete and --upgrade exclude each other; give one", code=2)
    if (check or complete) and (index_url or source):
        raise Exit("error: --index-url and --source go with a resolution, not with --check or --complete", code=2)
    refs = available_flavors() if all else [stack or cuda or "cu13"]
    failed: dict[str, int] = {}  # flavor -> its error's exit status
    for ref in refs:
        try:
            if check:
                lockcheck.check(ref, echo=lambda s: print(s, flush=True))
            elif complete:
                lockfacts.complete(ref, echo=diag, base_digest=base_digest, router_sha256=router_sha256)
            else:
                uvlock.resolve(uvlock.LockOptions(stack=ref, base_digest=base_digest, router_sha256=router_sha256,
                                                  index_url=index_url, sources=list(source or []), upgrade=upgrade,
                                                  echo=diag))
        except SlimeforgeError as exc:
            if len(refs) == 1:
                raise
            print(f"error: {exc}", file=sys.stderr, flush=True)
            failed[ref] = exc.exit_code
    if failed:
        raise Exit(f"error: {', '.join(failed)}: see above", code=max(failed.values()))


# --- build -----------------------------------------------------------------------------------


@task(
    iterable=["source", "build_arg", "tag"],
    help={
        "cuda": "stack flavor (cu13, cu129)",
        "stack": "build any stack file instead (a YAML path)",
        "out": "build directory (default build/<flavor>-<hash>/)",
        "dry_run": "render the build directory, print the exact command, build nothing",
        "base_image": "base image REF instead of the stack's (resolved to a digest or image id)",
        "source": "NAME=PATH: a local checkout instead of the source's git URL (repeatable)",
        "build_arg": "KEY=VALUE for docker build, e.g. MAX_JOBS=4 (repeatable)",
        "no_cache": "build without BuildKit's layer cache (even when an image with this content hash exists)",
        "force": "build even when an image with this content hash exists",
        "verify": "smoke-test an image with this content hash that exists again (it is not rebuilt)",
        "tag": "an extra tag: a full REF, or a tag for the repository (repeatable)",
        "repository": "image repository (default slimeforge/<flavor>)",
        "ca_bundle": "CA bundle for downloads during the build (default: $SSL_CERT_FILE)",
        "no_store": "compile the compiled steps in place, without the compiled-wheel store",
        "wheel_registry": "also pull compiled wheels missing here from REGISTRY (see wheels.pull)",
        "verbose": "also show BuildKit's raw output (build.log in the build directory has it always)",
    },
)
@clean_errors
def build(c, cuda="cu13", stack=None, out=None, dry_run=False, base_image=None, source=None, build_arg=None,
          no_cache=False, force=False, tag=None, repository=None, ca_bundle=None, no_store=False, wheel_registry=None,
          verbose=False, verify=False):
    """Build the image of a stack with BuildKit: content-addressed, patched, smoke-tested, reported."""
    from pathlib import Path

    from slimeforge.image.builder.build import BuildDryRun, BuildOptions
    from slimeforge.image.builder.build import build as run_build

    opts = BuildOptions(stack=stack or cuda, out=Path(out) if out else None, dry_run=dry_run, base_image=base_image,
                        sources=list(source or []), build_args=list(build_arg or []), no_cache=no_cache, force=force,
                        tags=list(tag or []), repository=repository, ca_bundle=ca_bundle, echo=diag,
                        use_store=not no_store, wheel_registry=wheel_registry, verbose=verbose, verify=verify)
    result = run_build(opts)  # progress went to stderr (diag); the result goes to stdout
    if isinstance(result, BuildDryRun):
        print("would run:\n" + textwrap.indent(shell_lines(result.command, result.env, trailing=1), "  "))
    else:
        print(result.summary_table())


@task(help={
    "python": "the target interpreter: one that imports slime (e.g. /opt/venv/bin/python); no GPU needed",
    "slime": "slime checkout",
    "megatron": "Megatron-LM checkout (what slime's Megatron parser is built from)",
    "out": "catalog file to write (JSON, replaced whole)",
})
@clean_errors
def flags_catalog(c, python="", slime="", megatron=None, out="flags.json"):
    """The flag catalog from slime's real parsers (every one, each option with its parser), as doctor reads it."""
    from slimeforge.run.flagcatalog import make_catalog, summary

    print(summary(make_catalog(python, slime, megatron, out)))
    print(f"wrote {out}")


@task(help={
    "src": "the GSM8K file you downloaded: JSONL, or Parquet (needs pyarrow), rows {question, answer}",
    "out": "training data to write (JSONL of {prompt, metadata}, replaced whole)",
    "limit": "only the first N rows (a small set for a smoke run)",
})
@clean_errors
def data_gsm8k(c, src="", out="gsm8k.jsonl", limit=None):
    """GSM8K rows as training data: one {"prompt", "metadata": {"prompt", "answer"}} a line (docs/quickstart.md)."""
    from slimeforge.run.gsm8k import convert
    from slimeforge.schema import parse_whole

    rows = convert(src, out, None if limit is None else parse_whole(limit, "--limit", 1, 1_000_000))
    print(f"wrote {out}: {rows} rows")


@task(
    iterable=["source"],
    help={"cuda": "stack flavor (cu13, cu129)", "stack": "any stack file instead (a YAML path)",
          "source": "NAME=PATH: a local checkout of a source (repeatable); others are fetched by their git URL"},
)
@clean_errors
def patches_check(c, cuda="cu13", stack=None, source=None):
    """Check, without Docker and without touching the given checkouts, that every patch applies."""

    from slimeforge.image.patches import check_patches
    from slimeforge.image.sources import parse_sources
    from slimeforge.image.stack import load_stack

    st = load_stack(stack or cuda)
    rows = check_patches(st, parse_sources(st, list(source or [])), paths.sources_cache())
    print(f"patches of {st.id}: {len(rows)} checked, all apply")


@task(
    iterable=["source"],
    help={
        "cuda": "stack flavor (cu13, cu129)",
        "stack": "any stack file instead (a YAML path)",
        "prefix": "install directory (checkouts, venv, records, stack.lock.json, flags.json)",
        "venv": "reuse this venv instead of <prefix>/venv",
        "python": "the interpreter to make the venv with (a path, or a name on PATH; default python<ver> of the stack)",
        "min_free_gb": "free disk (GiB) the prerequisites ask for at the prefix (default: computed from the lock)",
        "source": "NAME=PATH: a local checkout instead of the source's git URL (repeatable)",
        "out": "where to write install.sh (default <prefix>/.slimeforge/install/)",
        "dry_run": "render the script, print its path, run nothing",
        "no_store": "compile the compiled steps in place, without the compiled-wheel store",
        "verify": "run the smoke test even when it passed before with the same inputs (a re-run skips it)",
    },
)
@clean_errors
def install(c, cuda="cu13", stack=None, prefix="", venv=None, python=None, min_free_gb=None, source=None, out=None,
            dry_run=False, no_store=False, verify=False):
    """Install a stack on this host (bare metal), resumably, with the image's steps and checks."""
    from pathlib import Path

    from slimeforge.image.builder.install import MAX_FREE_GIB, InstallOptions
    from slimeforge.image.builder.install import install as run_install
    from slimeforge.schema import parse_whole

    # The one number parser (ASCII digits, bounded): the script's bash reads the value again.
    free = (parse_whole(str(min_free_gb), "--min-free-gb", 0, MAX_FREE_GIB, unit="GiB")
            if min_free_gb is not None else None)
    opts = InstallOptions(stack=stack or cuda, prefix=prefix, venv=venv, python=python, min_free_gb=free,
                          sources=list(source or []), out=Path(out) if out else None, dry_run=dry_run,
                          use_store=not no_store, verify=verify)
    run_install(opts)


# --- compiled-wheel store --------------------------------------------------------------------

WHEELS_HELP = {"cuda": "stack flavor (cu13, cu129)", "stack": "any stack file instead (a YAML path)",
               "registry": "OCI registry host[:port][/path] of the remote store (ECR: docker login to it first)"}


@task(iterable=["source", "build_arg"], help={**WHEELS_HELP,
                                              "registry": "pull misses from this registry before compiling",
                                              "source": "NAME=PATH: a local checkout (repeatable)",
                                              "build_arg": "KEY=VALUE for docker build, e.g. MAX_JOBS=4 (repeatable)",
                                              "dry_run": "say what would be compiled, compile nothing",
                                              "verbose": "also show BuildKit's raw output (wheels.log has it always)"})
@clean_errors
def wheels_build(c, cuda="cu13", stack=None, registry=None, source=None, build_arg=None, dry_run=False, verbose=False):
    """Compile only the compiled steps whose key is not stored (MAX_JOBS from this host's memory), and store them."""
    from slimeforge.image.builder.build import BuildOptions, build_wheels

    opts = BuildOptions(stack=stack or cuda, sources=list(source or []), build_args=list(build_arg or []),
                        dry_run=dry_run, wheel_registry=registry, echo=diag, verbose=verbose)
    result = build_wheels(opts)
    for step, r in result.items():
        print(f"{step:<24} {r.source:<14} {r.key}")


@task(help=WHEELS_HELP)
@clean_errors
def wheels_push(c, cuda="cu13", stack=None, registry=""):
    """Push this stack's stored compiled wheels to REGISTRY/slimeforge-compiled:<key>."""
    from slimeforge.image.stack import load_stack
    from slimeforge.image.wheels.wheelstore import push_stack

    for step, what in push_stack(load_stack(stack or cuda), registry, echo=diag).items():
        print(f"{step:<24} {what}")


@task(help=WHEELS_HELP)
@clean_errors
def wheels_pull(c, cuda="cu13", stack=None, registry=""):
    """Pull the compiled wheels this stack needs and this host lacks from REGISTRY (verified by sha256)."""
    from slimeforge.image.stack import load_stack
    from slimeforge.image.wheels.wheelstore import pull_stack

    for step, what in pull_stack(load_stack(stack or cuda), registry, echo=diag).items():
        print(f"{step:<24} {what}")


@task(iterable=["stack"], help={"cuda": "stack flavor (cu13, cu129)",
                                "stack": "a stack file (repeatable; with --unused: also counted as used)",
                                "unused": "list the stored keys that no stack uses (images/*.yaml and --stack files)",
                                "registry": "also say which keys this registry has (credentials: the docker config)",
                                "json_": JSON_HELP})
@clean_errors
def wheels_ls(c, cuda="cu13", stack=None, unused=False, registry=None, json_=False):
    """Compiled keys of a stack: hit or miss here, where each is stored, its size."""
    from slimeforge.cliviews import wheels_view

    print(wheels_view(cuda, list(stack or []), unused=unused, registry=registry, as_json=json_))


# --- cluster ---------------------------------------------------------------------------------


@task(
    positional=["inventory"],
    help={
        "inventory": "cluster inventory YAML, e.g. recipes/clusters/example.yaml",
        "dry_run": "print the per-host plan; connect to nothing, start nothing",
        "nccl_check": "also run an NCCL all-reduce across each host's GPUs and report bus bandwidth",
        "ssh_config": SSH_CONFIG_HELP,
    },
)
@clean_errors
def cluster_up(c, inventory, dry_run=False, nccl_check=False, ssh_config=None):
    """Bring up a Ray cluster on the inventory's hosts over SSH: checks on every host first, then Ray."""
    from slimeforge.cluster import raycluster as cluster

    inv = inventory_of(inventory, ssh_config)
    if dry_run:
        print("\n".join(cluster.plan(inv, nccl_check=nccl_check)))
        return
    addr = cluster.up(inv, nccl_check=nccl_check)
    print(f"cluster is up: GCS {addr.gcs}, dashboard and Jobs API {addr.dashboard}")
    with_config = f" --ssh-config {ssh_config}" if ssh_config else ""
    print(f"launch on it: {clihelp.PROGRAM} run RECIPE --cluster {inventory}{with_config}")


@task(positional=["inventory"], help={"inventory": "cluster inventory YAML, e.g. recipes/clusters/example.yaml",
                                      "json_": JSON_HELP, "ssh_config": SSH_CONFIG_HELP})
@clean_errors
def cluster_status(c, inventory, json_=False, ssh_config=None):
    """Show each host of a cluster: our Ray process, its node, GPUs (Ray / nvidia-smi), Python and Ray versions."""
    from slimeforge.cluster.statustable import check_answered, print_table, status

    rows = status(inventory_of(inventory, ssh_config))
    if json_:
        print(json_doc("slimeforge.cluster-status/1", {"inventory": inventory, "hosts": rows}))
    else:
        print_table(f"cluster {inventory}", rows)
    check_answered(inventory, rows)  # a host that does not answer: exit 2, after the whole report (docs/exit-codes.md)


@task(positional=["inventory"], help={"inventory": "cluster inventory YAML, e.g. recipes/clusters/example.yaml",
                                      "ssh_config": SSH_CONFIG_HELP})
@clean_errors
def cluster_down(c, inventory, ssh_config=None):
    """Stop only the Ray processes that cluster.up started on the inventory's hosts (each proved ours on its host)."""
    from slimeforge.cluster import raycluster as cluster

    cluster.down(inventory_of(inventory, ssh_config))


ns = Collection()
ns.add_collection(Collection("stack", show=stack_show))
ns.add_collection(Collection("run", start=run_start, status=run_status, logs=run_logs, stop=run_stop))
ns.add_task(doctor)
ns.add_task(publish)
ns.add_collection(Collection("patches", check=patches_check))
ns.add_collection(Collection("flags", catalog=flags_catalog))
ns.add_collection(Collection("data", gsm8k=data_gsm8k))
ns.add_task(lock)
ns.add_task(build)
ns.add_task(install)
ns.add_collection(Collection("wheels", build=wheels_build, push=wheels_push, pull=wheels_pull, ls=wheels_ls))
ns.add_collection(Collection("cluster", up=cluster_up, status=cluster_status, down=cluster_down))


def main() -> None:
    """The `slimeforge` command ([project.scripts]): these tasks, their options and help, through
    invoke's Program, from any directory. Recipes, inventories and --out are read relative to the
    working directory; runs/ and build/ are made there (paths.RUNS, paths.BUILDS); the stacks and
    templates come with the package (paths.IMAGES, paths.TEMPLATES)."""
    from slimeforge import __version__

    clihelp.run_program(ns, "slimeforge", __version__)
