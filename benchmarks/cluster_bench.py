"""Bring-up time of `cluster.up` for 1 host versus 3 hosts (the fan-out is parallel: target ratio < 1.5).

Hosts are network namespaces with their own sshd on this machine (tests/integration/cluster/netlab.py),
in host mode with this checkout's environment; every run starts cold (no ssh master connection,
no Ray), is timed from the call to `up` until the health gate saw every node ALIVE with its GPUs,
and is taken down again. Needs root (ip netns, sshd).

    python benchmarks/cluster_bench.py [--runs 3] [--json out.json]

Mind that the hosts share this machine's cores: on a 2-core machine three Ray nodes starting at
once compete for CPU, which real hosts would not. The output shows when each phase ended and how
busy the machine's CPUs were, to tell a serial fan-out from a saturated machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "cluster"))

import yaml  # noqa: E402
from netlab import NetLab, can_create_namespaces  # noqa: E402

from slimeforge.cluster import raycluster as cluster  # noqa: E402


def inventory(lab: NetLab, n: int, path: Path) -> Path:
    w = lab.workdir
    (w / "prefix").mkdir(exist_ok=True)
    (w / "prefix" / "stack.lock.json").write_text('{"stack": "bench"}\n')
    data = {
        "name": f"{lab.tag}-b{n}",
        "mode": "host",
        "prefix": str(w / "prefix"),
        "python": str(Path(sys.prefix) / "bin" / "python"),
        "state_dir": str(w / "state"),
        "system_python": str(Path(sys.prefix) / "bin" / "python"),  # runs the node agent (any python >= 3.8)
        "ssh": {"config": str(lab.ssh_config), "connect_timeout": 5},
        "ray": {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024, "start_timeout": 300},
        "hosts": [
            {"name": h.name, "address": h.ip, "role": "head" if i == 0 else "worker", "gpus": 2,
             "temp_dir": f"{w}/b{n}{h.name}"}
            for i, h in enumerate(lab.hosts[:n])
        ],
    }
    path.write_text(yaml.safe_dump(data))
    return path


class Timeline(io.StringIO):
    """The plain progress lines of `up`, with the time each phase ended on its last host."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.perf_counter()
        self.phase_end: dict[str, float] = {}

    def write(self, text: str) -> int:
        # "[cluster NAME] HOST PHASE STATUS detail"
        words = text.split()
        if len(words) >= 5 and words[4] == "ok":
            self.phase_end[words[3]] = time.perf_counter() - self.start
        return len(text)


def cpu_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    values = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values) - values[3] - values[4]) / tick, sum(values) / tick


def close_masters(lab: NetLab) -> None:
    for sock in Path(lab.control_dir).iterdir():
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="bring-ups per cluster size (default 3)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    why = can_create_namespaces()
    if why:
        print(f"cluster_bench: cannot run here: {why}", file=sys.stderr)
        return 1
    os.environ["SLIMEFORGE_STATE_HOME"] = "/tmp/sfc-bench-state"
    lab = NetLab(3).start()
    results: dict[int, list[float]] = {1: [], 3: []}
    downs: dict[int, list[float]] = {1: [], 3: []}
    usage: dict[int, list[float]] = {1: [], 3: []}
    phases: dict[int, list[dict[str, float]]] = {1: [], 3: []}
    try:
        for run in range(args.runs):
            for n in (1, 3):  # interleaved, so drift in machine load hits both sizes alike
                inv = inventory(lab, n, lab.workdir / f"bench-{n}.yaml")
                close_masters(lab)
                timeline = Timeline()
                busy0, total0 = cpu_busy()
                start = time.perf_counter()
                cluster.up(inv, control_dir=lab.control_dir, stream=timeline)
                results[n].append(time.perf_counter() - start)
                busy1, total1 = cpu_busy()
                usage[n].append((busy1 - busy0) / (total1 - total0))
                phases[n].append({k: round(v, 2) for k, v in timeline.phase_end.items()})
                start = time.perf_counter()
                cluster.down(inv, control_dir=lab.control_dir, stream=io.StringIO())
                downs[n].append(time.perf_counter() - start)
                leftover = lab.ray_processes()
                assert not leftover, f"cluster.down left Ray processes: {leftover}"
                ends = ", ".join(f"{k} {v:.1f}" for k, v in phases[n][-1].items())
                print(f"run {run + 1}: {n} host(s): up {results[n][-1]:.2f} s (phases done at: {ends}; CPU "
                      f"{usage[n][-1]:.0%} busy), down {downs[n][-1]:.2f} s", flush=True)
    finally:
        lab.stop()
    med = {n: statistics.median(v) for n, v in results.items()}
    ratio = med[3] / med[1]
    summary = {
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "runs": args.runs,
        "up_seconds": {str(n): [round(x, 2) for x in v] for n, v in results.items()},
        "down_seconds": {str(n): [round(x, 2) for x in v] for n, v in downs.items()},
        "cpu_busy_fraction": {str(n): [round(x, 2) for x in v] for n, v in usage.items()},
        "phase_done_at_seconds": {str(n): v for n, v in phases.items()},
        "median_up_1": round(med[1], 2),
        "median_up_3": round(med[3], 2),
        "ratio_3_over_1": round(ratio, 2),
        "target_ratio": 1.5,
    }
    print(f"\nbring-up, median of {args.runs}: 1 host {med[1]:.2f} s, 3 hosts {med[3]:.2f} s, ratio {ratio:.2f} "
          "(target < 1.5)")
    print(f"machine CPU busy during bring-up (median): 1 host {statistics.median(usage[1]):.0%}, 3 hosts "
          f"{statistics.median(usage[3]):.0%} of {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if ratio < 1.5 else 2


if __name__ == "__main__":
    sys.exit(main())
