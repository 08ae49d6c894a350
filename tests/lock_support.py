"""A real PEP 503/691 simple index on loopback, serving wheels the tests build themselves, for the
lock tests: `invoke lock` resolves against it with the real uv, and the step library installs from
the lock it wrote. Also the lock tests' stack and a tiny base image pushed to a registry over its
API. Nothing is mocked; only the packages are small."""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import json
import sys
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path


def make_wheel(directory: Path, name: str, version: str, requires: list[str] | None = None, payload: str = "") -> Path:
    """A pure-Python wheel of `name` (one module, the METADATA, WHEEL and RECORD files)."""
    dist = name.replace("-", "_")
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires or []]
    files = {
        f"{dist}/__init__.py": f"VERSION = {version!r}\n{payload}",
        f"{dist}-{version}.dist-info/METADATA": "\n".join(meta) + "\n",
        f"{dist}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: slimeforge-tests\nRoot-Is-Purelib: "
                                             "true\nTag: py3-none-any\n",
    }
    record = []
    for arc, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}-{version}.dist-info/RECORD,,")
    files[f"{dist}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for arc, text in files.items():
            zf.writestr(zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0)), text)
    return path


BACKEND = '''"""A PEP 517 backend in the sdist itself; it imports {needs} at once, so it builds only where
that is already installed (a build without isolation, after the wheels of its step)."""
import base64, hashlib, os, zipfile
import {needs}  # noqa: F401

NAME, VERSION = {name!r}, {version!r}


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    dist = NAME.replace("-", "_")
    info = f"{{dist}}-{{VERSION}}.dist-info"
    files = {{f"{{dist}}/__init__.py": "BUILT = True\\n",
             f"{{info}}/METADATA": f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\n",
             f"{{info}}/WHEEL": "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}}
    record = [f"{{a}},sha256={{base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()}},"
              f"{{len(t)}}" for a, t in files.items()]
    files[f"{{info}}/RECORD"] = "\\n".join(record + [f"{{info}}/RECORD,,"]) + "\\n"
    name = f"{{dist}}-{{VERSION}}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for a, t in files.items():
            zf.writestr(a, t)
    return name
'''


def make_sdist(directory: Path, name: str, version: str, needs: str) -> Path:
    """An sdist whose in-tree build backend imports `needs`; its metadata is static in
    pyproject.toml, so resolving it never builds it."""
    import io
    import tarfile

    dist = name.replace("-", "_")
    root = f"{dist}-{version}"
    files = {
        "pyproject.toml": f'''[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n
[project]\nname = "{name}"\nversion = "{version}"\ndependencies = []\n''',
        "PKG-INFO": f"Metadata-Version: 2.2\nName: {name}\nVersion: {version}\n",
        "backend.py": BACKEND.format(needs=needs, name=name, version=version),
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{root}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for arc, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{root}/{arc}")
            info.size, info.mtime = len(data), 1767225600
            tar.addfile(info, io.BytesIO(data))
    return path


# When the tests' files were "uploaded" unless a test says otherwise: before any cutoff a lock takes.
UPLOADED = "2026-01-01T00:00:00Z"


@dataclass
class Index:
    """A directory served as `<url>/simple/<project>/`: PEP 503 HTML (with PEP 592 yanked files),
    and PEP 691 JSON with PEP 700 upload times to a client that asks for it (uv does), which
    `--exclude-newer` compares with its cutoff. `upload_times=False`: HTML only, as an index
    without upload times (download.pytorch.org) serves."""

    root: Path
    yanked: set[str] = field(default_factory=set)
    upload_times: bool = True
    url: str = ""
    uploaded: dict[str, str] = field(default_factory=dict)  # file name -> its upload time
    _server: http.server.ThreadingHTTPServer | None = None

    def add(self, name: str, version: str, requires: list[str] | None = None, payload: str = "",
            uploaded: str = UPLOADED) -> Path:
        wheel = make_wheel(self.root / "files", name, version, requires, payload)
        self.uploaded[wheel.name] = uploaded
        self.write_pages()
        return wheel

    def add_sdist(self, name: str, version: str, needs: str, uploaded: str = UPLOADED) -> Path:
        sdist = make_sdist(self.root / "files", name, version, needs)
        self.uploaded[sdist.name] = uploaded
        self.write_pages()
        return sdist

    def write_pages(self) -> None:
        projects: dict[str, list[Path]] = {}
        for whl in sorted([*(self.root / "files").glob("*.whl"), *(self.root / "files").glob("*.tar.gz")]):
            projects.setdefault(whl.name.split("-")[0].replace("_", "-").lower(), []).append(whl)
        for project, wheels in projects.items():
            links, files = [], []
            for whl in wheels:
                data = whl.read_bytes()
                sha = hashlib.sha256(data).hexdigest()
                yanked = ' data-yanked="withdrawn"' if whl.name in self.yanked else ""
                escaped = html.escape(whl.name)
                links.append(f'<a href="../../files/{escaped}#sha256={sha}"{yanked}>{escaped}</a><br/>')
                files.append({"filename": whl.name, "url": f"../../files/{whl.name}", "hashes": {"sha256": sha},
                              "size": len(data),
                              "upload-time": self.uploaded.get(whl.name, UPLOADED),
                              "yanked": "withdrawn" if whl.name in self.yanked else False})
            page = self.root / "simple" / project / "index.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
            versions = sorted({f["filename"].split("-")[1].removesuffix(".tar.gz") for f in files})
            (page.parent / "index.json").write_text(json.dumps({"meta": {"api-version": "1.1"}, "name": project,
                                                                "versions": versions, "files": files}))

    def start(self) -> Index:
        root = str(self.root)
        json_pages = self.upload_times

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=root, **kwargs)

            def do_GET(self):  # noqa: N802 - http.server's name
                page = Path(self.translate_path(self.path)) / "index.json"
                if (json_pages and self.path.endswith("/")
                        and "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "") and page.is_file()):
                    body = page.read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                super().do_GET()

            def log_message(self, *args):  # quiet: the tests read uv's output, not the server's
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # uv hangs up on a file whose hash it refuses
                pass

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/simple"
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()


# --- the lock tests' stack and base image ---------------------------------------------------

PY = f"{sys.version_info.major}.{sys.version_info.minor}"
STACK = """schema: 1
name: {name}
version: "0.0.1"
cuda: "{cuda}"
python: "{py}"
base: {{image: "{base}", glibc: "2.36"}}
torch_index: {torch_index}
image_root: /root
venv: /opt/venv
sources: {{}}
versions:
  uv: "0.9.7"
  sf-base: "1.0"
  sf-app: "1.0"
steps:
  - name: base
    pip: [sf-base]
  - name: app
    pip: [sf-app]
smoke:
  imports: [sf_app]
"""


def write_stack(directory: Path, name="sflock", cuda="13.0", torch_index="null",
                base="slimeforge-test/base:bookworm") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(STACK.format(name=name, cuda=cuda, py=PY, torch_index=torch_index, base=base))
    return path


def router_stack(directory: Path, base: str, router_url: str) -> Path:
    """The test stack with a router step: its wheel by URL, outside any index (as slime's sgl-router)."""
    path = write_stack(directory, base=base)
    path.write_text(path.read_text().replace("smoke:\n",
                                             "  - name: router\n    wheel_url: router.wheel\nrouter:\n  wheel: "
                                             f"{router_url}\nsmoke:\n"))
    return path


def _registry_put(reg, user: str, password: str, method: str, url: str, body: bytes, content_type: str) -> dict:
    import base64
    import ssl
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers={
        "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode(),
                                                                         "Content-Type": content_type})
    with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=str(reg.ca)), timeout=30) as resp:
        return dict(resp.headers)


def push_tiny_image(reg, repository: str, tag: str, user: str, password: str) -> str:
    """An image manifest (one empty config blob, one small layer) pushed over the registry API."""
    import gzip
    import hashlib
    import io
    import json
    import tarfile

    base = f"https://{reg.host}/v2/{repository}"
    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w") as tar:
        info = tarfile.TarInfo("etc/sf-base")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"sf\n"))
    layer = gzip.compress(layer_tar.getvalue(), mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers",
                         "diff_ids": ["sha256:" + hashlib.sha256(layer_tar.getvalue()).hexdigest()]}}).encode()
    for blob in (config, layer):
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        where = _registry_put(reg, user, password, "POST", f"{base}/blobs/uploads/", b"",
                              "application/octet-stream")["Location"]
        sep = "&" if "?" in where else "?"
        where = where if where.startswith("http") else f"https://{reg.host}{where}"
        _registry_put(reg, user, password, "PUT", f"{where}{sep}digest={digest}", blob, "application/octet-stream")
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(layer),
                    "digest": "sha256:" + hashlib.sha256(layer).hexdigest()}],
    }).encode()
    _registry_put(reg, user, password, "PUT", f"{base}/manifests/{tag}", manifest,
                  "application/vnd.docker.distribution.manifest.v2+json")
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


ROOT = Path(__file__).resolve().parents[1]


def fresh_clone_stack(directory: Path) -> Path:
    """cu13 as a fresh clone sees it where GitHub and Docker Hub cannot be reached: slime's git URL
    unreachable (the patch files cannot be read), the committed lock without the router wheel's
    sha256 and the base digest (the URL is no input of the lock, so the lock still matches)."""
    path = directory / "cu13.yaml"
    path.write_text(f"extends: {ROOT / 'images' / 'cu13.yaml'}\n"
                    "sources:\n  slime:\n    git: https://git.invalid/slime.git\n")
    (directory / "locks").mkdir()
    (directory / "locks" / "pylock.cu13.toml").write_text((ROOT / "images" / "locks" / "pylock.cu13.toml").read_text())
    return path
