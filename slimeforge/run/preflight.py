"""Preflight: every problem that would surface an hour into a launch, found in a second, before
anything starts (`invoke doctor`, and the first thing `invoke run` does).

Each check is a named function in CHECKS that returns Findings (error / warning / ok), each error
with its fix. All checks run and all findings are reported together; `skip` turns a check's errors
into warnings. Host checks (GPUs, driver, architecture, /dev/shm, limits, ports, versions) read
the host through a command runner `run(argv) -> stdout` (the context's `run`), so tests feed them
captured outputs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import paths
from ..errors import CommandError, ConfigError, Problem
from ..image.stack import Stack, load_stack
from ..proc import Runner
from ..schema import did_you_mean
from .flagcatalog import Catalog, load_catalog, parse_catalog
from .headstate import dashboard_url, recorded_head
from .modelscript import eval_in_image, eval_model_script, model_script
from .recipe import ARN_RE, Recipe, bucket_name

ERROR, WARNING, OK = "error", "warning", "ok"

# Rows of the data file that are read: enough to catch a wrong format, fast on any file size.
DATA_ROWS = 100
SHM_MIN_GIB = 1  # NCCL and Ray's object store fail outright below this
SHM_GOOD_GIB = 16  # SGLang and NCCL's shared-memory transport want this much or more
NOFILE_GOOD = 65536  # Ray opens a socket and files per worker; its docs ask for this or more
QUERY_GPU = ["nvidia-smi", "--query-gpu=index,name,uuid,driver_version,memory.total,compute_cap", "--format=csv,noheader"]

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

Run = Callable[[list[str]], str]


@dataclass(frozen=True)
class Finding:
    check: str
    level: str  # ERROR, WARNING or OK
    message: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"[{self.check}] {self.message}"
        return text + (f"\n    fix: {self.fix}" if self.fix else "")


def error(check: str, message: str, fix: str) -> Finding:
    return Finding(check, ERROR, message, fix)


def warning(check: str, message: str, fix: str = "") -> Finding:
    return Finding(check, WARNING, message, fix)


def ok(check: str, message: str) -> Finding:
    return Finding(check, OK, message)


class PreflightError(ConfigError):
    """Preflight found errors; carries the whole report (every problem, each with its fix)."""

    def __init__(self, source: str, report: Report):
        self.report = report
        super().__init__(source, [Problem(f.check, f"{f.message}; fix: {f.fix}", show_value=False) for f in report.errors])


@dataclass
class Report:
    findings: list[Finding]
    seconds: float = 0.0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]

    def table(self) -> str:
        width = max([len(f.check) for f in self.findings] + [5])
        lines = [f"{'check':<{width}}  {'status':<7}  detail"]
        for f in self.findings:
            status = {ERROR: "ERROR", WARNING: "warn", OK: "ok"}[f.level]
            first, *rest = f.message.splitlines() or [""]
            lines.append(f"{f.check:<{width}}  {status:<7}  {first}")
            lines += [f"{'':<{width}}  {'':<7}  {line}" for line in rest]
            if f.fix:
                lines.append(f"{'':<{width}}  {'':<7}  fix: {f.fix}")
        lines.append(f"{len(self.errors)} error(s), {len(self.warnings)} warning(s) in {self.seconds:.2f} s")
        return "\n".join(lines)


# --- the context the checks read ------------------------------------------------------------------


def reader(runner: Runner) -> Run:
    """A host reader over `runner`: runs here, returns stdout, raises CommandError on failure."""
    return lambda argv: runner.run(argv, step=argv[0], timeout=30).stdout


@dataclass
class Context:
    stack: Stack
    recipe: Recipe | None = None
    args: list[str] = field(default_factory=list)  # slime.args as rendered
    mode: str = "host"
    address: str | None = None
    catalog: str | None = None
    image: str | None = None
    install_prefix: str | None = None
    runner: Runner = field(default_factory=Runner)  # every command a check runs itself
    run: Run | None = None  # how host checks read the host; default: reader(runner)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    docker: str = "docker"
    state_dir: Path | None = None  # where the launcher records the Ray head it started
    cache: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.run is None:
            self.run = reader(self.runner)

    def once(self, key: str, fn: Callable[[], Any]) -> Any:
        if key not in self.cache:
            try:
                self.cache[key] = fn()
            except Exception as exc:  # noqa: BLE001 - remembered and reported by each check that needs it
                self.cache[key] = exc
        return self.cache[key]


@dataclass(frozen=True)
class Check:
    name: str
    scope: str  # "host" (this machine), "recipe" (files), "network" (AWS, the cluster)
    needs_recipe: bool
    fn: Callable[[Context], list[Finding]]
    doc: str


CHECKS: dict[str, Check] = {}


def check(name: str, scope: str, needs_recipe: bool = False):
    def register(fn: Callable[[Context], list[Finding]]):
        CHECKS[name] = Check(name, scope, needs_recipe, fn, (fn.__doc__ or "").strip().splitlines()[0])
        return fn

    return register


# --- GPUs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    driver: str
    memory_mib: int
    compute_cap: str


def parse_query_gpu(text: str) -> list[Gpu]:
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 6 or not cells[0].isdigit():
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        mem = re.match(r"(\d+)", cells[4])
        gpus.append(Gpu(int(cells[0]), cells[1], cells[2], cells[3], int(mem.group(1)) if mem else 0, cells[5]))
    return gpus


def query_gpus(run: Run) -> list[Gpu]:
    return parse_query_gpu(run(QUERY_GPU))


def _describe_failure(exc: Exception) -> str:
    if isinstance(exc, CommandError):
        tail = exc.output.strip().splitlines()[-1:] if exc.output.strip() else []
        return f"`{' '.join(exc.argv)}` exited with {exc.returncode}" + (f": {tail[0]}" if tail else "")
    return str(exc)


def gpu_findings(gpus: list[Gpu] | Exception, need: int, where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    if isinstance(gpus, Exception):
        if isinstance(gpus, CommandError) and gpus.returncode == 127:
            return [error("gpus", f"nvidia-smi not found{at}: no NVIDIA driver", "install the NVIDIA driver (it provides nvidia-smi), or run on a GPU host")]
        return [error("gpus", f"cannot list GPUs{at}: {_describe_failure(gpus)}", "check the driver with `nvidia-smi`; a driver/library version mismatch needs a reboot or a driver reload")]
    if len(gpus) < need:
        return [error("gpus", f"{len(gpus)} GPU(s){at}, the recipe needs {need} per host",
                      f"run on a host with {need} GPUs, or set num_gpus: {len(gpus)} in the recipe (tp_size and rollout_gpus_per_engine must divide it)")]
    names = sorted({g.name for g in gpus})
    return [ok("gpus", f"{len(gpus)} x {', '.join(names)}{at} (need {need})")]


def driver_findings(gpus: list[Gpu] | Exception, stack: Stack, where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    if isinstance(gpus, Exception) or not gpus:
        return [warning("driver", f"not checked{at}: no GPU information")]
    bad = sorted({g.driver for g in gpus if _driver_major(g.driver) < stack.driver_min})
    if bad:
        return [error("driver", f"driver {', '.join(bad)}{at} is too old for CUDA {stack.cuda} (stack {stack.name} needs R{stack.driver_min} or newer)",
                      f"install an R{stack.driver_min}+ NVIDIA driver, or use a stack built for an older CUDA (e.g. --set stack=cu129 needs R575+)")]
    return [ok("driver", f"{gpus[0].driver}{at} >= R{stack.driver_min} (CUDA {stack.cuda})")]


def _driver_major(version: str) -> int:
    m = re.match(r"(\d+)", version)
    return int(m.group(1)) if m else 0


def arch_findings(gpus: list[Gpu] | Exception, stack: Stack, where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    if isinstance(gpus, Exception) or not gpus:
        return [warning("gpu-arch", f"not checked{at}: no GPU information")]
    bad = sorted({(g.compute_cap, g.name) for g in gpus if g.compute_cap not in stack.arch_list})
    if bad:
        seen = ", ".join(f"{name} (compute capability {cap})" for cap, name in bad)
        return [error("gpu-arch", f"{seen}{at} is not among the architectures the {stack.name} image is compiled for ({', '.join(stack.arch_list)})",
                      f"add {', '.join(sorted({c for c, _ in bad}))!r} to arch_list in images/common.yaml and rebuild, or run on GPUs of a listed architecture")]
    return [ok("gpu-arch", f"compute capability {', '.join(sorted({g.compute_cap for g in gpus}))}{at} is in arch_list")]


# --- host resources -------------------------------------------------------------------------------


def shm_findings(run: Run, where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    try:
        lines = run(["df", "-Pk", "/dev/shm"]).strip().splitlines()
        kib = int(lines[-1].split()[1])
    except Exception as exc:  # noqa: BLE001
        return [error("shm", f"cannot read the size of /dev/shm{at}: {_describe_failure(exc)}", "mount a tmpfs at /dev/shm (NCCL and Ray's object store need it)")]
    gib = kib / 2**20
    fix = "mount -o remount,size=64G /dev/shm (host mode); container mode runs with --ipc=host, which uses the host's /dev/shm"
    if gib < SHM_MIN_GIB:
        return [error("shm", f"/dev/shm{at} is {gib:.2f} GiB; NCCL and Ray's object store need at least {SHM_MIN_GIB} GiB", fix)]
    if gib < SHM_GOOD_GIB:
        return [warning("shm", f"/dev/shm{at} is {gib:.1f} GiB; {SHM_GOOD_GIB} GiB or more is recommended for SGLang and NCCL", fix)]
    return [ok("shm", f"/dev/shm{at} is {gib:.0f} GiB")]


def limits_findings(run: Run, mode: str = "host", where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    try:
        memlock, nofile = run(["sh", "-c", "ulimit -l; ulimit -n"]).split()[:2]
    except Exception as exc:  # noqa: BLE001
        return [warning("limits", f"cannot read ulimits{at}: {_describe_failure(exc)}")]
    out = []
    if memlock != "unlimited":
        if mode == "container":
            out.append(ok("limits", f"memlock {memlock} KiB{at}; the container runs with --ulimit memlock=-1"))
        else:
            out.append(warning("limits", f"max locked memory{at} is {memlock} KiB; NCCL over InfiniBand/EFA needs it unlimited",
                               "`ulimit -l unlimited` (root), or `* - memlock unlimited` in /etc/security/limits.conf"))
    if nofile != "unlimited" and int(nofile) < NOFILE_GOOD:
        if mode == "container":
            out.append(ok("limits", f"open files {nofile}{at}; the container gets dockerd's limit for containers"))
        else:
            out.append(warning("limits", f"open files limit{at} is {nofile}; Ray wants {NOFILE_GOOD} or more",
                               "`ulimit -n 1048576` before launching, or `* - nofile 1048576` in /etc/security/limits.conf"))
    return out or [ok("limits", f"memlock {memlock}, open files {nofile}{at}")]


# Tries to bind each port on all interfaces, as Ray and the gateway will; prints the busy ones.
_PORT_PROBE = """
import socket, sys
for p in sys.argv[1:]:
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", int(p)))
    except OSError:
        print(p)
    finally:
        s.close()
"""


def busy_ports(run: Run, ports: Iterable[int], python: str = "python3") -> set[int]:
    wanted = [str(p) for p in ports if p]
    if not wanted:
        return set()
    return {int(x) for x in run([python, "-c", _PORT_PROBE, *wanted]).split()}


def port_findings(run: Run, ports: dict[str, int], python: str = "python3", where: str = "", ours: dict[int, str] | None = None) -> list[Finding]:
    """`ports` maps a name (e.g. "ray_port") to a port; `ours` lists ports held by something this
    launch stops first (the Ray head that an earlier launch recorded)."""
    at = f" on {where}" if where else ""
    ours = ours or {}
    try:
        busy = busy_ports(run, ports.values(), python)
    except Exception as exc:  # noqa: BLE001
        return [warning("ports", f"cannot probe ports{at}: {_describe_failure(exc)}")]
    out = []
    for name, port in ports.items():
        if port in busy and port not in ours:
            out.append(error("ports", f"{name} {port}{at} is in use by another process",
                             f"free the port (`ss -ltnp 'sport = :{port}'` shows who holds it) or set {name} to a free port in the recipe (--set {name}=...)"))
    notes = [f"{port} is held by {who}, which this launch stops first" for port, who in ours.items() if port in busy]
    shown = ", ".join(f"{n} {p}" for n, p in ports.items() if p)
    return out or [ok("ports", f"free{at}: {shown}" + (f" ({'; '.join(notes)})" if notes else ""))]


_VERSIONS = "import sys, ray; print(ray.__version__); print('%d.%d.%d' % sys.version_info[:3])"


def host_versions(run: Run, python: str = "python3") -> tuple[str, str]:
    """(Ray version, Python version) of the interpreter `python` on the host `run` reaches."""
    ray_v, py_v = run([python, "-c", _VERSIONS]).split()[:2]
    return ray_v, py_v


def local_versions() -> tuple[str, str]:
    import importlib.metadata

    return importlib.metadata.version("ray"), ".".join(str(x) for x in sys.version_info[:3])


def version_findings(theirs: tuple[str, str] | Exception, mine: tuple[str, str], where: str) -> list[Finding]:
    if isinstance(theirs, Exception):
        return [error("versions", f"cannot read the Ray and Python versions of {where}: {_describe_failure(theirs)}",
                      "install the same image (or install prefix) on every host")]
    out = []
    if theirs[0] != mine[0]:
        out.append(error("versions", f"Ray {theirs[0]} on {where}, {mine[0]} here", f"use Ray {mine[0]} everywhere (the same image or install on every host)"))
    # Ray pickles functions between processes: the minor version must match, patch may differ.
    if theirs[1].split(".")[:2] != mine[1].split(".")[:2]:
        out.append(error("versions", f"Python {theirs[1]} on {where}, {mine[1]} here", f"use Python {'.'.join(mine[1].split('.')[:2])} everywhere"))
    return out or [ok("versions", f"Ray {theirs[0]}, Python {theirs[1]} on {where} match this client")]


# --- the registered checks: host ------------------------------------------------------------------


def _need_gpus(ctx: Context) -> int:
    return ctx.recipe.num_gpus if ctx.recipe else 1


def _gpus(ctx: Context):
    return ctx.once("gpus", lambda: query_gpus(ctx.run))


@check("gpus", "host")
def check_gpus(ctx: Context) -> list[Finding]:
    """GPUs present, at least num_gpus of them (nvidia-smi)."""
    return gpu_findings(_gpus(ctx), _need_gpus(ctx))


@check("driver", "host")
def check_driver(ctx: Context) -> list[Finding]:
    """The driver supports the image's CUDA (stack driver_min)."""
    return driver_findings(_gpus(ctx), ctx.stack)


@check("gpu-arch", "host")
def check_arch(ctx: Context) -> list[Finding]:
    """Every GPU's compute capability is in the stack's arch_list."""
    return arch_findings(_gpus(ctx), ctx.stack)


@check("shm", "host")
def check_shm(ctx: Context) -> list[Finding]:
    """/dev/shm is large enough for NCCL, Ray and SGLang."""
    return shm_findings(ctx.run)


@check("limits", "host")
def check_limits(ctx: Context) -> list[Finding]:
    """memlock and open-file limits."""
    return limits_findings(ctx.run, ctx.mode)


@check("ports", "host")
def check_ports(ctx: Context) -> list[Finding]:
    """The Ray GCS, dashboard and gateway ports are free."""
    r = ctx.recipe
    if r is None:
        ports = {"ray_port": 6379, "ray_dashboard_port": 8265}
    elif ctx.address:
        ports = {"gateway_port": r.gateway_port}  # the cluster's own ports are in use by design
    else:
        ports = {"ray_port": r.ray_port, "ray_dashboard_port": r.ray_dashboard_port, "gateway_port": r.gateway_port}
    ours = {}
    pid = recorded_head(ctx.state_dir)
    if pid and r is not None and not ctx.address:
        ours = {r.ray_port: f"the Ray head of an earlier launch (pid {pid})", r.ray_dashboard_port: f"the Ray head of an earlier launch (pid {pid})"}
    return port_findings(ctx.run, ports, ours=ours)


# --- the registered checks: recipe files ----------------------------------------------------------


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
        out.append(error("model-config", f"{what}: the model script says {flag_says}, {config_path} says {config_says}", fix))

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
                     f"add [\"{flag}\", \"{want}\"] to extra_flags in the recipe (they come after MODEL_ARGS, so they win), or fix {script}")
    heads = _config_value(config, ("num_attention_heads",))
    kv = _config_value(config, ("num_key_value_heads",))
    if kv is not None and heads is not None and kv != heads:
        if "--group-query-attention" not in flags:
            mismatch("grouped-query attention", "no --group-query-attention", f"num_key_value_heads: {kv} (of {heads} heads)",
                     f"add [\"--group-query-attention\", \"--num-query-groups\", \"{kv}\"] to extra_flags, or fix {script}")
        elif flags.get("--num-query-groups") is None or not _same(flags["--num-query-groups"] or "", kv):
            mismatch("--num-query-groups", f"--num-query-groups {flags.get('--num-query-groups')}", f"num_key_value_heads: {kv}",
                     f"add [\"--num-query-groups\", \"{kv}\"] to extra_flags, or fix {script}")
    tied = config.get("tie_word_embeddings", True)  # transformers' default
    untied = "--untie-embeddings-and-output-weights" in flags
    if bool(tied) == untied:
        says = "--untie-embeddings-and-output-weights" if untied else "tied embeddings (no --untie-embeddings-and-output-weights)"
        fix = (f"the model script must not pass --untie-embeddings-and-output-weights for this checkpoint: fix {script} or pick the model_type of this model"
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
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        out.append(error("model-config", f"{config_path} does not exist", "set model_dir to a Hugging Face checkpoint directory (holding config.json and the weights), on every host"))
        config = None
    except (OSError, ValueError, RecursionError) as exc:
        out.append(error("model-config", f"{config_path} is not readable JSON: {exc}", "re-download the checkpoint"))
        config = None
    if config is not None and not isinstance(config, dict):
        out.append(error("model-config", f"{config_path} holds a JSON {type(config).__name__}, not an object",
                         "model_dir must be a Hugging Face checkpoint directory, whose config.json is a JSON object"))
        config = None
    margs = model_args(ctx)
    if isinstance(margs, Exception):
        out.append(error("model-config", f"cannot read MODEL_ARGS of {model_script(r)}: {_describe_failure(margs)}",
                         "check slime_dir and model_type in the recipe (model_type names scripts/models/<model_type>.sh)"))
        return out
    if config is None:
        return out
    out += compare_model(last_values([*margs, *ctx.args]), config, str(model_script(r)), str(config_path))
    return out or [ok("model-config", f"{model_script(r).name} agrees with {config_path}")]


def data_findings(path: str, where: str, rows: int = DATA_ROWS) -> list[Finding]:
    p = Path(path)
    fix_rows = 'one JSON object per line: {"prompt": "...", "metadata": {...}} (metadata is the agent\'s payload)'
    if not p.is_file():
        return [error("data", f"{where} {path} does not exist (or is not a file)", f"set {where} to a JSONL file present on every host")]
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
                except ValueError as exc:
                    bad.append(f"line {lineno}: not JSON ({exc.msg})")
                    continue
                if not isinstance(row, dict):
                    bad.append(f"line {lineno}: a {type(row).__name__}, not an object")
                    continue
                missing = [k for k in ("prompt", "metadata") if k not in row]
                if missing:
                    bad.append(f"line {lineno}: no {' and no '.join(repr(k) for k in missing)} key (keys: {', '.join(sorted(row)) or 'none'})")
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
        out.append(warning("checkpoint", f"{free / 2**30:.1f} GiB free at {existing}; a checkpoint of this model takes about {need / 2**30:.0f} GiB",
                           "free space, raise save_interval, or point checkpoint_dir elsewhere"))
    marker = ckpt / "latest_checkpointed_iteration.txt"
    resume = ""
    if marker.is_file():
        resume = f"; resumes from iteration {marker.read_text().strip()}" if r.resume else "; resume is off: existing checkpoints are kept, not loaded"
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
            out.append(error("runtime-env", f"env.{key} holds {m.group(0)!r}, which Ray replaces with the value of that variable "
                             "on the cluster (or with nothing); it has no escape for '$'",
                             f"write the value of env.{key} without '$NAME' / '${{NAME}}' (e.g. spell out the path)"))
    return out or [ok("runtime-env", f"{len(r.env)} recipe env value(s) reach the job unchanged")]


def find_catalog(ctx: Context) -> tuple[Catalog, str] | None:
    """(catalog, where) from --catalog, the image, the install, or build/; None if none."""
    if ctx.catalog:
        return load_catalog(ctx.catalog), ctx.catalog
    if ctx.mode == "container" and ctx.image:
        in_image = f"{paths.IMAGE_STATE}/{paths.FLAGS}"
        text = ctx.runner.run([ctx.docker, "run", "--rm", "--entrypoint", "cat", ctx.image, in_image],
                              step="flag catalog (in the image)", timeout=120).stdout
        where = f"{ctx.image}:{in_image}"
        return parse_catalog(text, where), where
    if ctx.mode == "host" and ctx.install_prefix:
        path = Path(ctx.install_prefix) / "flags.json"
        if path.is_file():
            return load_catalog(path), str(path)
    # A local build of this very stack: its report names the stack id (name and stack hash).
    for build in paths.local_builds(paths.ROOT / "build", ctx.stack.name):
        try:
            report = json.loads((build / paths.BUILD_REPORT).read_text())
        except (OSError, ValueError):
            continue
        path = build / "flags.json"
        if isinstance(report, dict) and report.get("stack") == ctx.stack.id and path.is_file():
            return load_catalog(path), str(path)
    return None


def flags_in(argv: Sequence[str]) -> list[str]:
    return [tok.split("=", 1)[0] for tok in argv if is_flag(tok)]


@check("flags", "recipe", needs_recipe=True)
def check_flags(ctx: Context) -> list[Finding]:
    """Every rendered flag (slime.args + MODEL_ARGS) is in the image's flag catalog."""
    r = ctx.recipe
    assert r is not None
    try:
        found = find_catalog(ctx)
    except Exception as exc:  # noqa: BLE001
        return [error("flags", f"cannot read the flag catalog: {_describe_failure(exc)}", "point at a catalog with --catalog PATH, or rebuild the image")]
    if found is None:
        return [error("flags", "no flag catalog found, so a flag slime would silently ignore cannot be caught",
                      "build or install first (it writes flags.json), point at one with --catalog PATH, or --skip-check flags")]
    catalog, where = found
    commit = catalog.slime_commit
    margs = model_args(ctx)
    argv = [*(margs if isinstance(margs, list) else []), *ctx.args]
    unknown = sorted(set(flags_in(argv)) - catalog.flags)
    out = []
    for flag in unknown:
        hint = did_you_mean(flag, sorted(catalog.flags))
        src = "extra_flags" if flag in flags_in(r.extra_flags) else ("the model script" if isinstance(margs, list) and flag in flags_in(margs) else "slime.args")
        fix = (f"did you mean {hint}? " if hint else "") + "remove it or correct its spelling"
        if catalog.version < 2:
            # A version 1 catalog is `train.py --help`: only Megatron's parser answers --help.
            fix += ("; this catalog was made from train.py --help, which lists no --sglang-*/--router-* option: "
                    "make one from slime's parsers with invoke flags.catalog (or rebuild the image)")
        out.append(error("flags", f"{flag} (from {src}) is not a flag of slime {commit[:12]} ({where}); slime would silently ignore it", fix))
    return out or [ok("flags", f"all {len(set(flags_in(argv)))} flags are in the catalog of slime {commit[:12]} "
                           f"({len(catalog.parsers) or 'help-text'} parser(s))")]


# --- the registered checks: network ---------------------------------------------------------------


def _boto_config():
    from botocore.config import Config

    return Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 1})


def _session(ctx: Context):
    import boto3

    return ctx.once("session", lambda: boto3.Session())


def _region(recipe: Recipe) -> str | None:
    parts = recipe.agent_runtime_arn.split(":")
    return parts[3] if len(parts) > 3 and parts[3] else None


@check("aws-credentials", "network", needs_recipe=True)
def check_aws_credentials(ctx: Context) -> list[Finding]:
    """AWS credentials are present (boto3's chain: env, profile, instance role)."""
    session = _session(ctx)
    if isinstance(session, Exception):
        return [error("aws-credentials", f"cannot create an AWS session: {session}", "check AWS_PROFILE and ~/.aws/config")]
    creds = session.get_credentials()
    if creds is None:
        return [error("aws-credentials", "no AWS credentials found (the rollouts call AgentCore and write to S3)",
                      "export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, set AWS_PROFILE, or run on a host with an instance role")]
    return [ok("aws-credentials", f"from {creds.method}")]


@check("s3", "network", needs_recipe=True)
def check_s3(ctx: Context) -> list[Finding]:
    """The S3 bucket is reachable (head_bucket)."""
    from botocore.exceptions import BotoCoreError, ClientError

    r = ctx.recipe
    assert r is not None
    bucket = bucket_name(r.s3_bucket)
    session = _session(ctx)
    if isinstance(session, Exception) or session.get_credentials() is None:
        return [error("s3", f"bucket {bucket} not checked: no AWS credentials", "see aws-credentials")]
    try:
        session.client("s3", region_name=_region(r), config=_boto_config()).head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code"))
        if code in ("404", "NoSuchBucket", "NotFound"):
            return [error("s3", f"bucket {bucket} does not exist", f"create it (`aws s3 mb s3://{bucket}`) or fix s3_bucket in the recipe")]
        if code in ("403", "AccessDenied", "Forbidden"):
            return [error("s3", f"access to bucket {bucket} is denied", "grant s3:ListBucket, s3:GetObject and s3:PutObject on it to these credentials")]
        return [error("s3", f"head_bucket {bucket}: {exc}", "check the bucket name, region and permissions")]
    except BotoCoreError as exc:
        return [error("s3", f"cannot reach S3 for bucket {bucket}: {exc}", "check the network, proxy and AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL")]
    return [ok("s3", f"bucket {bucket} reachable")]


@check("agentcore", "network", needs_recipe=True)
def check_agentcore(ctx: Context) -> list[Finding]:
    """The AgentCore runtime ARN is well formed and, when permissions allow, exists."""
    from botocore.exceptions import BotoCoreError, ClientError

    r = ctx.recipe
    assert r is not None
    arn = r.agent_runtime_arn
    if not ARN_RE.match(arn):
        return [error("agentcore", f"{arn!r} is not an AgentCore runtime ARN",
                      "copy the runtime ARN from `aws bedrock-agentcore-control list-agent-runtimes` (arn:aws:bedrock-agentcore:<region>:<account>:runtime/<name>-<id>)")]
    runtime_id = arn.split(":runtime/", 1)[1]
    session = _session(ctx)
    if isinstance(session, Exception) or session.get_credentials() is None:
        return [warning("agentcore", f"runtime {runtime_id}: well formed; not described (no AWS credentials)")]
    try:
        client = session.client("bedrock-agentcore-control", region_name=_region(r), config=_boto_config())
        resp = client.get_agent_runtime(agentRuntimeId=runtime_id)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code"))
        if code == "ResourceNotFoundException":
            return [error("agentcore", f"runtime {runtime_id} does not exist in {_region(r)}", "deploy the agent, or fix agent_runtime_arn (account and region too)")]
        if code in ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation"):
            return [warning("agentcore", f"runtime {runtime_id}: well formed; not described (no permission for GetAgentRuntime)")]
        return [warning("agentcore", f"runtime {runtime_id}: well formed; could not describe it ({code})")]
    except BotoCoreError as exc:
        return [warning("agentcore", f"runtime {runtime_id}: well formed; could not describe it ({exc})")]
    status = resp.get("status", "?")
    if status not in ("READY", "?"):
        return [warning("agentcore", f"runtime {runtime_id} is {status}, not READY", "wait for the deployment, or redeploy the agent")]
    return [ok("agentcore", f"runtime {runtime_id} is {status}")]


def cluster_versions(address: str) -> tuple[str, str]:
    """(Ray, Python) of the cluster at a dashboard address, through its HTTP API."""
    import urllib.request

    with urllib.request.urlopen(dashboard_url(address).rstrip("/") + "/api/version", timeout=10) as resp:
        ray_v = json.loads(resp.read())["ray_version"]
    py_v = cluster_python(address)
    return ray_v, py_v


def cluster_python(address: str) -> str:
    """The Python version of the cluster's head node, from the dashboard's node list."""
    import urllib.request

    with urllib.request.urlopen(dashboard_url(address).rstrip("/") + "/nodes?view=summary", timeout=10) as resp:
        doc = json.loads(resp.read())
    for node in doc.get("data", {}).get("summary", []):
        ver = node.get("raylet", {}).get("pythonVersion") or node.get("pythonVersion")
        if ver:
            return ver
    return "?"


@check("versions", "network")
def check_versions(ctx: Context) -> list[Finding]:
    """The Ray and Python versions of this client match the cluster's (with --address)."""
    if not ctx.address:
        return [ok("versions", "no --address: the launch starts its own head with this install's Ray")]
    try:
        theirs: tuple[str, str] | Exception = cluster_versions(ctx.address)
    except Exception as exc:  # noqa: BLE001
        return [error("versions", f"cannot reach the Ray dashboard at {ctx.address}: {exc}",
                      "start the cluster (`invoke cluster.up`) or fix --address (the dashboard's http://HOST:PORT)")]
    mine = local_versions()
    where = f"the cluster at {ctx.address}"
    if isinstance(theirs, tuple) and theirs[1] == "?":
        # The dashboard does not report Python; the cluster bootstrap checks it on each host
        # (the environment phase of `invoke cluster.up`).
        if theirs[0] != mine[0]:
            return version_findings((theirs[0], mine[1]), mine, where)
        return [ok("versions", f"Ray {theirs[0]} on {where} matches this client (its Python is not reported by the dashboard)")]
    return version_findings(theirs, mine, where)


# --- running them ---------------------------------------------------------------------------------


def run_checks(recipe: Recipe | None = None, stack: Stack | None = None, *, args: Sequence[str] | None = None, mode: str | None = None,
               address: str | None = None, catalog: str | None = None, image: str | None = None, install_prefix: str | None = None,
               skip: Iterable[str] = (), only: Iterable[str] | None = None, network: bool = True, run: Run | None = None, runner: Runner | None = None,
               state_dir: Path | None = None, environ: dict[str, str] | None = None) -> Report:
    """Run every check that applies (without a recipe: the host checks), return all findings.

    `args`: the rendered slime.args (default: rendered from the recipe). `skip`: check names whose
    errors become warnings. `only`: run just these. `network=False` leaves out AWS and the cluster."""
    from .flags import env_json, render_flags

    skip, only = set(skip), (set(only) if only is not None else None)
    unknown = sorted((skip | (only or set())) - set(CHECKS))
    if unknown:
        raise ConfigError("doctor", [Problem("--skip-check", "is not a check", name, ", ".join(CHECKS)) for name in unknown])
    if stack is None:
        stack = load_stack(recipe.stack if recipe else "cu13")
    if recipe is not None and args is None:
        args = render_flags(recipe, stack, config_path="agentcore.yaml", env_json=env_json({}), wandb=False)
    ctx = Context(stack=stack, recipe=recipe, args=list(args or []), mode=mode or (recipe.mode if recipe else "host"),
                  address=address, catalog=catalog, image=image or (recipe.image if recipe else None),
                  install_prefix=install_prefix or (recipe.install_prefix if recipe else None), run=run, runner=runner or Runner(),
                  environ=dict(os.environ if environ is None else environ), state_dir=state_dir)
    start = time.monotonic()
    findings: list[Finding] = []
    for chk in CHECKS.values():
        if only is not None and chk.name not in only:
            continue
        if chk.needs_recipe and recipe is None:
            continue
        if chk.scope == "network" and not network:
            continue
        try:
            got = chk.fn(ctx)
        except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others
            got = [error(chk.name, f"the check itself failed: {type(exc).__name__}: {exc}", f"--skip-check {chk.name} to go on, and report this")]
        if chk.name in skip:
            got = [Finding(f.check, WARNING, f"(skipped) {f.message}", f.fix) if f.level == ERROR else f for f in got]
        findings += got
    return Report(findings, time.monotonic() - start)
