"""The image container mode runs on the lab: the test base, Ray at the version slimeforge pins (the
Jobs SDK here must equal the cluster's Ray), and the stand-in slime at the image's /root/slime
(where a recipe's slime_dir points by default).

Built with this machine's Docker engine and kept under a tag made from everything it is built from
(the Dockerfile, the Ray pin, the stand-in's files), so a re-run finds it and builds nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
STANDIN_SLIME = ROOT / "tests" / "fixtures" / "slime"
REPO = "slimeforge-test/lab-ray"
# The lab registry's storage, kept between runs like the image itself: an image pushed once (by
# its id) is not pushed again. Only ever written by netlab.NetLab.publish.
REGISTRY_STORE = Path("/var/tmp/slimeforge-test/lab-registry")

# The Ray steps are those of tests/integration/test_run_in_image.py: BuildKit reuses its layers.
DOCKERFILE = """\
FROM {base}
# Ray at the lock's version, in a venv first on PATH: the image's python3 is the job's. The CA
# bundle of this machine (a TLS proxy may sit between it and PyPI) is a build secret, not a layer.
RUN --mount=type=secret,id=ca-bundle,target=/run/secrets/ca-bundle python3 -m venv /opt/ray && \\
    PIP_CERT=/run/secrets/ca-bundle /opt/ray/bin/pip install --no-cache-dir 'ray[default]=={ray}'
ENV PATH=/opt/ray/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY slime /root/slime
"""
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def pinned_ray() -> str:
    """Ray's version in the stack's lock (what pyproject.toml pins for the Jobs SDK too)."""
    text = (ROOT / "images" / "locks" / "pylock.cu13.toml").read_text()
    m = re.search(r'^name = "ray"\nversion = "([^"]+)"', text, re.M)
    if not m:
        raise RuntimeError("images/locks/pylock.cu13.toml holds no ray")
    return m.group(1)


def content_tag(base: str, ray: str) -> str:
    h = hashlib.sha256(DOCKERFILE.format(base=base, ray=ray).encode())
    for path in sorted(p for p in STANDIN_SLIME.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(b"\0" + path.relative_to(STANDIN_SLIME).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def lab_ray_image(base: str, ray: str | None = None) -> str:
    """REPO:TAG in this machine's engine: the one already built from the same content, or a new build."""
    ray = ray or pinned_ray()
    image = f"{REPO}:{content_tag(base, ray)}"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0:
        return image
    context = Path(tempfile.mkdtemp(prefix="sf-lab-image-"))
    try:
        shutil.copytree(STANDIN_SLIME, context / "slime", ignore=shutil.ignore_patterns("__pycache__"))
        (context / "Dockerfile").write_text(DOCKERFILE.format(base=base, ray=ray))
        # Debian's docker client runs BuildKit without buildx (DESIGN.md); nothing is pulled.
        r = subprocess.run(["/usr/bin/docker", "build", "--quiet", "--secret", f"id=ca-bundle,src={CA_BUNDLE}",
                            "--tag", image, str(context)],
                           capture_output=True, text=True, timeout=1800, env={**os.environ, "DOCKER_BUILDKIT": "1"})
        if r.returncode != 0:
            raise RuntimeError(f"docker build of {image} failed:\n{(r.stdout + r.stderr)[-3000:]}")
    finally:
        shutil.rmtree(context, ignore_errors=True)
    return image
