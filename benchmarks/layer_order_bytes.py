"""Bytes a node pulls when one input changes, before and after the layer order of issue 32, from the lock.

A layer is rebuilt, and so pulled again by every node, when its step or any earlier step changed.
This reads each step's slice of the flavor's lock and takes the wheels' sizes (the lock records
each file's size; a wheel is a deflate zip, about what the gzip layer of its unpacked files weighs)
as the weight of its layer, then sums, for each change, the layers from the first one it touches:

  before: the stack's plan order, each patch applied in the step of what it patches (sglang's in
          sglang's RUN, Megatron's in Megatron's), slime's requirements and checkout one step;
  after:  the rendered order (steps.step_commands): slime's requirements at slime's place, the
          patches one late step, slime's checkout last.

Layers without wheels (a checkout, the patches' files, the final COPYs and finalize) weigh 0 here:
they are in both orders and are measured on a real image by benchmarks/image_pull_bench.py
(--late-tree /root/slime gives the checkout's). The router wheel's size is not in the lock (a URL
outside any index): 0 too.

    python benchmarks/layer_order_bytes.py [--cuda cu13]
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slimeforge.image.stack import load_stack  # noqa: E402
from slimeforge.image.steps import PATCHES_STEP, image_layout, step_commands  # noqa: E402


def wheel_bytes(lock_path: Path) -> tuple[dict[str, int], dict[str, list[str]]]:
    doc = tomllib.loads(lock_path.read_text())
    size = {}
    for p in doc["packages"]:
        files = [*(p.get("wheels") or []), *([p["sdist"]] if p.get("sdist") else [])]
        size[p["name"]] = int(files[0].get("size", 0)) if files else 0
    return size, doc["tool"]["slimeforge"]["steps"]


def pulled(order: list[tuple[str, int]], first: str) -> int:
    names = [n for n, _ in order]
    return sum(b for _, b in order[names.index(first):]) if first in names else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", default="cu13")
    args = parser.parse_args()
    stack = load_stack(args.cuda)
    size, slices = wheel_bytes(ROOT / "images" / "locks" / f"pylock.{args.cuda}.toml")
    weight = {step: sum(size.get(n, 0) for n in names) for step, names in slices.items()}
    before = [(s.name, weight.get(s.name, 0)) for s in stack.plan]
    after = [(c.name, weight.get(c.lock_file[:-4], 0) if c.lock_file else 0) for c in step_commands(stack,
                                                                                                    image_layout(stack))]
    patched = {p.file: next(s.name for s in stack.plan if p in s.patches) for p in stack.used_patches()}
    print(f"{args.cuda}: wheel bytes per layer, before -> after")
    for name, b in after:
        print(f"  {name:<24} {b / 1e6:9.1f} MB")
    rows = [("a new slime commit (patches unchanged)", pulled(before, "slime"), pulled(after, "slime"))]
    rows += [(f"... that changes a patch of {step}", pulled(before, step), pulled(after, PATCHES_STEP))
             for step in dict.fromkeys(patched.values())]
    print(f"{'change':<44} {'before MB':>10} {'after MB':>10}")
    for what, b, a in rows:
        print(f"{what:<44} {b / 1e6:>10.1f} {a / 1e6:>10.1f}")
    print("(plus, in both orders, slime's checkout, the final COPYs and finalize's layer; for a patch change, the "
          "patched files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
