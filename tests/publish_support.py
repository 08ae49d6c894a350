"""Real services for the publish tests (and benchmarks/publish_noop.py): a distribution registry on
loopback with TLS from its own CA and htpasswd users, and a TCP proxy that resets connections."""

from __future__ import annotations

import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from helpers import free_port  # tests/ is on sys.path in pytest runs and in benchmarks/publish_noop.py

REGISTRY_BIN = "/usr/bin/docker-registry"  # Debian's docker-registry: the CNCF distribution registry 2.8
DOCKER_CERTS_DIR = Path("/etc/docker/certs.d")


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate it signed, valid for 127.0.0.1 and localhost (any port)."""
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    key, csr = directory / "server.key", directory / "server.csr"
    crt, ext = directory / "server.crt", directory / "server.ext"
    run = lambda *argv: subprocess.run(argv, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
        "/CN=slimeforge publish test CA",
        "-keyout", ca_key, "-out", ca_crt, "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", key, "-out", csr)
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
        "-extfile", ext, "-out", crt)
    return ca_crt, crt, key


def htpasswd(users: dict[str, str]) -> str:
    import bcrypt

    # 2a: the prefix every htpasswd reader knows; cost 5 keeps each authenticated request cheap.
    return "".join(f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=5, prefix=b'2a')).decode()}\n" for u,
                   p in users.items())


class LocalRegistry:
    """`docker-registry serve` on 127.0.0.1:<free port>, TLS, htpasswd auth, storage in `workdir`.

    The CA goes to /etc/docker/certs.d/<host>/ca.crt, where the Docker daemon (read per push, no
    restart) and slimeforge's registry client look for it; `stop` removes what `start` added.
    """

    def __init__(self, workdir: Path, users: dict[str, str] | None, tls: bool = True, bind: str = "127.0.0.1"):
        """users None: no auth; tls False: plain HTTP (as `registry:2` is run on localhost);
        bind: the address to serve on (0.0.0.0 to be reached on this host's other addresses too)."""
        self.workdir = Path(workdir)
        self.users = users
        self.tls = tls
        self.port = free_port()
        self.bind = bind
        self.host = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._trusted: list[Path] = []

    def start(self, timeout: float = 60) -> LocalRegistry:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = f"""\
version: 0.1
log: {{level: warn}}
storage:
  filesystem: {{rootdirectory: {self.workdir / 'data'}}}
http:
  addr: {self.bind}:{self.port}
  secret: slimeforge-publish-test
"""
        if self.tls:
            self.ca, crt, key = make_tls(self.workdir)
            config += f"  tls: {{certificate: {crt}, key: {key}}}\n"
        if self.users is not None:
            (self.workdir / "htpasswd").write_text(htpasswd(self.users))
            config += f"auth:\n  htpasswd: {{realm: slimeforge-test, path: {self.workdir / 'htpasswd'}}}\n"
        (self.workdir / "config.yml").write_text(config)
        self.log = open(self.workdir / "registry.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(self.workdir / "config.yml")],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        if self.tls:
            self.trust(self.host)
        ctx = ssl.create_default_context(cafile=str(self.ca)) if self.tls else None
        scheme = "https" if self.tls else "http"
        deadline = time.monotonic() + timeout
        while True:  # health gate: /v2/ answers 200, or 401 (auth required), once it serves
            try:
                urllib.request.urlopen(f"{scheme}://{self.host}/v2/", context=ctx, timeout=5)
                break
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"registry did not start: {(self.workdir / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.2)
        return self

    def trust(self, host: str) -> None:
        """Make the Docker daemon and our client trust this registry's CA for `host`."""
        target = DOCKER_CERTS_DIR / host
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.ca, target / "ca.crt")
        self._trusted.append(target)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for target in self._trusted:
            shutil.rmtree(target, ignore_errors=True)
        self._trusted.clear()
        if getattr(self, "log", None):
            self.log.close()


class ResetProxy:
    """A TCP proxy on 127.0.0.1 that resets the first `resets` connections (RST, like a flaky
    load balancer) and forwards the rest to `upstream_port`."""

    def __init__(self, upstream_port: int, resets: int = 1):
        self.upstream_port = upstream_port
        self.to_reset = resets
        self.resets = 0
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def arm(self, resets: int = 1) -> None:
        """Reset the next `resets` connections as well."""
        self.to_reset = self.resets + resets

    def __enter__(self) -> ResetProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping = True
        self._server.close()
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            if self.resets < self.to_reset:
                self.resets += 1
                # Linger 0: close() sends RST instead of FIN, so the peer sees "connection reset".
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            pair = {"open": 2, "lock": threading.Lock()}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, pair), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, pair: dict) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)  # pass the half-close on; the other direction may still flow
        except OSError:
            for s in (src, dst):  # a reset: end the other direction too
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with pair["lock"]:
            pair["open"] -= 1
            last = pair["open"] == 0
        if last:  # the second pump to finish closes both ends
            src.close()
            dst.close()
