"""benchmarks/image_size.py on a real image (issue 43.4): a library in the base and again in the
venv is a base-venv duplicate, and a file a later RUN deletes stays in its layer (what a prune in
the image's last RUN can never take out of the image)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from image_size import measure, report  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]

MB = 1_000_000
DOCKERFILE = """FROM {base}
ENV VIRTUAL_ENV=/opt/venv
RUN mkdir -p /usr/local/cuda/lib64 /opt/venv/lib/python3.12/site-packages/nvidia/cu13/lib \\
 && head -c 3000000 /dev/zero > /usr/local/cuda/lib64/libcublas.so.13 \\
 && head -c 3000000 /dev/zero > /opt/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13 \\
 && head -c 2000000 /dev/zero > /opt/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart_static.a \\
 && touch /opt/venv/pyvenv.cfg
RUN head -c 20000000 /dev/urandom > /opt/big.a
RUN rm /opt/big.a
"""


def test_duplicates_and_what_a_later_layer_hides_are_measured(base_image, tmp_path):
    (tmp_path / "Dockerfile").write_text(DOCKERFILE.format(base=base_image))
    tag = f"slimeforge-test/image-size:{tmp_path.name[-20:].lower().replace('_', '-')}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path)], check=True, capture_output=True,
                   env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin"})
    try:
        r = measure(tag, 10)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    assert r["venv"] == "/opt/venv"
    dup = next(d for d in r["duplicates"] if d["name"] == "libcublas.so.13")
    assert dup["between"] == "base-venv" and dup["extra"] == 3 * MB
    assert r["duplicates_extra"]["base-venv"] >= 3 * MB and r["duplicate_libraries_extra"] >= 3 * MB
    assert r["hidden_by_later_layers"] >= 19 * MB  # deleted by the last RUN, still in its layer
    assert r["leftovers"]["static_libraries"]["bytes"] >= 2 * MB
    text = report(r)
    assert "libcublas.so.13 x2 (base-venv)" in text and "rm /opt/big.a" in text
