"""Model checks: the model script's MODEL_ARGS (and slime.args) against the checkpoint's config.json."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import readback
from ..modelscript import eval_in_image, eval_model_script, model_script
from .findings import Context, Finding, check, describe_failure, error, ok, skipped
from .toolfix import known_fix

# slime model flag -> keys of the HF config.json that hold the same value (first present wins).
MODEL_FLAG_KEYS: dict[str, tuple[str, ...]] = {
    "--hidden-size": ("hidden_size",),
    "--num-layers": ("num_hidden_layers",),
    "--num-attention-heads": ("num_attention_heads",),
    "--ffn-hidden-size": ("intermediate_size",),
    "--vocab-size": ("vocab_size",),
    "--norm-epsilon": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
    "--rotary-base": ("rope_theta", "rope_parameters.rope_theta"),
}
# Megatron-LM's defaults, which apply when a model script leaves the flag out.
MEGATRON_DEFAULTS = {"--norm-epsilon": "1e-5", "--rotary-base": "10000"}


def model_args(ctx: Context) -> list[str] | Exception:
    """MODEL_ARGS, read from the script here, or from the image when it is not on this host."""
    r = ctx.recipe
    assert r is not None

    def read() -> list[str]:
        script = model_script(r)
        if script.is_file():
            return eval_model_script(script, r.slime_dir, ctx.runner)
        if ctx.mode == "container" and ctx.image:
            return eval_in_image(ctx.docker, ctx.image, script, r.slime_dir, ctx.runner)
        raise FileNotFoundError(f"no model script at {script}")

    return ctx.once("model_args", read)


def last_values(argv: Sequence[str]) -> dict[str, str | None]:
    """flag -> its value as argparse ends up with it (the last occurrence wins); None for a switch."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if is_flag(tok):
            name, eq, val = tok.partition("=")
            if eq:
                out[name] = val
            elif i + 1 < len(argv) and not is_flag(argv[i + 1]):
                out[name] = argv[i + 1]
                i += 1
            else:
                out[name] = None
        i += 1
    return out


def is_flag(token: str) -> bool:
    """`--name` or `--name=value`; not a negative number, not JSON, not a lone `--`."""
    return re.match(r"--[A-Za-z]", token) is not None


def _config_value(config: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def _same(flag_value: str, config_value: Any) -> bool:
    try:
        return math.isclose(float(flag_value), float(config_value), rel_tol=1e-9)
    except (TypeError, ValueError):
        return str(flag_value) == str(config_value)


def compare_model(flags: dict[str, str | None], config: dict, script: str, config_path: str) -> list[Finding]:
    """The model flags as slime will see them (MODEL_ARGS, then slime.args; the last value wins)
    against the checkpoint's config.json."""
    out = []

    def mismatch(what: str, flag_says: str, config_says: str, fix: str):
        out.append(error("model-config",
                         f"{what}: the model script says {flag_says}, {config_path} says {config_says}", fix))

    for flag, keys in MODEL_FLAG_KEYS.items():
        want = _config_value(config, keys)
        if want is None:
            continue
        have = flags.get(flag, MEGATRON_DEFAULTS.get(flag))
        source = "" if flag in flags else " (Megatron's default)"
        if have is None:
            continue
        if not _same(have, want):
            key = next(k for k in keys if _config_value(config, (k,)) is not None)
            mismatch(flag, f"{flag} {have}{source}", f"{key}: {want}",
                     f"add [\"{flag}\", \"{want}\"] to extra_flags in the recipe (they come after MODEL_ARGS, so they "
                     f"win), or fix {script}")
    heads = _config_value(config, ("num_attention_heads",))
    kv = _config_value(config, ("num_key_value_heads",))
    if kv is not None and heads is not None and kv != heads:
        if "--group-query-attention" not in flags:
            mismatch("grouped-query attention", "no --group-query-attention",
                     f"num_key_value_heads: {kv} (of {heads} heads)",
                     f"add [\"--group-query-attention\", \"--num-query-groups\", \"{kv}\"] to extra_flags, or fix "
                     f"{script}")
        elif flags.get("--num-query-groups") is None or not _same(flags["--num-query-groups"] or "", kv):
            mismatch("--num-query-groups", f"--num-query-groups {flags.get('--num-query-groups')}",
                     f"num_key_value_heads: {kv}",
                     f"add [\"--num-query-groups\", \"{kv}\"] to extra_flags, or fix {script}")
    tied = config.get("tie_word_embeddings", True)  # transformers' default
    untied = "--untie-embeddings-and-output-weights" in flags
    if bool(tied) == untied:
        says = "--untie-embeddings-and-output-weights" if untied else ("tied embeddings (no "
                                                                      "--untie-embeddings-and-output-weights)")
        fix = ("the model script must not pass --untie-embeddings-and-output-weights for this checkpoint: fix "
               f"{script} or pick the model_type of this model"
               if untied else f"add \"--untie-embeddings-and-output-weights\" to extra_flags, or fix {script}")
        mismatch("embeddings", says, f"tie_word_embeddings: {str(bool(tied)).lower()}", fix)
    return out


@check("model-config", "recipe", needs_recipe=True)
def check_model_config(ctx: Context) -> list[Finding]:
    """model_dir/config.json agrees with the model script's flags."""
    r = ctx.recipe
    assert r is not None
    config_path = Path(r.model_dir) / "config.json"
    out = []
    try:
        # The one reader: a FIFO here would block the doctor forever; a model's config.json is small.
        config = readback.read_json(config_path, "config.json", "a Hugging Face config.json", max_bytes=1 << 20,
                                    follow_symlinks=True)
        if config is None:
            out.append(error("model-config", f"{config_path} does not exist",
                             "set model_dir to a Hugging Face checkpoint directory (holding config.json and the "
                             "weights), on every host"))
    except readback.RecordError as exc:
        out.append(error("model-config",
                         f"{config_path} is not readable JSON: "
                         f"{'; '.join(p.message for p in exc.problems)}", "re-download the checkpoint"))
        config = None
    if config is not None and not isinstance(config, dict):
        out.append(error("model-config", f"{config_path} holds a JSON {type(config).__name__}, not an object",
                         "model_dir must be a Hugging Face checkpoint directory, whose config.json is a JSON object"))
        config = None
    script = model_script(r)
    # read in the image: one that is missing is said once, by its name
    if ctx.mode == "container" and not script.is_file():
        if not ctx.image:
            out.append(skipped("model-config", "--image",
                               f"the model script {script} is read in the image, and no image is given",
                               "give --image IMAGE (or image: in the recipe)"))
            return out
        if blocker := ctx.image_blocker("model-config"):
            return [*out, blocker]
    margs = model_args(ctx)
    if isinstance(margs, Exception):
        out.append(error("model-config", f"cannot read MODEL_ARGS of {model_script(r)}: {describe_failure(margs)}",
                         known_fix(margs,
                                   "check slime_dir and model_type in the recipe (model_type names "
                                   "scripts/models/<model_type>.sh)")))
        return out
    if config is None:
        return out
    out += compare_model(last_values([*margs, *ctx.args]), config, str(model_script(r)), str(config_path))
    return out or [ok("model-config", f"{model_script(r).name} agrees with {config_path}")]

