"""All-reduce across this host's GPUs with NCCL; check the sum and print the bus bandwidth.

Standalone on purpose (the standard library and torch, nothing of slimeforge), so it runs on a GPU
host as it is, and `invoke cluster.up --nccl-check` copies it to every host:

    python3 slimeforge/scripts/nccl_check.py --size-mb 256          # one process per visible GPU
    python3 slimeforge/scripts/nccl_check.py --size-mb 256 --json   # plus one JSON line at the end

Bus bandwidth is nccl-tests' figure for all-reduce: algbw * 2 (n - 1) / n, with algbw = bytes / time
and GB = 1e9 bytes, so the numbers compare with `all_reduce_perf`. Exit status 0 when every rank got
the right sum, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nccl_version(torch) -> str:
    v = torch.cuda.nccl.version()  # a tuple in recent torch, an int such as 21805 in older ones
    return ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=args.timeout),
        device_id=torch.device("cuda", rank),
    )
    try:
        numel = args.size_mb * 1024 * 1024 // 4  # float32
        x = torch.empty(numel, dtype=torch.float32, device="cuda")

        # Correctness first: rank r contributes r + 1 everywhere, so every element must equal the
        # sum 1 + 2 + ... + world on every rank. A wrong sum is a broken link, not a slow one.
        x.fill_(rank + 1)
        dist.all_reduce(x)
        expected = world * (world + 1) / 2
        wrong = int((x != expected).sum().item())
        if wrong:
            raise RuntimeError(f"rank {rank}: {wrong} of {numel} elements have the wrong sum (expected {expected})")

        for _ in range(args.warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        elapsed = torch.tensor([(time.perf_counter() - start) / args.iters], device="cuda", dtype=torch.float64)
        # The slowest rank decides the collective's time.
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if rank == 0:
            seconds = elapsed.item()
            size = numel * 4
            algbw = size / seconds / 1e9
            busbw = algbw * 2 * (world - 1) / world
            result = {
                "host": socket.gethostname(),
                "gpus": world,
                "gpu_name": torch.cuda.get_device_name(0),
                "size_bytes": size,
                "iters": args.iters,
                "time_ms": round(seconds * 1e3, 3),
                "algbw_gbps": round(algbw, 2),
                "busbw_gbps": round(busbw, 2),
                "torch": torch.__version__,
                "nccl": nccl_version(torch),
                "ok": True,
            }
            note = "" if world > 1 else " (one GPU: nothing to reduce across, bus bandwidth is 0 by definition)"
            print(
                f"nccl_check: {result['host']}: {world} x {result['gpu_name']}, {args.size_mb} MiB all-reduce "
                f"x{args.iters}: "
                f"{result['time_ms']} ms, algbw {algbw:.1f} GB/s, busbw {busbw:.1f} GB/s{note}",
                flush=True,
            )
            if args.json:
                print(json.dumps(result), flush=True)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=256, help="tensor size in MiB (default 256)")
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces first (default 5)")
    parser.add_argument("--gpus", type=int, default=0, help="number of GPUs (default: all visible)")
    parser.add_argument("--timeout", type=int, default=300, help="NCCL collective timeout in seconds (default 300)")
    parser.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    args = parser.parse_args(argv)

    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print("nccl_check: torch is not installed for this python (" + sys.executable + ")", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("nccl_check: no CUDA device visible (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    world = args.gpus or torch.cuda.device_count()
    if world > torch.cuda.device_count():
        print(f"nccl_check: --gpus {world} but only {torch.cuda.device_count()} visible", file=sys.stderr)
        return 1

    # NVLink SHARP (NVLS) multicast is off, always: it needs fabric manager support that VMs and
    # partitioned hosts lack, a failure in it can take a shared host's GPUs out of service, and it
    # is not what this check measures (the NCCL ring/tree path that training uses).
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    try:
        mp.spawn(worker, args=(world, free_port(), args), nprocs=world, join=True)
    except Exception as exc:  # a rank failed: its traceback is already on stderr
        print(f"nccl_check: FAILED: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"host": socket.gethostname(), "gpus": world, "ok": False, "error": str(exc)[-2000:]}),
                  flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
