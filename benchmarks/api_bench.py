"""The setup guide's call in place: how long from `SlimeRunner(...).train(num_rollout=1)` to the job
running on the Ray head it starts, how long its preflight takes (the flag catalog made from slime_dir
with this interpreter), and how long `repr(runner.render())` is.

    .venv/bin/python benchmarks/api_bench.py [--repeat 3]

An environment like slime's container in a temp dir (tests/launch_support.py: a slime tree whose
train.py parses its flags with slime's parser and checks the AgentCore config), a fake nvidia-smi
fed with a real H100 capture, this interpreter's Ray. The AWS checks are left out
(network_checks=False), as in launch_bench.py; tests/integration/test_api.py runs them on moto.
"Running" is the stand-in train.py's first line: the job's entrypoint process has started.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from helpers import free_port  # noqa: E402
from launch_support import (  # noqa: E402
    VENV_BIN,
    fake_nvidia_smi,
    head_extra_args,
    make_recipe,
    short_tmp,
    slime_in_place,
    stop_recorded_head,
)

from slimeforge import SlimeRunner  # noqa: E402
from slimeforge.run.headstate import state_dir  # noqa: E402


def guide_kwargs(work: Path, exp_id: str) -> dict:
    """The guide's keyword arguments, for the temp environment (make_recipe's mode left out: in place)."""
    data = make_recipe(work, exp_id=exp_id, ray_port=free_port(), ray_dashboard_port=free_port(),
                       gateway_port=free_port())
    del data["mode"], data["env"]
    return data


def one_train(work: Path) -> dict[str, float]:
    runner = SlimeRunner(**guide_kwargs(work, "bench-in-place"))
    slime = Path(runner.recipe.slime_dir)
    slime_in_place(slime, runner.recipe, runner.stack)
    temp = short_tmp()
    os.environ["SLIMEFORGE_RAY_HEAD_ARGS"] = " ".join(head_extra_args(temp))
    out = io.StringIO()
    t0 = time.time()
    try:
        with redirect_stdout(out):
            code = runner.train(num_rollout=1, out=str(work / "run"), network_checks=False)
        done = time.time() - t0
    finally:
        stop_recorded_head(state_dir(runner.recipe.ray_port), say=lambda _: None)
    if code != 0:
        raise SystemExit(f"train() returned {code}:\n{out.getvalue()[-3000:]}")
    started = json.loads((slime / "record.json").read_text())["started"]
    said = re.search(r"error\(s\), \d+ warning\(s\) in ([0-9.]+) s", out.getvalue())
    preflight = float(said.group(1))  # type: ignore[union-attr]
    return {"to_running": started - t0, "preflight": preflight, "train_returns": done}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sf-api-bench-") as tmp:
        root = Path(tmp)
        os.environ["SLIMEFORGE_STATE_DIR"] = str(root / "state")
        os.environ["PATH"] = f"{fake_nvidia_smi(root / 'bin', 'h100-x1')}:{VENV_BIN}:/usr/bin:/bin"
        os.environ.pop("RAY_ADDRESS", None)
        render_dir = root / "render"
        runner = SlimeRunner(**guide_kwargs(render_dir, "bench-repr"))
        print(f"len(repr(runner.render())) = {len(repr(runner.render(render_dir / 'run')))}")
        runs = [one_train(root / f"train{i}") for i in range(opts.repeat)]
        for key, label in (("to_running", "SlimeRunner(...).train() -> job running"),
                           ("preflight", "  of which the preflight (catalog made in place)"),
                           ("train_returns", "train() -> it returns 0 (job done, logs streamed)")):
            vals = [r[key] for r in runs]
            print(f"{label:<50} median {statistics.median(vals):6.2f} s  (min {min(vals):.2f}, max {max(vals):.2f}, "
                  f"n={len(vals)})")


if __name__ == "__main__":
    main()
