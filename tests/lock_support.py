"""A real PEP 503 simple index on loopback, serving wheels the tests build themselves, for the lock
tests: `invoke lock` resolves against it with the real uv, and the step library installs from
the lock it wrote. Nothing is mocked; only the packages are small."""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
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
        f"{dist}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: slimeforge-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
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


@dataclass
class Index:
    """A directory served as `<url>/simple/<project>/` (PEP 503, with PEP 592 yanked files)."""

    root: Path
    yanked: set[str] = field(default_factory=set)
    url: str = ""
    _server: http.server.ThreadingHTTPServer | None = None

    def add(self, name: str, version: str, requires: list[str] | None = None, payload: str = "") -> Path:
        wheel = make_wheel(self.root / "files", name, version, requires, payload)
        self.write_pages()
        return wheel

    def write_pages(self) -> None:
        projects: dict[str, list[Path]] = {}
        for whl in sorted((self.root / "files").glob("*.whl")):
            projects.setdefault(whl.name.split("-")[0].replace("_", "-").lower(), []).append(whl)
        for project, wheels in projects.items():
            links = []
            for whl in wheels:
                sha = hashlib.sha256(whl.read_bytes()).hexdigest()
                yanked = ' data-yanked="withdrawn"' if whl.name in self.yanked else ""
                links.append(f'<a href="../../files/{html.escape(whl.name)}#sha256={sha}"{yanked}>{html.escape(whl.name)}</a><br/>')
            page = self.root / "simple" / project / "index.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")

    def start(self) -> Index:
        root = str(self.root)

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=root, **kwargs)

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
