"""Kernel check: one small operation of every compiled piece on the GPU, compared with torch.

Pieces: apex, transformer_engine, torch_memory_saver, flash_attn.cute (FA4), flash_attn_2 (FA2,
cu129). Runs with the install's (or the image's) Python; standard library + torch only. Each piece is
imported the way its users import it (torch first: the extensions need torch's libraries loaded)
and runs in its own forked process, so a crash or a hang of one piece is reported by name and
does not hide the others. Each piece is `ok`, `FAILED` (with the error) or `skipped` (not
installed, or no GPU), never silently left out.

    python kernel_check.py [--json] [--only PIECE]... [--timeout S]

Exit status: 0 when no piece failed (skips are not failures), 1 when one did, 2 for bad arguments.
`--json` prints one document: {"gpu": ..., "pieces": [{"name", "status", "detail", "seconds"}], "ok"}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import re
import shutil
import subprocess
import sys
import time
import traceback

OK, FAILED, SKIPPED = "ok", "FAILED", "skipped"
MAX_TIMEOUT_S = 86_400.0
# Seconds as ASCII digits with an optional fraction (this script runs with the target's Python
# alone, without slimeforge's schema module). float() takes nan, inf, 1e999 and '٣'.
SECONDS_RE = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def seconds(text: str) -> float:
    """--timeout: more than 0 and at most a day; never nan, infinity, zero or negative."""
    value = float(text) if SECONDS_RE.fullmatch(text) else -1.0
    if not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text!r} is not a timeout: seconds, more than 0 and at most "
                                         f"{MAX_TIMEOUT_S:g} (digits, an optional fraction)")
    return value


def printable(text: str) -> str:
    """Text from a tool or an exception (a GPU name, an error message) without control characters:
    an escape sequence in it would reach the terminal, a newline would forge a report line."""
    return _CONTROL_RE.sub("?", text)


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; NaN or Inf anywhere counts as infinitely wrong."""
    import torch

    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def need(err: float, bound: float, what: str) -> str:
    if not err <= bound:
        raise AssertionError(f"{what}: relative error {err:.3g} over {bound:g}")
    return f"{what} {err:.1e}"


# --- the pieces: each returns a one-line detail or raises -----------------------------------------


def check_apex() -> str:
    import torch
    import torch.nn.functional as F

    # isort: split
    # amp_C needs torch's libraries loaded first (it is imported after torch by its users, too).
    import amp_C
    from apex.multi_tensor_apply import multi_tensor_applier
    from apex.normalization import FusedLayerNorm, FusedRMSNorm

    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    ln = FusedLayerNorm(1024).cuda().to(torch.bfloat16)
    rms = FusedRMSNorm(1024).cuda().to(torch.bfloat16)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5), ln.bias.uniform_(-0.5, 0.5), rms.weight.uniform_(0.5, 1.5)
    done = [need(rel_err(ln(x), F.layer_norm(x.float(), (1024,), ln.weight.float(), ln.bias.float())), 1e-2,
                 "FusedLayerNorm"),
            need(rel_err(rms(x), F.rms_norm(x.float(), (1024,), rms.weight.float(), eps=rms.eps)), 1e-2,
                 "FusedRMSNorm")]
    tensors = [torch.randn(n, device="cuda") for n in (1000, 65536, 7, 300000)]
    overflow = torch.zeros(1, dtype=torch.int, device="cuda")
    norm, _ = multi_tensor_applier(amp_C.multi_tensor_l2norm, overflow, [tensors], False)
    ref = torch.linalg.vector_norm(torch.cat(tensors).double())
    done.append(need(rel_err(norm.reshape(()), ref), 1e-5, "multi_tensor_l2norm"))
    return ", ".join(done)


def check_transformer_engine() -> str:
    import torch
    import transformer_engine.pytorch as te

    torch.manual_seed(0)
    layer = te.Linear(1024, 1024, bias=True, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    w, b = layer.weight.float(), layer.bias.float()
    done = [need(rel_err(y, x.float() @ w.t() + b), 1e-2, "Linear bf16 forward")]
    g = torch.randn_like(y)
    y.backward(g)
    done.append(need(rel_err(x.grad, g.float() @ w), 1e-2, "backward dgrad"))
    done.append(need(rel_err(layer.weight.grad, g.float().t() @ x.float()), 1e-2, "wgrad"))
    if torch.cuda.get_device_capability() >= (8, 9):
        from transformer_engine.common.recipe import DelayedScaling, Format

        recipe = DelayedScaling(fp8_format=Format.HYBRID)
        autocast = getattr(te, "autocast", None)
        ctx = autocast(enabled=True, recipe=recipe) if autocast else te.fp8_autocast(enabled=True, fp8_recipe=recipe)
        with torch.no_grad(), ctx:
            y8 = layer(x.detach())
        done.append(need(rel_err(y8, x.float() @ w.t() + b), 0.1, "fp8 (DelayedScaling) forward"))
    else:
        done.append("fp8 not run (compute capability < 8.9)")
    return ", ".join(done)


def check_torch_memory_saver() -> str:
    import torch
    from torch_memory_saver import torch_memory_saver as tms

    # "torch" hook mode: the allocator is plugged in process (the "preload" mode needs LD_PRELOAD
    # set before the process starts); both modes are the same compiled library's.
    tms.hook_mode = "torch"
    size = 512 << 20
    with tms.region(enable_cpu_backup=True):
        t = torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda")
    want = t[:: 1 << 16].clone()
    total = int(t.sum(dtype=torch.int64))
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    tms.pause()
    torch.cuda.synchronize()
    released = torch.cuda.mem_get_info()[0] - free_before
    if released < 0.9 * size:
        raise AssertionError(f"pause released {released >> 20} MiB of a {size >> 20} MiB region")
    tms.resume()
    torch.cuda.synchronize()
    if not torch.equal(t[:: 1 << 16], want) or int(t.sum(dtype=torch.int64)) != total:
        raise AssertionError("the region's contents differ after resume")
    return f"pause released {released >> 20} MiB of {size >> 20} MiB, contents back after resume"


def check_fa4() -> str:
    import torch
    import torch.nn.functional as F
    from flash_attn.cute import flash_attn_func

    q, k, v = (torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    out = out[0] if isinstance(out, tuple) else out
    ref = (F.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t
                                            in (q, k, v)), is_causal=True).transpose(1, 2))
    return need(rel_err(out, ref), 1e-2, "causal attention vs SDPA")


def check_fa2() -> str:
    import torch
    import torch.nn.functional as F
    from flash_attn import flash_attn_func

    q, k, v = (torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    ref = (F.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t
                                            in (q, k, v)), is_causal=True).transpose(1, 2))
    return need(rel_err(out, ref), 1e-2, "causal attention vs SDPA")


# name -> (module that says it is installed, function). FA2 (cu129's flash-attn step) is
# flash_attn_2_cuda; cu13 has FA4 alone (flash_attn.cute).
PIECES = {
    "apex": ("apex", check_apex),
    "transformer_engine": ("transformer_engine", check_transformer_engine),
    "torch_memory_saver": ("torch_memory_saver", check_torch_memory_saver),
    "flash_attn.cute": ("flash_attn.cute", check_fa4),
    "flash_attn_2": ("flash_attn_2_cuda", check_fa2),
}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _piece_child(name: str, conn) -> None:
    module, fn = PIECES[name]
    try:
        import torch  # noqa: F401 - first, the way the pieces' users import them

        if not installed(module.split(".")[0]) or not installed(module):
            conn.send((SKIPPED, "not installed"))
            return
        conn.send((OK, fn()))
    except BaseException as exc:  # noqa: BLE001 - reported by name, with the error
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
        conn.send((FAILED, printable(f"{type(exc).__name__}: {exc}".strip()[:600] + where)))


def run_piece(name: str, timeout: float) -> dict:
    start = time.monotonic()
    ctx = multiprocessing.get_context("fork")  # the parent never touched CUDA: forking is safe
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_piece_child, args=(name, send), daemon=True)
    proc.start()
    send.close()
    status, detail = FAILED, f"no result within {timeout:g} s"
    if recv.poll(timeout):
        try:
            status, detail = recv.recv()
        except EOFError:
            proc.join(5)
            detail = f"its process ended without a result (exit code {proc.exitcode})"
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return {"name": name, "status": status, "detail": printable(str(detail)),
            "seconds": round(time.monotonic() - start, 2)}


def gpu_name() -> str | None:
    """The first GPU the driver lists (`nvidia-smi -L`), or None: "is there a GPU" for the kernel
    check and the smoke test (`--probe`, steps.sh's sf_gpu_present). The node agent keeps its own
    copy (its one nvidia-smi query lists every GPU); tests/unit/test_kernel_check.py pairs the two."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = [line for line in out.splitlines() if line.startswith("GPU ")]
    return printable(gpus[0].split(":", 1)[1].split("(UUID")[0].strip())[:200] if gpus else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one small operation of every compiled piece on the GPU against "
                                             "torch.")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    ap.add_argument("--only", action="append", choices=sorted(PIECES), help="check just this piece (repeatable)")
    ap.add_argument("--timeout", type=seconds, default=300.0, help="seconds a piece may take (default 300)")
    ap.add_argument("--probe", action="store_true",
                    help="only say whether a GPU is present: its name and exit 0, else exit 1")
    args = ap.parse_args(argv)
    if args.probe:
        found = gpu_name()
        print(found or "no GPU")
        return 0 if found else 1
    start = time.monotonic()
    names = args.only or list(PIECES)
    gpu = gpu_name()
    if gpu is None:
        results = [{"name": n, "status": SKIPPED, "detail": "no GPU", "seconds": 0.0} for n in names]
    else:
        results = []
        for n in names:
            results.append(run_piece(n, args.timeout))
            if not args.json:
                r = results[-1]
                print(f"{r['name']}: {r['status']}: {r['detail']} ({r['seconds']:.1f} s)", flush=True)
    failed = [r["name"] for r in results if r["status"] == FAILED]
    doc = {"gpu": gpu, "pieces": results, "ok": not failed, "seconds": round(time.monotonic() - start, 2)}
    if args.json:
        print(json.dumps(doc))
    else:
        if gpu is None:
            for r in results:
                print(f"{r['name']}: skipped: no GPU")
        print(f"kernel check: {len(results) - len(failed)} of {len(results)} piece(s) not failed"
              + (f"; FAILED: {', '.join(failed)}" if failed else "") + f" ({doc['seconds']:.1f} s, GPU: "
                                                                       f"{gpu or 'none'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
