"""Kernels (on demand: `invoke doctor --kernels`): every compiled piece of the install or image runs
one small operation right on this host's GPU, before a launch finds out an hour in.

The check is scripts/kernel_check.py (apex's fused norms and a multi-tensor op, Transformer
Engine's Linear in bf16 and fp8, torch_memory_saver's pause/resume, FA4 (cu13) or FA2 (cu129)
attention, each against torch), run with the Python of the install (host mode: <prefix>/venv) or
of the image (container mode: `docker run --gpus all`; its python3 when slimeforge did not build it).
Its one JSON report becomes findings here:
a failed piece is an error, a skipped one (not installed; no GPU: one warning for the whole check)
a warning, so neither passes unseen.
"""

from __future__ import annotations

import shlex
from typing import NotRequired, TypedDict, cast

from ... import paths, readback
from ...errors import CommandError
from ...schema import printable
from .findings import Context, Finding, check, error, ok, warning

CHECK = "kernels"
SCRIPT = paths.SCRIPTS / "kernel_check.py"
TIMEOUT_S = 900  # five pieces of 120 s at most (FA4 compiles its kernel on the first call: ~20 s)
STATUSES = ("ok", "FAILED", "skipped")
MAX_REPORT_BYTES = 1 << 20


def kernel_check_argv(ctx: Context) -> list[str] | None:
    """The command that runs the kernel check with the target's Python, or None when there is no
    install or image to check. The script goes as `-c` text: nothing needs copying first."""
    code = SCRIPT.read_text()
    if ctx.mode == "container":
        if not ctx.image:
            return None
        return [ctx.docker, "run", "--rm", "--gpus", "all", "--entrypoint", image_python(ctx), "--", ctx.image,
                "-c", code, "--json", "--timeout", "120"]
    if not ctx.install_prefix:
        return None
    return [paths.Prefix.at(ctx.install_prefix).python, "-c", code, "--json", "--timeout", "120"]


def image_python(ctx: Context) -> str:
    """The image's interpreter: the stack's venv in an image slimeforge built; in any other one
    (no /opt/slimeforge, as its probe found: run/imageprobe.py) its own python3, the one launch.sh
    runs there. An image that could not be probed is taken for slimeforge's, as before."""
    facts = ctx.image_facts()
    return "python3" if not isinstance(facts,
                                       Exception) and not facts.slimeforge_image else f"{ctx.stack.venv}/bin/python"


class KernelPiece(TypedDict):
    name: str
    status: str  # one of STATUSES
    detail: str
    seconds: float


class KernelReport(TypedDict):
    """scripts/kernel_check.py's report, as parse_report lets it through."""

    gpu: NotRequired[str | None]  # None or absent: no GPU here, nothing ran
    pieces: list[KernelPiece]


def parse_report(text: str) -> KernelReport:
    """The kernel check's JSON report (its last line of output), validated: a report read back is
    input. Raises ValueError naming what is wrong."""
    if len(text) > MAX_REPORT_BYTES:
        raise ValueError(f"its output is {len(text)} bytes, over {MAX_REPORT_BYTES}")
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        raise ValueError("it printed nothing")
    try:
        doc = readback.json_loads(lines[-1])
    except ValueError as exc:
        raise ValueError(f"its last line is not JSON ({getattr(exc, 'msg', exc)}): "
                         f"{printable(lines[-1][:200])}") from None
    pieces = doc.get("pieces") if isinstance(doc, dict) else None
    if not isinstance(pieces, list) or not pieces:
        raise ValueError("its report has no list of pieces")
    for p in pieces:
        if not (isinstance(p, dict) and isinstance(p.get("name"), str) and p.get("status") in STATUSES
                and isinstance(p.get("detail"), str) and isinstance(p.get("seconds"), int | float)):
            raise ValueError(f"a piece of its report is not {{name, status ({'/'.join(STATUSES)}), detail, seconds}}: "
                             f"{str(p)[:200]}")
        if any(not c.isprintable() for c in p["name"] + p["detail"]):
            raise ValueError(f"piece {p['name']!r}: control characters in its report")
    if not (doc.get("gpu") is None or isinstance(doc.get("gpu"), str)):
        raise ValueError("its report's gpu is neither a name nor null")
    if isinstance(doc.get("gpu"), str):  # a tool's text on the way to the terminal: no escape sequences
        doc["gpu"] = printable(doc["gpu"])[:200]
    return cast(KernelReport, doc)  # every key read above checked


# A piece of the kernel check -> the smoke import that makes it part of a stack (Stack.smoke).
PIECE_IMPORTS = {"apex": "amp_C", "transformer_engine": "transformer_engine.pytorch",
                 "torch_memory_saver": "torch_memory_saver",
                 "flash_attn.cute": "flash_attn.cute", "flash_attn_2": "flash_attn_2_cuda"}


def kernel_findings(doc: KernelReport, where: str, fix: str, stack_imports: list[str] | None = None) -> list[Finding]:
    """Findings of a kernel check's report. `stack_imports` (the stack's smoke imports): a piece
    not installed that the stack does not have either (FA2 on cu13) is as it should be."""
    gpu = doc.get("gpu") or "no GPU"
    if doc.get("gpu") is None:  # one line for the whole check: nothing could run
        names = ", ".join(p["name"] for p in doc["pieces"])
        return [warning(CHECK, f"no GPU here: the kernels of {where} were not checked ({names})",
                        "run it on a host with a GPU")]
    out: list[Finding] = []
    for p in doc["pieces"]:
        name, status, detail = p["name"], p["status"], p["detail"]
        if status == "skipped" and detail == "not installed" and stack_imports is not None \
                and PIECE_IMPORTS.get(name) not in stack_imports:
            out.append(ok(CHECK, f"{name}: not part of this stack, not installed"))
        elif status == "ok":
            out.append(ok(CHECK, f"{name} ran right on {gpu} ({detail}; {p['seconds']:.1f} s)"))
        elif status == "skipped":
            out.append(warning(CHECK, f"{name} not checked in {where}: {detail}",
                               "run it on a host with a GPU" if detail == "no GPU" else "install the stack completely"))
        else:
            out.append(error(CHECK, f"{name} FAILED on {gpu} in {where}: {detail}", fix))
    return out


@check(CHECK, "gpu")
def check_kernels(ctx: Context) -> list[Finding]:
    """Every compiled piece runs one operation right on this host's GPU (--kernels; seconds per piece)."""
    argv = kernel_check_argv(ctx)
    if argv is None:
        return [error(CHECK, f"no {'image' if ctx.mode == 'container' else 'install prefix'} to check the kernels of",
                      "give --image IMAGE (container mode) or --prefix PREFIX (host mode), or a recipe")]
    if ctx.mode == "container" and (blocker := ctx.image_blocker(CHECK)):
        return [blocker]
    where = f"image {ctx.image}" if ctx.mode == "container" else f"the install at {ctx.install_prefix}"
    # The fix is built from validated values (--image by its grammar, --prefix absolute), quoted as
    # a shell reads them; it runs the image's own copy of the script and mounts nothing from the host.
    if ctx.mode != "container":
        fix = ("install again (`invoke install`); "
              f"`{shlex.join([argv[0], f'{ctx.install_prefix}/.slimeforge/kernel_check.py'])}` shows the whole error")
    # not slimeforge's image: no copy of the script in it
    elif (python := argv[argv.index("--entrypoint") + 1]) == "python3":
        fix = (f"a piece that fails is one of {ctx.image}'s own (its python3 ran slimeforge's kernel check, given as "
               "text, nothing mounted): "
               "rebuild that image, or build one with `invoke build`")
    else:
        rerun = shlex.join([argv[0], 'run', '--rm', '--gpus', 'all', '--entrypoint', python, '--', str(ctx.image),
                            '/opt/slimeforge/kernel_check.py'])
        fix = f"rebuild the image (`invoke build`) and read its smoke test; `{rerun}` shows the whole error"
    # The script exits 1 when a piece failed, and still prints its report: read it either way.
    try:
        res = ctx.runner.run(argv, step="kernel check", check=False, timeout=TIMEOUT_S)
    except CommandError as exc:  # not found, or past the timeout (its argv holds the whole script: not shown)
        tail = exc.output.strip().splitlines()[-1:]
        return [error(CHECK, f"the kernel check could not run with {argv[0]} (exit {exc.returncode})"
                      + (f": {printable(tail[0][:300])}" if tail else ""), fix)]
    try:
        doc = parse_report(res.stdout)
    except ValueError as exc:
        if res.returncode:
            tail = (res.stdout + res.stderr).strip().splitlines()[-1:]
            return [error(CHECK, f"the kernel check could not run with {argv[0]} (exit {res.returncode})"
                          + (f": {printable(tail[0][:300])}" if tail else ""), fix)]
        return [error(CHECK, f"the kernel check's report cannot be read: {exc}", fix)]
    return kernel_findings(doc, where, fix, ctx.stack.smoke.all_imports)
