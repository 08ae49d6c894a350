"""The arguments after `train.py`, the Ray runtime env and the AgentCore config, from a recipe.

Model architecture flags are not here: they come from slime's own model script at launch time
(scripts/models/<model_type>.sh, evaluated with bash), so they always match the slime checkout.
"""

from __future__ import annotations

import json
from typing import TypedDict

from .. import paths
from ..image.stack import Stack
from .layout import SLIMEFORGE, Layout, search_path
from .recipe import Recipe

GENERATE_FN = "agentcore_rl_toolkit.backends.slime.integration.rollout.generate"
REWARD_FN = "agentcore_rl_toolkit.backends.slime.integration.rewards.normalize_episode_rewards"
S3_SESSION = "agentcore_rl_toolkit.rollout_session.agentcore_s3_session.AgentCoreS3Session"


def _num(x: float | int) -> str:
    return repr(x) if isinstance(x, float) else str(x)


def render_flags(recipe: Recipe, stack: Stack, *, config_path: str, env_json: str, wandb: bool) -> list[str]:
    r = recipe
    ckpt = r.resolved_checkpoint_dir
    args: list[str] = [
        # model and data
        "--hf-checkpoint", r.model_dir,
        "--ref-load", r.model_dir,
        "--prompt-data", r.data_path,
        "--input-key", "prompt",
        "--metadata-key", "metadata",
        "--num-rollout", str(r.num_rollout),
        # cluster shape: training and SGLang share the same GPUs
        "--actor-num-nodes", str(r.num_nodes),
        "--actor-num-gpus-per-node", str(r.num_gpus),
        "--colocate",
        "--tensor-model-parallel-size", str(r.tp_size),
        "--sequence-parallel",
        "--rollout-num-gpus-per-engine", str(r.rollout_gpus_per_engine),
        # rollout and batch
        "--rollout-batch-size", str(r.rollout_batch_size),
        "--n-samples-per-prompt", str(r.n_samples_per_prompt),
        "--global-batch-size", str(r.global_batch_size),
        "--rollout-max-response-len", str(r.rollout_max_response_len),
        "--rollout-temperature", _num(r.rollout_temperature),
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu", str(r.max_tokens_per_gpu),
        # GRPO
        "--advantage-estimator", "grpo",
        "--use-kl-loss",
        "--kl-loss-type", "low_var_kl",
        "--eps-clip", _num(r.eps_clip),
        "--eps-clip-high", _num(r.eps_clip_high),
        # optimizer
        "--lr", _num(r.lr),
        "--lr-decay-style", "constant",
        "--weight-decay", _num(r.weight_decay),
        "--adam-beta2", _num(r.adam_beta2),
        "--optimizer-cpu-offload",
        "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer",
        "--attention-dropout", "0.0",
        "--hidden-dropout", "0.0",
        "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32",
        "--attention-backend", stack.runtime.attention_backend if stack.runtime else "flash",
        # SGLang
        "--sglang-mem-fraction-static", _num(r.sglang_mem_fraction_static),
        # AgentCore rollouts (agentcore-rl-toolkit 0.2.0 contract)
        "--custom-generate-function-path", GENERATE_FN,
        "--custom-config-path", config_path,
        # slime gives its Megatron train actors a runtime env of their own: repeat the job's here
        "--train-env-vars", env_json,
    ]
    if r.reward_postprocessing == "grpo":
        args += ["--custom-reward-post-process-path", REWARD_FN]
    if r.save:
        args += ["--save", ckpt, "--save-interval", str(r.save_interval)]
    if r.resume:
        args += ["--load", ckpt]
    if r.eval_data:
        args += ["--eval-prompt-data"]
        for name, path in r.eval_data.items():
            args += [name, path]
        args += ["--n-samples-per-eval-prompt", str(r.n_samples_per_eval_prompt)]
        if r.eval_interval:
            args += ["--eval-interval", str(r.eval_interval)]
    if wandb and r.wandb_project:
        args += ["--use-wandb", "--wandb-project", r.wandb_project]
        if r.wandb_group:
            args += ["--wandb-group", r.wandb_group]
    return args + list(r.extra_flags)


def site_packages(recipe: Recipe, stack: Stack) -> str:
    if recipe.mode == "host" and recipe.install_prefix:
        return paths.Prefix.at(recipe.install_prefix).site_packages(stack.python)
    return stack.site_packages


def decoy_dir(recipe: Recipe) -> str:
    root = recipe.install_prefix if (recipe.mode == "host" and recipe.install_prefix) else paths.IMAGE_STATE
    return f"{root}/cudart-decoy"


def scrub_library_path(inherited: str) -> list[str]:
    """Inherited LD_LIBRARY_PATH entries minus every /usr/local/cuda and /usr/local/cuda-X.Y."""
    kept = []
    for entry in inherited.split(":"):
        bare = entry.rstrip("/")
        if (not entry or bare == "/usr/local/cuda" or bare.startswith("/usr/local/cuda/")
                or bare.startswith("/usr/local/cuda-")):
            continue
        kept.append(entry)
    return kept


def runtime_env_vars(recipe: Recipe, stack: Stack, wandb_entity: str | None = None,
                     layout: Layout = SLIMEFORGE) -> dict[str, str]:
    """Environment of the Ray job (and, through --train-env-vars, of slime's train actors), for
    slimeforge's layout or the image's (run/layout.py)."""
    if not layout.is_slimeforge:
        return image_env_vars(recipe, layout, wandb_entity)
    sp = site_packages(recipe, stack)
    cuda_home = recipe.env.get("CUDA_HOME", stack.cuda_home)
    lib = []
    rt = stack.runtime
    if rt and rt.cudart_decoy:
        # An empty libcudart.so.12 found first stops the loader resolving CUDA 12's runtime
        # beside 13's (TE aborts with "Multiple libcudart libraries found").
        lib.append(decoy_dir(recipe))
    if rt:
        lib += [f"{sp}/{d}" for d in rt.nvidia_lib_dirs]
    lib.append(f"{cuda_home}/lib64")
    lib += scrub_library_path(recipe.env.get("LD_LIBRARY_PATH", ""))
    env = {
        "PYTHONPATH": recipe.megatron_dir,
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        **({"CUDA_HOME": cuda_home} if cuda_home else {}),  # a stack without cuda_home: the image's own
        "LD_LIBRARY_PATH": ":".join(dict.fromkeys(lib)),
        # Else a system cuDNN wins and fused attention fails (CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED).
        "CUDNN_HOME": f"{sp}/nvidia/cudnn",
        "CUDNN_PATH": f"{sp}/nvidia/cudnn",
    }
    if rt:
        env["CUDNN_FRONTEND_CUDART_LIB_NAME"] = rt.cudart_name
    if wandb_entity and recipe.wandb_project:
        env["WANDB_ENTITY"] = wandb_entity
    for key, value in recipe.env.items():
        if key not in ("LD_LIBRARY_PATH", "CUDA_HOME"):
            env[key] = value
    return env


def image_env_vars(recipe: Recipe, layout: Layout, wandb_entity: str | None = None) -> dict[str, str]:
    """The job's environment in an image slimeforge did not build: Megatron first on PYTHONPATH
    (unless `import megatron` finds it there already), then the image's own entries (Ray's env_vars
    replace a variable); nothing of slimeforge's layout
    (no cudart decoy, no cuDNN or CUDA library under the stack's venv, no CUDA_HOME unless the recipe
    sets one); LD_LIBRARY_PATH only when the recipe adds to it, after the image's own entries."""
    env = {"PYTHONPATH": search_path(None if layout.megatron_imported else recipe.megatron_dir, layout.pythonpath),
           "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    if not env["PYTHONPATH"]:  # Megatron imports without it and the image sets none: left unset
        del env["PYTHONPATH"]
    if recipe.env.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = search_path(layout.ld_library_path, recipe.env["LD_LIBRARY_PATH"])
    if wandb_entity and recipe.wandb_project:
        env["WANDB_ENTITY"] = wandb_entity
    env.update((k, v) for k, v in recipe.env.items() if k != "LD_LIBRARY_PATH")
    return env


class SessionBackend(TypedDict):
    backend: str
    agentcore_runtime_arn: str
    rollout_output_s3: str
    experiment_name: str
    max_pool_connections: int


class AgentCoreConfig(TypedDict):
    """agentcore.yaml: agentcore-rl-toolkit 0.2.0's --custom-config-path (agentcore_config says which field is
    which)."""

    rollout_session_backend: SessionBackend
    model_id: str
    max_rollout_time: int
    tps_limit: int
    gateway_port: int


def agentcore_config(recipe: Recipe) -> AgentCoreConfig:
    """The --custom-config-path YAML in agentcore-rl-toolkit 0.2.0's contract.

    SlimeRunner field      -> toolkit 0.2.0 key
    agent_runtime_arn      -> rollout_session_backend.agentcore_runtime_arn
    s3_bucket, exp_id      -> rollout_session_backend.rollout_output_s3 (s3://<bucket>/<exp_id>)
    exp_id                 -> rollout_session_backend.experiment_name
    max_concurrent         -> rollout_session_backend.max_pool_connections (bounds concurrent calls)
    acr_timeout            -> max_rollout_time (seconds)
    acr_tps_limit          -> tps_limit (new rollout sessions per second)
    gateway_port           -> gateway_port (0 = choose a free port)
    model_id               -> model_id (the model name the agent sends to the gateway)
    reward_postprocessing  -> not a key: "grpo" adds --custom-reward-post-process-path
    """
    r = recipe
    bucket = r.s3_bucket if r.s3_bucket.startswith("s3://") else f"s3://{r.s3_bucket}"
    return {
        "rollout_session_backend": {
            "backend": S3_SESSION,
            "agentcore_runtime_arn": r.agent_runtime_arn,
            "rollout_output_s3": f"{bucket.rstrip('/')}/{r.exp_id}",
            "experiment_name": r.exp_id,
            "max_pool_connections": r.max_concurrent,
        },
        "model_id": r.model_id,
        "max_rollout_time": r.acr_timeout,
        "tps_limit": r.acr_tps_limit,
        "gateway_port": r.gateway_port,
    }


def agentcore_config_doc() -> str:
    """The mapping above, as the header comment of agentcore.yaml."""
    doc = agentcore_config.__doc__ or ""
    lines = [line.strip() for line in doc.strip().splitlines()]
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def env_json(env: dict[str, str]) -> str:
    return json.dumps(env, sort_keys=True, separators=(",", ":"))
