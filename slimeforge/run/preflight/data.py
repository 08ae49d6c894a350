"""Data and output checks: the JSONL data files, the checkpoint directory, the job's env values."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from ... import readback
from ..rundir import wandb_off_warning
from .findings import Context, Finding, check, error, ok, warning

# Rows of the data file that are read: enough to catch a wrong format, fast on any file size.
DATA_ROWS = 100


def data_findings(path: str, where: str, rows: int = DATA_ROWS) -> list[Finding]:
    p = Path(path)
    fix_rows = 'one JSON object per line: {"prompt": "...", "metadata": {...}} (metadata is the agent\'s payload)'
    if not p.is_file():
        return [error("data", f"{where} {path} does not exist (or is not a file)",
                      f"set {where} to a JSONL file present on every host")]
    bad: list[str] = []
    seen = 0
    try:
        with p.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if seen >= rows:
                    break
                if not line.strip():
                    continue
                seen += 1
                try:
                    row = json.loads(line)
                except ValueError as exc:  # JSONDecodeError, or an integer over Python's digit limit
                    bad.append(f"line {lineno}: not JSON ({exc.msg if isinstance(exc, json.JSONDecodeError) else exc})")
                    continue
                if not isinstance(row, dict):
                    bad.append(f"line {lineno}: a {type(row).__name__}, not an object")
                    continue
                missing = [k for k in ("prompt", "metadata") if k not in row]
                if missing:
                    bad.append(f"line {lineno}: no {' and no '.join(repr(k) for k in missing)} key (keys: "
                               f"{', '.join(sorted(row)) or 'none'})")
    except UnicodeDecodeError as exc:
        return [error("data", f"{where} {path} is not UTF-8 text: {exc}", fix_rows)]
    if seen == 0:
        return [error("data", f"{where} {path} is empty", fix_rows)]
    if bad:
        shown = bad[:5] + ([f"... and {len(bad) - 5} more of the first {seen} rows"] if len(bad) > 5 else [])
        return [error("data", f"{where} {path}: " + "; ".join(shown), fix_rows)]
    return [ok("data", f"{where} {path}: first {seen} rows have prompt and metadata")]


@check("data", "recipe", needs_recipe=True)
def check_data(ctx: Context) -> list[Finding]:
    """The data files are JSONL with prompt and metadata in every row checked."""
    r = ctx.recipe
    assert r is not None
    out = data_findings(r.data_path, "data_path")
    for name, path in r.eval_data.items():
        out += data_findings(path, f"eval_data.{name}")
    return out


def _tree_size(path: Path) -> int:
    total = 0
    for p in path.glob("*"):
        if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt"):
            total += p.stat().st_size
    return total


@check("checkpoint", "recipe", needs_recipe=True)
def check_checkpoint(ctx: Context) -> list[Finding]:
    """checkpoint_dir is writable, with free space; existing checkpoints are resumed."""
    r = ctx.recipe
    assert r is not None
    ckpt = Path(r.resolved_checkpoint_dir)
    existing = ckpt
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        who = "it" if existing == ckpt else f"its nearest existing parent {existing}"
        return [error("checkpoint", f"checkpoint_dir {ckpt} cannot be written: {who} is not a writable directory",
                      "set checkpoint_dir to a directory this user can write (on shared storage for several hosts)")]
    out = []
    free = shutil.disk_usage(existing).free
    weights = _tree_size(Path(r.model_dir)) if Path(r.model_dir).is_dir() else 0
    # A Megatron checkpoint holds the weights in fp32 plus two Adam moments: ~6x bf16 weights.
    need = 6 * weights
    if weights and free < need:
        out.append(warning("checkpoint",
                           f"{free / 2**30:.1f} GiB free at {existing}; a checkpoint of this model takes about "
                           f"{need / 2**30:.0f} GiB",
                           "free space, raise save_interval, or point checkpoint_dir elsewhere"))
    marker = ckpt / "latest_checkpointed_iteration.txt"
    resume = ""
    if marker.is_file():
        try:  # Megatron's marker: one number; through the one reader (a FIFO never blocks, a huge file is not read)
            iteration = readback.read_text(marker, marker.name, re.compile(r"[0-9]{1,12}|release"),
                                           "an iteration number", follow_symlinks=True)
        except readback.RecordError as exc:
            out.append(warning("checkpoint", str(exc.problems[0]),
                               "remove the marker, or point checkpoint_dir elsewhere"))
            iteration = None
        resume = f"; resumes from iteration {iteration}" if r.resume else ("; resume is off: existing checkpoints are "
                                                                          "kept, not loaded")
    return out or [ok("checkpoint", f"{ckpt} writable, {free / 2**30:.0f} GiB free{resume}")]


# What Ray's runtime env expands in env_vars values (os.path.expandvars, then unknown ${X} -> "").
RAY_EXPANDS = re.compile(r"\$(\{[A-Za-z0-9_]+\}|[A-Za-z_][A-Za-z0-9_]*)")


@check("runtime-env", "recipe", needs_recipe=True)
def check_runtime_env(ctx: Context) -> list[Finding]:
    """The job's env values reach it unchanged (Ray expands $NAME and ${NAME} in them)."""
    r = ctx.recipe
    assert r is not None
    out = []
    for key, value in r.env.items():
        m = RAY_EXPANDS.search(value)
        if m:
            out.append(error("runtime-env",
                             f"env.{key} holds {m.group(0)!r}, which Ray replaces with the value of that variable "
                             "on the cluster (or with nothing); it has no escape for '$'",
                             f"write the value of env.{key} without '$NAME' / '${{NAME}}' (e.g. spell out the path)"))
    return out or [ok("runtime-env", f"{len(r.env)} recipe env value(s) reach the job unchanged")]



@check("wandb", "recipe", needs_recipe=True)
def check_wandb(ctx: Context) -> list[Finding]:
    """A recipe that names a wandb_project logs to wandb only with WANDB_API_KEY set."""
    r = ctx.recipe
    assert r is not None
    said = wandb_off_warning(r, ctx.environ)
    if said:
        return [warning("wandb", said,
                        "export WANDB_API_KEY=... (wandb.ai/authorize), or remove wandb_project from the recipe")]
    return [ok("wandb", f"logs to wandb project {r.wandb_project}" if r.wandb_project else "off (no wandb_project)")]
