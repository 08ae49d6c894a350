"""The committed cu13 lock against PyPI itself (metadata only: PEP 691 JSON pages of the simple
index, never a file): every locked file exists there, at that URL, with that sha256 and size,
and is not yanked. Runs in CI, which reaches PyPI; skipped by name where it cannot."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import absent

from slimeforge.image.lock import lockfile

pytestmark = [pytest.mark.network]
PEP691 = "application/vnd.pypi.simple.v1+json"


def simple_page(name: str) -> dict:
    req = urllib.request.Request(f"https://pypi.org/simple/{name}/", headers={"Accept": PEP691})
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - a fixed https URL
        return json.loads(resp.read())


def test_committed_cu13_lock_files_exist_on_pypi_with_those_hashes():
    lock = lockfile.load_lock("cu13")
    try:
        simple_page("pip")
    except (urllib.error.URLError, OSError) as exc:
        absent(f"PyPI is not reachable from here ({exc})")
    pypi = [p for p in lock.packages.values() if p.url.startswith("https://files.pythonhosted.org/")]
    assert len(pypi) == len(lock.packages)  # cu13 locks from PyPI alone

    def problems_of(p: lockfile.Locked) -> list[str]:
        files = {f["filename"]: f for f in simple_page(p.name)["files"]}
        f = files.get(p.filename)
        if f is None:
            return [f"{p.name} {p.version}: {p.filename} is not on PyPI"]
        out = []
        if f["hashes"].get("sha256") != p.sha256:
            out.append(f"{p.name}: {p.filename} has sha256 {f['hashes'].get('sha256')} on PyPI, the lock says "
                       f"{p.sha256}")
        if f["url"] != p.url:
            out.append(f"{p.name}: {p.filename} is at {f['url']}, the lock says {p.url}")
        if p.size is not None and f.get("size") != p.size:
            out.append(f"{p.name}: {p.filename} is {f.get('size')} bytes, the lock says {p.size}")
        if f.get("yanked"):
            out.append(f"{p.name}: {p.filename} is yanked on PyPI ({f['yanked']})")
        return out

    with ThreadPoolExecutor(8) as pool:
        problems = [msg for msgs in pool.map(problems_of, pypi) for msg in msgs]
    assert problems == []
