"""Recipes: SlimeRunner's constructor fields plus run options, loaded from YAML and validated.

A YAML dump of SlimeRunner's keyword arguments is a recipe; the run options have defaults, so the
seed's examples work unchanged. Every check runs before anything is written, and all problems are
reported together, each naming the field, the value and what is accepted.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from ..errors import ConfigError, Problem
from ..image.imageref import image_ref_problems
from ..image.stack import Stack
from ..schema import ENV_NAME_RE, Model, Worded, did_you_mean, secret_name, secret_value, whole_problem
from ..yamlio import deep_merge, load_with_extends, parse_set, parse_yaml
from .slime_facts import load_facts, model_types_in

# Names and defaults exactly as the seed's SlimeRunner (shared/reference/seeds/slimerunner-api.txt).
RUNNER_FIELDS: dict[str, object] = {
    "exp_id": ...,
    "agent_runtime_arn": ...,
    "s3_bucket": ...,
    "model_dir": ...,
    "data_path": ...,
    "model_type": ...,
    "num_gpus": 8,
    "tp_size": 2,
    "rollout_gpus_per_engine": 2,
    "slime_dir": "/root/slime",
    "megatron_dir": "/root/Megatron-LM",
    "model_id": "default",
    "acr_timeout": 900,
    "acr_tps_limit": 25,
    "max_concurrent": 100,
    "gateway_port": 9090,
    "reward_postprocessing": "grpo",
    "rollout_batch_size": 32,
    "n_samples_per_prompt": 8,
    "rollout_max_response_len": 1024,
    "rollout_temperature": 1.0,
    "lr": 1e-06,
    "eps_clip": 0.2,
    "eps_clip_high": 0.28,
    "weight_decay": 0.1,
    "adam_beta2": 0.98,
    "sglang_mem_fraction_static": 0.7,
    "max_tokens_per_gpu": 9216,
    "wandb_project": None,
    "wandb_group": None,
    "extra_flags": [],
}

EXP_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# arn:aws:bedrock-agentcore:<region>:<12-digit account>:runtime/<runtime id>
ARN_RE = re.compile(r"arn:aws(-[a-z]+)*:bedrock-agentcore:[a-z]{2}(-[a-z]+)+-[0-9]:[0-9]{12}:"
                    r"runtime/[A-Za-z][A-Za-z0-9_]{0,99}-[A-Za-z0-9]{10}")
# Names passed to slime or the toolkit as a flag's value: never starting with '-' (argparse would
# read "--lr" as the next option) and in the alphabet of what they name.
LABEL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")  # wandb project/group, eval data names
MODEL_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:/-]{0,255}")  # "default", or a Bedrock model id
# One extra_flags item is a flag (`--name`, `--name=value`) or one value of the flag before it.
FLAG_RE = re.compile(r"--[a-z0-9]+(?:-[a-z0-9]+)*")
NUMBER_RE = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
MAX_GPUS_PER_HOST = 64
MAX_NODES = 4096
MAX_COUNT = 1 << 31  # batch sizes, lengths, counts, timeouts: anything larger is a typo
REWARD_POSTPROCESSING = ("grpo", "none")
# Where a run's data, model or checkpoints never live: a checkpoint_dir of / or /etc is written
# into (and mounted read-write into the container); a model_dir of /proc is not a model.
SYSTEM_DIRS = ("/etc", "/usr", "/proc", "/sys", "/dev", "/boot")
# A mount (docker -v SRC:DST:MODE, pyxis's SRC:DST[:ro],...) splits its value at ':' and ','.
MOUNT_SEPARATORS = (":", ",")
# Environment slimeforge itself sets for the job or launch.sh reads: a recipe's env may not
# replace it (RAY_ADDRESS would point the job at another cluster; SLIMEFORGE_RUN_TOKEN names the
# launch that run.stop proves; PATH and PYTHONPATH choose what runs). LD_LIBRARY_PATH and CUDA_HOME
# are merged with slimeforge's (flags.runtime_env_vars), not replaced: they stay allowed.
RESERVED_ENV = frozenset({"PATH", "PYTHONPATH", "PYTHONHOME", "HOME", "LD_PRELOAD", "RAY_ADDRESS",
                          "CUDA_VISIBLE_DEVICES",
                          "CUDA_DEVICE_MAX_CONNECTIONS", "CUDNN_HOME", "CUDNN_PATH", "CUDNN_FRONTEND_CUDART_LIB_NAME",
                          "WANDB_ENTITY"})
RESERVED_ENV_PREFIXES = ("SLIMEFORGE_", "SF_", "SLURM_")
# The keys each rule's problem (by the key it names) is computed from, besides that key: where one
# of them failed the schema (its bounds too), the rule ran on a stand-in value and its problem is
# dropped (recipecheck.trusted), so one cause gives one problem. The cluster's fit (cluster/runcheck.py
# static) names num_nodes for num_nodes x num_gpus.
_BATCH = ("rollout_batch_size", "n_samples_per_prompt", "num_steps_per_rollout", "num_gpus", "num_nodes", "tp_size")
RELATED: dict[str, tuple[str, ...]] = {
    "tp_size": ("num_gpus",), "rollout_gpus_per_engine": ("num_gpus", "num_nodes"), "num_nodes": ("num_gpus",),
    "rollout_batch_size": _BATCH, "num_steps_per_rollout": _BATCH,
    "max_tokens_per_gpu": ("rollout_max_response_len", "extra_flags"), "model_type": ("slime_dir", "stack"),
    "ports": ("gateway_port", "ray_dashboard_port", "ray_port"), "install_prefix": ("mode", "slime_dir"),
    "image": ("mode",), "secret_env": ("env",), "extra_flags": ("stack",),
}


# The bounds of the numbers (pydantic checks them with the schema; Worded says how a refusal reads).
# The GPU and batch rules divide by these: a value out of range fails the schema, so the rules only
# ever see one in range (its own or its default's: recipecheck's stand-in).
_POSITIVE = Worded("must be a positive integer")
Count = Annotated[int, Field(ge=1, le=MAX_COUNT), _POSITIVE]  # batch sizes, lengths, counts, timeouts
GPUsPerHost = Annotated[int, Field(ge=1, le=MAX_GPUS_PER_HOST), _POSITIVE]
GPUsPerEngine = Annotated[int, Field(ge=1, le=MAX_GPUS_PER_HOST * MAX_NODES), _POSITIVE]  # an engine may span hosts
Nodes = Annotated[int, Field(ge=1, le=MAX_NODES), _POSITIVE]
Port = Annotated[int, Field(ge=1, le=65535), Worded("is not a TCP port")]
ToolkitPort = Annotated[int, Field(ge=0, le=65535), Worded("is not a TCP port", "(0 lets the toolkit choose)")]
Positive = Annotated[float, Field(gt=0), Worded("must be greater than 0")]
NonNegative = Annotated[float, Field(ge=0), Worded("must not be negative")]


def host_path_problem(path: str) -> str | None:
    """Why `path` cannot be a run's model, data or checkpoint path, or None: not absolute, `/` or
    a system directory (or under one), or a ':' or ',' where it becomes a container mount."""
    if not path.startswith("/"):
        return "must be an absolute path (it is read on every cluster host)"
    norm = os.path.normpath(path)
    norm = "/" + norm.lstrip("/")  # normpath keeps a leading '//'
    if norm == "/":
        return "is the root directory; a run never reads or writes the whole host"
    if any(norm == d or norm.startswith(d + "/") for d in SYSTEM_DIRS):
        return f"is under a system directory ({', '.join(SYSTEM_DIRS)}); a run's files never live there"
    if bad := [c for c in MOUNT_SEPARATORS if c in path]:
        return (f"holds {' and '.join(repr(c) for c in bad)}, which splits a container mount "
                "(docker -v, pyxis --container-mounts)")
    return None


def reserved_env(name: str) -> bool:
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)


class Recipe(Model):
    # --- SlimeRunner: required ---
    exp_id: str
    agent_runtime_arn: str
    s3_bucket: str
    model_dir: str
    data_path: str
    model_type: str
    # --- SlimeRunner: cluster ---
    num_gpus: GPUsPerHost = 8
    tp_size: GPUsPerHost = 2
    rollout_gpus_per_engine: GPUsPerEngine = 2
    slime_dir: str = "/root/slime"
    megatron_dir: str = "/root/Megatron-LM"
    # --- SlimeRunner: AgentCore / toolkit ---
    model_id: str = "default"
    acr_timeout: Count = 900
    acr_tps_limit: Count = 25
    max_concurrent: Count = 100
    gateway_port: ToolkitPort = 9090
    reward_postprocessing: str = "grpo"
    # --- SlimeRunner: training hyperparameters ---
    rollout_batch_size: Count = 32
    n_samples_per_prompt: Count = 8
    rollout_max_response_len: Count = 1024
    rollout_temperature: Positive = 1.0
    lr: Positive = 1e-06
    eps_clip: NonNegative = 0.2
    eps_clip_high: NonNegative = 0.28
    weight_decay: NonNegative = 0.1
    adam_beta2: Annotated[float, Field(gt=0, lt=1), Worded("must be between 0 and 1")] = 0.98
    sglang_mem_fraction_static: Annotated[float, Field(gt=0, lt=1), Worded("is a fraction of GPU memory")] = 0.7
    max_tokens_per_gpu: Count = 9216
    # --- SlimeRunner: wandb ---
    wandb_project: str | None = None
    wandb_group: str | None = None
    # --- SlimeRunner: escape hatch ---
    extra_flags: list[str] = Field(default_factory=list)

    # --- run options (slimeforge) ---
    num_rollout: Count = 1  # SlimeRunner.train(num_rollout=1) is the seed's smoke test
    num_nodes: Nodes = 1  # hosts; num_gpus is per host, as SlimeRunner's --actor-num-gpus-per-node
    num_steps_per_rollout: Count = 1  # global batch = rollout_batch_size * n_samples / this
    stack: str = "cu13"  # images/<stack>.yaml, or a path
    image: str | None = None  # container image, ideally REG/repo@sha256:...
    mode: Literal["container", "host"] = "container"
    install_prefix: str | None = None  # host mode: the prefix of `invoke install`
    checkpoint_dir: str | None = None  # default: /root/checkpoints/<exp_id>
    save: bool = True
    save_interval: Count = 20
    resume: bool = True  # pass --load <checkpoint_dir>; slime starts from ref-load when it is empty
    eval_data: dict[str, str] = Field(default_factory=dict)  # name -> JSONL path
    eval_interval: Annotated[int | None, Field(ge=1, le=MAX_COUNT),
                             Worded("must be a positive number of rollouts")] = None
    n_samples_per_eval_prompt: Count = 1
    cluster: str | None = None  # inventory file (recipes/clusters/*.yaml)
    env: dict[str, str] = Field(default_factory=dict)  # extra environment for the job
    # Secrets the job needs, by NAME only: their values come from the environment of `invoke run`
    # at launch and are never written to the run directory (docs/recipes.md).
    secret_env: list[str] = Field(default_factory=list)
    ray_dashboard_port: Port = 8265
    ray_port: Port = 6379
    # --cluster: resubmit the run (resuming from checkpoint_dir) when a node or the head was lost
    max_restarts: Annotated[int, Field(ge=0, le=100), Worded("is not a number of restarts")] = 0

    # --- derived ---
    @property
    def total_gpus(self) -> int:
        return self.num_gpus * self.num_nodes

    @property
    def global_batch_size(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt // max(self.num_steps_per_rollout, 1)

    @property
    def resolved_checkpoint_dir(self) -> str:
        return self.checkpoint_dir or f"/root/checkpoints/{self.exp_id}"


def bucket_name(value: str) -> str:
    """The bucket of an s3_bucket value: a bare name, or `s3://bucket/prefix`."""
    return value[5:].split("/", 1)[0] if value.startswith("s3://") else value


def _bucket_problems(value: str) -> list[str]:
    """AWS S3 general-purpose bucket naming rules; `s3://bucket/prefix` is accepted too."""
    bucket = bucket_name(value)
    why = []
    if not 3 <= len(bucket) <= 63:
        why.append("must be 3 to 63 characters long")
    if not re.fullmatch(r"[a-z0-9.-]*", bucket):
        why.append("may hold only lowercase letters, digits, dots and hyphens")
    if bucket and not (bucket[0].isalnum() and bucket[-1].isalnum()):
        why.append("must begin and end with a letter or digit")
    if ".." in bucket:
        why.append("must not hold two adjacent dots")
    if re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+", bucket):
        why.append("must not look like an IP address")
    for prefix in ("xn--", "sthree-", "amzn-s3-demo-"):
        if bucket.startswith(prefix):
            why.append(f"must not start with {prefix!r}")
    for suffix in ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"):
        if bucket.endswith(suffix):
            why.append(f"must not end with {suffix!r}")
    return why


def check(recipe: Recipe, stack: Stack, rendered_flags: set[str]) -> list[Problem]:
    """Every cross-field rule; returns all problems (empty when the recipe is good)."""
    p: list[Problem] = []
    r = recipe

    if not EXP_ID_RE.fullmatch(r.exp_id):
        p.append(Problem("exp_id", "is used as a directory and experiment name", r.exp_id,
                         "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128"))
    if not ARN_RE.fullmatch(r.agent_runtime_arn):
        p.append(Problem("agent_runtime_arn", "is not an AgentCore runtime ARN", r.agent_runtime_arn,
                         "arn:aws:bedrock-agentcore:<region>:<12-digit account>:runtime/<name>-<10-character id>"))
    for why in _bucket_problems(r.s3_bucket):
        p.append(Problem("s3_bucket", f"breaks S3 bucket naming rules: {why}", r.s3_bucket,
                         "a bucket name such as my-rollouts-1, or s3://bucket/prefix"))
    paths_accepted = f"/path/on/the/hosts: absolute, not / or under {', '.join(SYSTEM_DIRS)}, without ':' or ','"
    for name in ("model_dir", "data_path", "checkpoint_dir"):
        value = getattr(r, name)
        if value is not None and (path_why := host_path_problem(value)):
            p.append(Problem(name, path_why, value, paths_accepted))
    for name in ("slime_dir", "megatron_dir"):  # checkouts: in the image or the install, never mounted
        value = getattr(r, name)
        if not value.startswith("/"):
            p.append(Problem(name, "must be an absolute path (it is read on every cluster host)", value,
                             "/path/on/the/hosts"))
    for name, path in r.eval_data.items():
        if not LABEL_RE.fullmatch(name):
            p.append(Problem(f"eval_data.{name}", "is not a data set name (it is passed to slime as NAME PATH)", name,
                             "letters, digits, '.', '_', '-', not starting with '-' or '.'"))
        if path_why := host_path_problem(path):
            p.append(Problem(f"eval_data.{name}", path_why, path, paths_accepted))
    for name in ("wandb_project", "wandb_group"):
        value = getattr(r, name)
        if value is not None and not LABEL_RE.fullmatch(value):
            p.append(Problem(name, "is not a wandb name (it is passed to slime as a flag's value)", value,
                             "letters, digits, '.', '_', '-', not starting with '-' or '.', at most 128"))
    if not MODEL_ID_RE.fullmatch(r.model_id):
        p.append(Problem("model_id", "is not a model id", r.model_id,
                         "default, or a model id such as us.anthropic.claude-3-haiku "
                         "(letters, digits, . _ : / -, not starting with '-')"))
    if not LABEL_RE.fullmatch(r.model_type):
        p.append(Problem("model_type", "is not a model script name", r.model_type,
                         "the name of a scripts/models/<name>.sh of slime"))

    # model_type: a local checkout of slime (when present here) wins over the recorded facts.
    local = model_types_in(r.slime_dir)
    facts = load_facts(stack.sources["slime"].commit) if "slime" in stack.sources else None
    known = local if local is not None else (list(facts.model_types) if facts else None)
    if known is not None and r.model_type not in known and LABEL_RE.fullmatch(r.model_type):
        hint = did_you_mean(r.model_type, known)
        where = f"{r.slime_dir}/scripts/models" if local is not None else f"slime {stack.sources['slime'].commit[:12]}"
        p.append(Problem("model_type",
                         f"has no model script in {where}" + (f"; did you mean {hint!r}?" if hint else ""),
                         r.model_type, ", ".join(known)))

    ports = {"gateway_port": r.gateway_port, "ray_dashboard_port": r.ray_dashboard_port, "ray_port": r.ray_port}
    used = [v for v in ports.values() if v]
    if len(set(used)) != len(used):
        p.append(Problem("ports", "gateway_port, ray_dashboard_port and ray_port must differ (one process per port)",
                         ports, "three different ports"))
    if r.reward_postprocessing not in REWARD_POSTPROCESSING:
        p.append(Problem("reward_postprocessing", "is not a known reward post-processing", r.reward_postprocessing,
                         "grpo (normalize_episode_rewards of the toolkit) or none"))

    # GPU arithmetic (on values in range: the schema's bounds): Megatron shards each layer over tp
    # GPUs of one host; SGLang engines are colocated on the same GPUs and must tile them exactly.
    if r.num_gpus % r.tp_size:
        # num_gpus is bounded above (MAX_GPUS_PER_HOST), so listing its divisors is cheap.
        p.append(Problem("tp_size", f"must divide num_gpus ({r.num_gpus})", r.tp_size,
                         "a divisor of num_gpus: " + ", ".join(str(d) for d in range(1, r.num_gpus + 1)
                                                               if r.num_gpus % d == 0)))
    if r.total_gpus % r.rollout_gpus_per_engine:
        p.append(Problem("rollout_gpus_per_engine",
                         f"must divide the GPU count ({r.total_gpus} = num_gpus x num_nodes)",
                         r.rollout_gpus_per_engine, "a divisor of " + str(r.total_gpus)))
    # Batch arithmetic: rollout_batch_size * n_samples_per_prompt == global_batch_size * num_steps_per_rollout.
    samples = r.rollout_batch_size * r.n_samples_per_prompt
    if samples % r.num_steps_per_rollout:
        p.append(Problem("num_steps_per_rollout",
                         f"must divide rollout_batch_size x n_samples_per_prompt "
                         f"({r.rollout_batch_size} x {r.n_samples_per_prompt} = {samples})",
                         r.num_steps_per_rollout, "a divisor of " + str(samples)))
    elif r.num_gpus % r.tp_size == 0:
        dp = r.total_gpus // r.tp_size
        if r.global_batch_size % dp:
            p.append(Problem("rollout_batch_size",
                             f"gives a global batch of {r.global_batch_size} samples (rollout_batch_size x "
                             f"n_samples_per_prompt / num_steps_per_rollout), which the {dp} data-parallel ranks "
                             "(GPUs / tp_size) cannot split evenly",
                             r.rollout_batch_size, f"values that make the global batch a multiple of {dp}"))

    if r.mode == "host" and not r.install_prefix and r.slime_dir == RUNNER_FIELDS["slime_dir"]:
        p.append(Problem("install_prefix",
                         "is needed in host mode unless slime_dir and megatron_dir name the checkouts", None,
                         "the --prefix given to `invoke install`", show_value=False))
    if r.image is not None:
        bad = image_ref_problems(r.image, "image")
        p += bad
        if not bad and "@" not in r.image and ":" not in r.image.rsplit("/", 1)[-1]:
            p.append(Problem("image", "has no tag or digest", r.image,
                             "REG/repo@sha256:<digest> (best) or REG/repo:tag"))
    if r.install_prefix is not None and not r.install_prefix.startswith("/"):
        p.append(Problem("install_prefix", "must be an absolute path", r.install_prefix,
                         "the --prefix given to `invoke install`"))

    for i, name in enumerate(r.secret_env):
        if not ENV_NAME_RE.fullmatch(name):
            p.append(Problem(f"secret_env.{i}", "is not an environment variable name", name,
                             "letters, digits and '_', not starting with a digit"))
        elif reserved_env(name):
            p.append(Problem(f"secret_env.{i}", "is set by slimeforge itself and may not be replaced", name,
                             "any other name"))
        elif name in r.env:
            p.append(Problem(f"secret_env.{i}", "is also set in env; a secret's value never goes into a recipe", name,
                             "remove it from env"))
    for key, value in r.env.items():
        if not ENV_NAME_RE.fullmatch(key):
            p.append(Problem(f"env.{key}", "is not an environment variable name", key,
                             "letters, digits and '_', not starting with a digit"))
        elif reserved_env(key):
            p.append(Problem(f"env.{key}", "is set by slimeforge itself and may not be replaced", key,
                             f"any other name (reserved: {', '.join(sorted(RESERVED_ENV))} "
                             f"and {'*, '.join(RESERVED_ENV_PREFIXES)}*)"))
        elif secret_name(key) or secret_value(value):
            p.append(Problem(f"env.{key}", "looks like a secret, and secrets are never written into the run directory",
                             None, SECRET_ADVICE, show_value=False))

    p += longest_sample_problems(r)
    p += extra_flag_problems(r.extra_flags, rendered_flags, stack)
    return p


SECRET_ADVICE = ("export it in the shell that runs `invoke run` and list its NAME under secret_env "
                 "(WANDB_API_KEY, HF_TOKEN and the AWS credentials are passed by name already); "
                 "never write its value into a recipe")


def abbreviated(name: str, flags: set[str]) -> list[str]:
    """The flags that `name` is a proper prefix of, as argparse matches an abbreviated long option."""
    return sorted(f for f in flags if f.startswith(name) and f != name) if name.startswith("--") else []


def flag_value(tokens: list[str], flag: str) -> str | None:
    """The value extra_flags give `flag` (`--flag V` or `--flag=V`; the last one, as argparse keeps)."""
    found = None
    for i, token in enumerate(tokens):
        if token == flag and i + 1 < len(tokens):
            found = tokens[i + 1]
        elif token.startswith(flag + "="):
            found = token.split("=", 1)[1]
    return found


def longest_sample_problems(r: Recipe) -> list[Problem]:
    """--use-dynamic-batch-size packs samples into micro-batches of at most max_tokens_per_gpu tokens
    per GPU: one sample (its prompt plus rollout_max_response_len) must fit, or slime cannot pack it.
    The prompt's bound comes from extra_flags (--rollout-max-prompt-len, --rollout-max-context-len),
    else it is at least one token; context parallelism splits a sample over its ranks."""
    bad: list[Problem] = []

    def number(flag: str) -> int | None:
        value = flag_value(r.extra_flags, flag)
        if value is None:
            return None
        # The one number parser: '²' passed str.isdigit() and failed int(); slime's argparse would take '٣' as 3.
        if problem := whole_problem(value, f"extra_flags {flag}", 1, 1 << 24, "tokens" if "len" in flag else "ranks"):
            bad.append(problem)
            return None
        return int(value)

    prompt, context = number("--rollout-max-prompt-len"), number("--rollout-max-context-len")
    cp = number("--context-parallel-size") or 1
    if bad:
        return bad
    longest = r.rollout_max_response_len + (prompt or 1)
    counted = f"its prompt (--rollout-max-prompt-len {prompt})" if prompt else "at least one prompt token"
    what = f"{counted} plus rollout_max_response_len ({r.rollout_max_response_len})"
    if context and (context < longest or not prompt):  # prompt and response together, at most
        longest, what = context, f"--rollout-max-context-len ({context})"
    need = -(-longest // cp)
    if r.max_tokens_per_gpu >= need:
        return []
    split = f", over {cp} context-parallel ranks" if cp > 1 else ""
    room = ("" if prompt or context
            else "; leave room for the prompt too (give --rollout-max-prompt-len in extra_flags to have it counted)")
    return [Problem("max_tokens_per_gpu",
                    f"is below the longest sample, {what} = {longest} tokens{split}: slime cannot pack one sample "
                                          "into a micro-batch", r.max_tokens_per_gpu, f"at least {need}{room}")]


def extra_flag_problems(tokens: list[str], rendered_flags: set[str], stack: Stack) -> list[Problem]:
    """extra_flags by their grammar: `--name` (or `--name=value`) followed by its values, one per
    item, as argv holds them; no flag the recipe sets already, none slime ignores, no secret."""
    p: list[Problem] = []
    facts = load_facts(stack.sources["slime"].commit) if "slime" in stack.sources else None
    flag = None
    for i, token in enumerate(tokens):
        where = f"extra_flags[{i}]"
        if token != token.strip() or not token:
            p.append(Problem(where, "has spaces around it (each item is one argv word, as given)", token,
                             "'--lr' and '1e-5' as two items, no spaces"))
            continue
        if token.startswith("-") and not NUMBER_RE.fullmatch(token):
            name, eq, value = token.partition("=")
            if not FLAG_RE.fullmatch(name):
                hint = "--" + name.lstrip("-").replace("_", "-").split()[0].lower() if name.lstrip("-") else "--name"
                p.append(Problem(where,
                                 "is not a flag name (slime's flags are --lowercase-words-with-dashes; "
                                 "a value goes in the next item)",
                                 token, f"e.g. {hint!r} followed by its value as the next item"))
                flag = None
                continue
            flag = name
            if name in rendered_flags:
                p.append(Problem(where,
                                 "repeats a flag that the recipe already sets "
                                 "(argparse keeps the last one, so one of them is silently lost)",
                                 token, "set the recipe field instead, or remove it from extra_flags"))
            elif (longer := abbreviated(name, rendered_flags)) and not (facts and name in facts.renderable_flags):
                # argparse's allow_abbrev (SGLang's parser keeps it): a unique prefix of a long option
                # is that option, so `--sglang-mem 0.9` would silently replace the recipe's value.
                p.append(Problem(where,
                                 f"abbreviates {', '.join(longer)}, which the recipe sets (argparse takes a unique "
                                 "prefix of a long option for the option, so the recipe's value would be silently "
                                 "replaced)", token,
                                 "set the recipe field instead, or give the full name of a flag "
                                 "the recipe does not set"))
            if facts and name in facts.removed_flags:
                p.append(Problem(where, f"is not accepted by slime {facts.commit[:12]}: {facts.removed_flags[name]}",
                                 token, "remove it"))
            if secret_name(name.replace("-", "_")) or (eq and secret_value(value)):
                p.append(Problem(where,
                                 "passes a secret on the command line "
                                 "(it would be written to slime.args and plan.json)",
                                 None, SECRET_ADVICE, show_value=False))
        elif flag is None:
            p.append(Problem(where, "is a value with no flag before it", token,
                             "a flag such as '--lr' first, then its values"))
        elif secret_value(token):
            p.append(Problem(where, "looks like a secret (it would be written to slime.args and plan.json)", None,
                             SECRET_ADVICE, show_value=False))
    return p


def set_value(key: str, raw: str) -> Any:
    """The value of `--set key=raw`, typed by the recipe's schema rather than by YAML's guesses:
    a text field keeps the text (`wandb_project=no` stays "no", `exp_id=1e3` stays "1e3"), a
    yes/no field takes true or false only (YAML would read `save=no` as false), numbers and lists
    are read as YAML and then checked by the schema like any recipe value."""
    top, _, sub = key.partition(".")
    field = Recipe.model_fields.get(top)
    if field is None:
        return parse_yaml(raw, "--set") if raw else raw
    ann = field.annotation
    if sub:
        if ann == dict[str, str]:
            return raw
        return parse_yaml(raw, "--set") if raw else raw
    args = set(getattr(ann, "__args__", ()))
    if ann is str or ann == Literal["container", "host"] or args == {str, type(None)}:
        return None if raw == "" and type(None) in args else raw
    if ann is bool:
        if raw.lower() not in ("true", "false"):
            raise ValueError("is a yes/no setting: give true or false (YAML's yes/no/on/off are not accepted here)")
        return raw.lower() == "true"
    return parse_yaml(raw, "--set") if raw else raw


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, object]:
    """The command line's `--set` items, typed by the recipe's schema."""
    return parse_set(items, typed=set_value)


def load_recipe_data(path: str | os.PathLike[str], overrides: dict[str, object] | None = None) -> dict[str, object]:
    path = Path(path)
    if not (path.exists() or path.is_symlink()):  # anything else there (a FIFO, a directory) the reader names
        raise ConfigError(str(path), [Problem("recipe", "names no file", str(path),
                                              "a path such as recipes/gsm8k.yaml")])
    data = load_with_extends(path)
    return deep_merge(data, overrides or {})


def blame_overrides(problems: list[Problem], overrides: dict[str, object], source: str) -> ConfigError:
    """Problems of values that came from `--set` name the command line, not the recipe file."""
    def from_set(where: str) -> bool:
        node: Any = overrides
        for part in where.replace("[", ".").split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
            if not isinstance(node, dict):
                return True
        return True

    marked = [Problem(f"--set {p.where}", p.message, p.value, p.accepted,
                      p.show_value) if overrides and from_set(p.where) else p
              for p in problems]
    if overrides and all(p.where.startswith("--set ") for p in marked):
        source = "command line"
    return ConfigError(source, marked)
