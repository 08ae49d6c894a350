"""A model of the compiled set side by side, calibrated on one measured set: cheap to ask before device time.

benchmarks/compile_bench.py keeps every ninja's log on the build's clock (`ninja` in its JSON). This
replays one measured set to estimate each file's CPU-seconds (its share of the cores while it ran:
the cores shared by nice weight, none above one core; the pieces' pip and setup.py time before their
first ninja, their wheel after their last link and torch_memory_saver count as one job each), then
runs the same files under other schemes and prints each one's wall time and the pieces' ends.

    python benchmarks/compile_model.py RESULTS.json --calibrate first \
        --scheme fixed:8:4:6:0 --scheme apexpool:24:16:10 --scheme pool:32:10

Schemes: `fixed:APEX_PARALLEL:APEX_JOBS:TE_JOBS:NICE` (apex's extensions, at most APEX_JOBS files
each; TE at most TE_JOBS; TE and tms at NICE); `apexpool:SLOTS:TE_JOBS:NICE` (apex's ninjas in a
pool of SLOTS, every extension at once); `pool:SLOTS:NICE` (apex and TE in one pool);
`alone:APEX_PARALLEL:APEX_JOBS` (apex by itself); `longest:JOBS` (an order no tool here has: at most
JOBS files of any piece at once, the costliest ready file first); `cufirst:JOBS` (the same bound,
nvcc's files before the others, each ninja's order kept). In a pool each
ninja holds a slot for its first job and takes one more only when it starts a job, first come first
served (what the logs of a real pool showed). A model, not a measurement: calibrated on the `first`
set of the 16-core H200 host it gave that set 163.7 s (measured 164.3) and apex alone by
`alone:16:4` 148.3 s (measured 150.4) (docs/build.md, "Where apex's time goes"); it knows no memory,
no cache and no hyperthreads.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

DT = 0.05
# setup.py's order of apex's extensions (10417ace): the order its build threads take them.
APEX_ORDER = ["apex_C", "amp_C", "syncbn", "fused_layer_norm_cuda", "mlp_cuda", "fused_dense_cuda",
              "scaled_upper_triang_masked_softmax_cuda", "generic_scaled_masked_softmax_cuda",
              "scaled_masked_softmax_cuda", "scaled_softmax_cuda", "fused_rotary_positional_embedding",
              "fused_weight_gradient_mlp_cuda"]
N = r"([1-9][0-9]{0,2})"  # a count: 1 to 999
NICE = r"([0-9]|1[0-9])"  # 0 to 19
SCHEME_RE = re.compile(rf"(fixed):{N}:{N}:{N}:{NICE}|(apexpool):{N}:{N}:{NICE}|(pool):{N}:{NICE}|(alone):{N}:{N}|"
                       rf"(longest):{N}|(cufirst):{N}")


def weight(nice: int) -> float:
    return 1024 / 1.25 ** nice  # the kernel's nice-to-weight table, about 1.25 per step


def shares(weights: list[float], cores: int) -> list[float]:
    """Each runnable job's cores: in proportion to its weight, at most one each (water-filling)."""
    out = [0.0] * len(weights)
    left, free = list(range(len(weights))), float(cores)
    while left and free > 0:
        total = sum(weights[i] for i in left)
        capped = [i for i in left if weights[i] / total * free >= 1]
        if not capped:
            for i in left:
                out[i] = weights[i] / total * free
            break
        for i in capped:
            out[i] = 1.0
        free -= len(capped)
        left = [i for i in left if i not in capped]
    return out


def is_cu(obj: str, cu: set[str]) -> bool:
    """Whether an object file came from nvcc: nvcc's --time table names it, else apex's names say so."""
    return obj in cu or obj.endswith(("_cuda.o", "_kernel.o"))


def intervals(piece: dict) -> tuple[list[tuple[float, float, str]], dict]:
    """The jobs of one measured piece: its setup, each file, its tail; and its shape (extensions and
    their files in the order they start, the setup and tail, TE's file order)."""
    builds = [n for n in piece.get("ninja", []) if n["dir"] != "linked"]
    linked = next((n["files"] for n in piece.get("ninja", []) if n["dir"] == "linked"), [])
    jobs: list[tuple[float, float, str]] = []
    shape: dict = {"ext": {}}
    if not builds:  # torch_memory_saver: setuptools, one g++ after another
        return [(0.0, piece["wall_s"], "all")], shape
    first = min(n["ninja_start_s"] for n in builds)
    last = max([f[0] for f in linked] + [n["ninja_end_s"] for n in builds])
    jobs += [(0.0, first, "setup"), (last, piece["wall_s"], "tail")]
    cu = {t["file"].rsplit(".", 1)[0] + ".o" for t in piece.get("nvcc_time", []) if t.get("file")}
    for n in builds:
        ext = Path(n["dir"]).name
        files = sorted(n["files"], key=lambda f: (f[0], is_cu(f[2], cu), f[2]))
        shape["ext"][ext] = [f[2] for f in files]
        shape.setdefault("cu", set()).update(f[2] for f in files if is_cu(f[2], cu))
        jobs += [(f[0], f[1], f"{ext}/{f[2]}") for f in files]
    return jobs, shape


def calibrate(result: dict, set_name: str) -> tuple[dict, dict]:
    """CPU-seconds of every job of the measured set (piece/job -> s) and each piece's shape."""
    the_set = next((r for r in result["results"] if r.get("set") == set_name), None)
    if the_set is None:
        raise SystemExit(f"--calibrate {set_name!r}: no such set in the results "
                         f"(there: {', '.join(str(r.get('set', r.get('name'))) for r in result['results'])})")
    cores = result["cores"]
    jobs, shapes = [], {}
    for piece in the_set["pieces"]:
        mine, shapes[piece["piece"]] = intervals(piece)
        jobs += [(s, e, f"{piece['piece']}/{name}", piece.get("nice", 0)) for s, e, name in mine]
    cost = {j[2]: 0.0 for j in jobs}
    t, end = 0.0, max(j[1] for j in jobs)
    while t < end:
        live = [j for j in jobs if j[0] <= t < j[1]]
        for j, s in zip(live, shares([weight(j[3]) for j in live], cores), strict=True):
            cost[j[2]] += s * DT
        t += DT
    return cost, shapes


def simulate(cost: dict, shapes: dict, scheme: tuple, cores: int) -> dict[str, float]:
    """One scheme over the calibrated jobs: the time each piece ends and the set's wall."""
    kind = scheme[0]
    nice = scheme[-1] if kind not in ("alone", "longest", "cufirst") else 0
    apex_cap = scheme[2] if kind in ("fixed", "alone") else 10**6
    apex_par = scheme[1] if kind in ("fixed", "alone") else len(APEX_ORDER)
    te_cap = scheme[3] if kind == "fixed" else (scheme[2] if kind == "apexpool" else 10**6)
    slots = scheme[1] if kind in ("apexpool", "pool") else None
    order = [e for e in APEX_ORDER if e in shapes["apex"]["ext"]] + \
            [e for e in shapes["apex"]["ext"] if e not in APEX_ORDER]
    # Every ninja: its queue of files, how many run, whether it holds its pool slot; apex's threads.
    queues = {("apex", e): list(shapes["apex"]["ext"][e]) for e in order}
    if kind != "alone":
        queues.update({("te", e): list(f) for e, f in shapes["te"]["ext"].items()})
    waiting = [("apex", e) for e in order]
    started: set = set()
    runs = {k: 0 for k in queues}
    cap = {k: apex_cap if k[0] == "apex" else te_cap for k in queues}
    pooled = {k for k in queues if slots is not None and (k[0] == "apex" or kind == "pool")}
    free = slots or 0
    running: dict[str, dict] = {}
    ends: dict[str, float] = {}

    def add(name: str, piece: str, key: tuple | None = None) -> None:
        running[name] = {"rem": cost.get(name, 0.0), "w": weight(0 if piece == "apex" else nice), "key": key}

    for piece in ("apex",) if kind == "alone" else ("apex", "te", "tms"):
        add(f"{piece}/setup" if piece != "tms" else "tms/all", piece)
    ready = {"apex": False, "te": False}
    threads = apex_par
    t = 0.0
    while running or any(queues.values()):
        if kind in ("longest", "cufirst"):  # one bound over every file, in one order
            live = sum(runs.values())
            ready_files = sorted(((cost.get(f"{k[0]}/{k[1]}/{f}", 0.0) if kind == "longest" else
                                   (f in shapes[k[0]].get("cu", ()), -i), k, f)
                                  for k, q in queues.items() if ready[k[0]] for i, f in enumerate(q)),
                                 key=lambda c: c[0], reverse=True)
            for _, k, f in ready_files[:max(0, scheme[1] - live)]:
                queues[k].remove(f)
                runs[k] += 1
                add(f"{k[0]}/{k[1]}/{f}", k[0], k)
        for k, q in queues.items():
            if kind in ("longest", "cufirst"):
                break
            if not ready[k[0]] or not q:
                continue
            if k[0] == "apex" and k not in started:
                if threads == 0 or waiting[0] != k:
                    continue
            while q and runs[k] < cap[k]:
                holds = k in started
                if k in pooled and (free == 0):
                    break
                if k in pooled:
                    free -= 1
                if not holds:
                    started.add(k)
                    if k[0] == "apex":
                        threads -= 1
                        waiting.pop(0)
                runs[k] += 1
                add(f"{k[0]}/{k[1]}/{q.pop(0)}", k[0], k)
        if not running:
            break
        names = list(running)
        for n, s in zip(names, shares([running[n]["w"] for n in names], cores), strict=True):
            running[n]["rem"] -= s * DT
        t += DT
        for n in [n for n in names if running[n]["rem"] <= 0]:
            key = running.pop(n)["key"]
            piece = n.split("/", 1)[0]
            if n.endswith("/setup"):
                ready[piece] = True
            elif n.endswith("/tail") or n == "tms/all":
                ends[piece] = t
            elif key is not None:
                runs[key] -= 1
                if key in pooled and queues[key] and not runs[key]:
                    # ninja keeps the slot its shim holds: its next file starts at once
                    runs[key] += 1
                    add(f"{key[0]}/{key[1]}/{queues[key].pop(0)}", key[0], key)
                    continue
                if key in pooled:
                    free += 1
                if not queues[key] and not runs[key]:
                    if key[0] == "apex":
                        threads += 1
                    if all(not queues[k] and not runs[k] for k in queues if k[0] == piece):
                        add(f"{piece}/tail", piece)
    ends["wall"] = t
    return {k: round(v, 1) for k, v in ends.items()}


def parse_scheme(text: str) -> tuple:
    m = SCHEME_RE.fullmatch(text)
    if not m:
        raise SystemExit(f"--scheme {text!r}: expected fixed:APEX_PARALLEL:APEX_JOBS:TE_JOBS:NICE, "
                         "apexpool:SLOTS:TE_JOBS:NICE, pool:SLOTS:NICE, alone:APEX_PARALLEL:APEX_JOBS or "
                         "longest:JOBS or cufirst:JOBS "
                         "(counts 1-999, nice 0-19)")
    groups = [g for g in m.groups() if g is not None]
    return (groups[0], *map(int, groups[1:]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="compile_bench.py's --out JSON")
    ap.add_argument("--calibrate", required=True, help="the measured set to calibrate on (first, jobserver, ...)")
    ap.add_argument("--scheme", action="append", default=[], help="a scheme to run (see the module's doc)")
    ap.add_argument("--write-costs", type=Path,
                    help="write the calibrated CPU-seconds per object file (slimeforge/scripts/compile_costs.json)")
    args = ap.parse_args()
    result = json.loads(args.results.read_text())
    cost, shapes = calibrate(result, args.calibrate)
    if not {"apex", "te"} <= shapes.keys():
        raise SystemExit(f"--calibrate {args.calibrate}: the set lacks apex or TE")
    per_piece: dict[str, float] = {}
    for name, c in cost.items():
        per_piece[name.split("/", 1)[0]] = per_piece.get(name.split("/", 1)[0], 0.0) + c
    print("calibrated CPU-s: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(per_piece.items())))
    if args.write_costs:
        files = {name.rsplit("/", 1)[1]: round(c, 1) for name, c in sorted(cost.items()) if name.endswith(".o")}
        args.write_costs.write_text(json.dumps({"schema": 1, "calibrated_on": f"{args.results.name} {args.calibrate}",
                                                "costs": files}, indent=1) + "\n")
    for text in args.scheme:
        scheme = parse_scheme(text)
        ends = simulate(cost, shapes, scheme, result["cores"])
        limit = sum(v for k, v in per_piece.items() if scheme[0] != "alone" or k == "apex") / result["cores"]
        print(f"{text:24} wall {ends['wall']:6.1f} s (ratio {ends['wall'] / limit:.2f})  apex {ends.get('apex')} s  "
              f"te {ends.get('te')} s  tms {ends.get('tms')} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
