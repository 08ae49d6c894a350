"""Install benchmark: the test stack's install script in a container from the local Debian base
(real bash, uv from PyPI, git sources, patches): fresh install time and no-op re-run time
(target under 2 s; measured inside the container, so `docker exec` overhead is not counted).

Run from the repository root:  python benchmarks/install_bench.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import build_support as bs  # noqa: E402

from slimeforge.image.builder.build import default_ca_bundle  # noqa: E402
from slimeforge.image.builder.install import render_install_script  # noqa: E402
from slimeforge.image.sources import parse_sources  # noqa: E402
from slimeforge.image.stack import load_stack  # noqa: E402


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="slimeforge-install-bench-"))
    repos = bs.make_repos(root / "repos")
    stack = load_stack(str(bs.TEST_STACK))
    local = parse_sources(stack, [f"slime={repos['slime']}", f"libdemo={repos['libdemo']}"])
    script = root / "install.sh"
    script.write_text(render_install_script(stack, "/opt/sf", None, local, root / "cache"))
    argv = ["docker", "run", "-d", "-v", f"{root}:{root}:ro"]
    ca = default_ca_bundle()
    if ca:
        argv += ["-v", f"{ca}:/etc/slimeforge-ca.crt:ro", "-e", "SF_CA_BUNDLE=/etc/slimeforge-ca.crt"]
    cid = subprocess.run([*argv, "slimeforge-test/base:bookworm", "sleep", "infinity"], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        def timed() -> float:
            out = subprocess.run(["docker", "exec", cid, "bash", "-c",
                                  f"s=$(date +%s.%N); bash {script} >/dev/null 2>&1 || exit 1; "
                                  "e=$(date +%s.%N); echo \"$e - $s\" | bc -l 2>/dev/null || python3 -c "
                                  "\"print($e-$s)\""],
                                 capture_output=True, text=True, check=True).stdout.strip()
            return round(float(out), 3)

        fresh = timed()
        noop = [timed() for _ in range(3)]
        print(json.dumps({"fresh_install_s": fresh, "noop_rerun_s": noop}, indent=2))
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
