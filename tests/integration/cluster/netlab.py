"""A lab of SSH hosts on this machine: network namespaces with their own IP addresses and sshd.

    switch namespace:   bridge br0 ── veth ── host namespace 1 (eth0 10.213.X.1, sshd)
                                  ├── veth ── host namespace 2 (eth0 10.213.X.2, sshd)
                                  ├── ...
                                  └── veth ── root namespace (10.213.X.254: tests reach every host)

With `private` paths, each host's sshd (and so everything started over ssh: the node agent, Ray,
a job) runs in a mount namespace of its own too, with an empty tmpfs over each of those paths: a
host sees its own files there, and only what is not private is shared (as an NFS mount would be).
`lab.run_in(host, argv)` runs a command in a host's mount namespace (to put per-host files there).

With `docker=True`, each host runs a Docker daemon of its own in its network and mount namespaces
(its own data root, exec root, socket and managed containerd; no bridge, no iptables): `docker run
--network host` over ssh to a host puts the container on that host's address and its volumes on
that host's files. The hosts' sshd sets DOCKER_HOST to their own daemon. `--gpus all` works as on
a GPU host (without devices): a stand-in nvidia-container-runtime-hook on the daemon's PATH makes
it register the nvidia device driver. A distribution registry listens on the lab's gateway
(plain HTTP, which every host's daemon is told to allow): `lab.publish(image)` puts an image of
this machine's engine there and returns it by digest, as `invoke publish` would.

The bridge lives in a namespace of its own, not in the root namespace, because Docker sets the
root namespace's iptables FORWARD policy to DROP and br_netfilter makes bridged traffic go through
it; a fresh namespace has empty iptables. Only addresses in 10.213.X.0/24 (X chosen free) are
created and used. Everything created is recorded and removed by `stop()`, processes by pid.

Used by tests/integration/cluster/conftest.py and benchmarks/cluster_bench.py.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

GPU_CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu"  # real nvidia-smi outputs
SSHD = "/usr/sbin/sshd"
REGISTRY = "/usr/bin/docker-registry"  # Debian's docker-registry: the CNCF distribution registry
DOCKER_DATA = "{workdir}/dr"  # the hosts' Docker data roots (<workdir>/dr/<host>): a tmpfs per host


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)


def can_run_docker_lab() -> str | None:
    """None when each lab host can run a Docker daemon of its own, else why not."""
    for tool in ("dockerd", "containerd", "docker", "nsenter", REGISTRY):
        if not shutil.which(tool):
            return f"{tool} not found (apt-get install docker.io docker-registry util-linux)"
    if sh("docker", "info", check=False).returncode != 0:
        return "no Docker Engine answers here (the test image is built with it)"
    return None


def can_create_namespaces() -> str | None:
    """None when this machine can run the lab, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns, sshd as root)"
    for tool in ("ip", SSHD, "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"{tool} not found (apt-get install iproute2 openssh-server openssh-client)"
    name = f"sfcprobe{os.getpid()}"
    r = sh("ip", "netns", "add", name, check=False)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    sh("ip", "netns", "del", name, check=False)
    return None


@dataclass
class LabHost:
    name: str
    netns: str
    ip: str
    sshd_pid: int | None = None


@dataclass
class NetLab:
    size: int
    private: tuple[str, ...] = ()  # paths each host sees as its own (a tmpfs per host); "{workdir}" is the lab's
    docker: bool = False  # a Docker daemon per host, in its namespaces, and a registry on the gateway
    registry_store: Path | None = None  # the registry's storage, kept between runs (default: in the workdir)
    tag: str = field(default_factory=lambda: _fresh_tag())
    hosts: list[LabHost] = field(default_factory=list)
    subnet: str = ""
    _namespaces: list[str] = field(default_factory=list)
    _root_link: str | None = None
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _daemons: list[subprocess.Popen] = field(default_factory=list)  # the registry, then dockerd per host
    _made: list[Path] = field(default_factory=list)  # mount points made outside the workdir

    REGISTRY_PORT = 5000  # on the gateway's address, which is this lab's own

    def __post_init__(self) -> None:
        if self.docker:
            # Each daemon's containerd shims put their sockets under /run/containerd/s: the host's own.
            # Each daemon's data root is a tmpfs of the host's own as well: the images it pulls (about
            # 1 GB a host for the lab's Ray image) are written to memory, not the disk, and are gone
            # with the host's mount namespace at stop, where removing them from the disk took most of
            # a container lab's teardown.
            self.private = (*self.private, "/run/containerd", DOCKER_DATA)

    @property
    def workdir(self) -> Path:
        # Short: Ray temp dirs and ssh control sockets live under it (Unix socket path limits).
        return Path("/tmp") / self.tag

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.254"

    @property
    def ssh_config(self) -> Path:
        return self.workdir / "ssh_config"

    @property
    def control_dir(self) -> str:
        return str(self.workdir / "cm")

    @property
    def registry(self) -> str:
        return f"{self.gateway}:{self.REGISTRY_PORT}"

    def docker_socket(self, host: LabHost) -> str:
        return str(self.workdir / "dk" / f"{host.name}.sock")

    def docker_cli(self, host: LabHost, *args: str, check: bool = True, timeout: float = 600,
                   input: bytes | None = None) -> subprocess.CompletedProcess:
        """`docker ARGS` against the host's own daemon, from this machine (the socket is on the shared /tmp)."""
        return subprocess.run(["docker", "-H", f"unix://{self.docker_socket(host)}", *args], check=check,
                              capture_output=True, timeout=timeout, input=input)

    def unused_ip(self) -> str:
        """An address in the lab's subnet that no host holds: ssh to it fails."""
        return f"{self.subnet}.99"

    # --- setup -----------------------------------------------------------------------------------

    def _pick_subnet(self) -> str:
        used = sh("ip", "-o", "-4", "addr").stdout + sh("ip", "-4", "route").stdout
        for _ in range(200):
            x = random.randrange(1, 255)
            if f"10.213.{x}." not in used:
                return f"10.213.{x}"
        raise RuntimeError("no free 10.213.X.0/24 subnet")

    def start(self) -> NetLab:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(mode=0o700)
        (self.workdir / "cm").mkdir(mode=0o700)
        self._netns_add(self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        sh("ip", "-n", self.switch, "link", "set", "lo", "up")
        # The root namespace's leg, so tests (the Jobs SDK, ssh) reach every host.
        self._root_link = f"{self.tag}r"
        sh("ip", "link", "add", self._root_link, "type", "veth", "peer", "name", "up0", "netns", self.switch)
        sh("ip", "-n", self.switch, "link", "set", "up0", "master", "br0", "up")
        # Labs start at once in parallel workers (pytest-xdist) and other sessions on this machine:
        # one at a time picks a subnet and claims it (the gateway's address in the root namespace),
        # so two labs never draw the same 10.213.X between one's look and its claim.
        with open(Path(tempfile.gettempdir()) / "slimeforge-netlab-subnet.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.subnet = self._pick_subnet()
            sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self._root_link)
        sh("ip", "link", "set", self._root_link, "up")

        self._keys()
        for i in range(1, self.size + 1):
            host = LabHost(name=f"h{i}", netns=f"{self.tag}-h{i}", ip=f"{self.subnet}.{i}")
            self._netns_add(host.netns)
            # Created directly in the two namespaces: nothing new appears in the root namespace.
            sh("ip", "-n", self.switch, "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0", "netns",
               host.netns)
            sh("ip", "-n", self.switch, "link", "set", f"h{i}", "master", "br0", "up")
            sh("ip", "-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            sh("ip", "-n", host.netns, "link", "set", "eth0", "up")
            sh("ip", "-n", host.netns, "link", "set", "lo", "up")
            self.hosts.append(host)
        self._fake_gpu_tools()
        self._client_config()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        for path in self.private_paths:
            if not Path(path).exists():
                Path(path).mkdir(parents=True)  # the mount points
                self._made.append(Path(path))
        for host in self.hosts:
            self._sshd(host)
        self._wait_for_sshd()
        if self.docker:
            self._registry()
            for host in self.hosts:
                self._dockerd(host)
            self._wait_for_dockerd()

    def _wait_for_sshd(self) -> None:
        deadline = time.monotonic() + 60
        for host in self.hosts:
            while True:
                try:
                    socket.create_connection((host.ip, 22), timeout=2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sshd in {host.netns} did not listen on {host.ip}:22; log: "
                                           f"{(self.workdir / f'sshd-{host.name}.log').read_text()}") from None
                    time.sleep(0.1)

    def _netns_add(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self._namespaces.append(name)

    def _keys(self) -> None:
        w = self.workdir
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "slimeforge-test-client", "-f", str(w / "id_ed25519"))
        shutil.copy(w / "id_ed25519.pub", w / "authorized_keys")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "slimeforge-test-host", "-f", str(w / "host_ed25519"))

    def _fake_gpu_tools(self) -> None:
        """nvidia-smi that prints outputs captured on a real 2 x H200 host (there is no GPU here)."""
        bindir = self.workdir / "bin"
        bindir.mkdir()
        data = GPU_CAPTURES / "h200-x2"
        script = bindir / "nvidia-smi"
        script.write_text(
            "#!/bin/sh\n"
            "# Outputs captured on a real 2 x H200 host (tests/fixtures/gpu/h200-x2).\n"
            'case "$*" in\n'
            "  *--query-gpu=index,name,uuid,driver_version,memory.total,compute_cap,pci.bus_id*--format=csv*) exec "
            f"cat {data / 'query-gpu.csv'} ;;\n"
            f"  *-L*) exec cat {data / 'list.txt'} ;;\n"
            f"  '') exec cat {data / 'nvidia-smi.txt'} ;;\n"
            '  *) echo "fake nvidia-smi: no captured output for: $*" >&2; exit 2 ;;\n'
            "esac\n"
        )
        script.chmod(0o755)
        if self.docker:
            # dockerd registers `--gpus` (the nvidia device driver) when this is on its PATH, and
            # runs it as each such container's prestart hook: here it reads the state and passes.
            hook = bindir / "nvidia-container-runtime-hook"
            hook.write_text("#!/bin/sh\n# Stand-in for the NVIDIA Container Toolkit's hook (no GPU here).\ncat "
                            ">/dev/null\nexit 0\n")
            hook.chmod(0o755)

    def _client_config(self) -> None:
        w = self.workdir
        pub = (w / "host_ed25519.pub").read_text().split()
        (w / "known_hosts").write_text("".join(f"{h.ip} {pub[0]} {pub[1]}\n" for h in self.hosts))
        lines = [
            "Host *",
            f"  UserKnownHostsFile {w / 'known_hosts'}",
            "  StrictHostKeyChecking yes",
            f"  IdentityFile {w / 'id_ed25519'}",
            "  IdentitiesOnly yes",
            "  User root",
        ]
        for h in self.hosts:  # aliases, as users write them in ~/.ssh/config
            lines += [f"Host {self.tag}-{h.name}", f"  HostName {h.ip}"]
        self.ssh_config.write_text("\n".join(lines) + "\n")

    def _sshd(self, host: LabHost) -> None:
        w = self.workdir
        config = w / f"sshd-{host.name}.conf"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {host.ip}",
                    "Port 22",
                    f"HostKey {w / 'host_ed25519'}",
                    "PidFile none",
                    f"AuthorizedKeysFile {w / 'authorized_keys'}",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "MaxStartups 100",
                    "MaxSessions 100",
                    "SetEnv "
                    f"PATH={w / 'bin'}:/usr/local/bin:/usr/bin:/bin"
                 + (f" DOCKER_HOST=unix://{self.docker_socket(host)}" if self.docker else ""),
                ]
            )
            + "\n"
        )
        sh(SSHD, "-t", "-f", str(config))
        log = open(w / f"sshd-{host.name}.log", "w")
        argv = ["ip", "netns", "exec", host.netns]
        if self.private_paths:
            # A mount namespace of its own (private propagation: nothing mounted here reaches the
            # root namespace or another host), a tmpfs over each private path, then sshd in it.
            mounts = " && ".join(f'mount -t tmpfs -o mode=0755,size={"16g" if raw == DOCKER_DATA else "256m"} '
                                 f'sf-{host.name} "${i + 1}"' for i, raw in enumerate(self.private))
            argv += ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                     f'{mounts} && shift {len(self.private_paths)} && exec "$@"',
                     "sh", *self.private_paths]
        argv += [SSHD, "-D", "-e", "-f", str(config)]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self._procs.append(proc)
        host.sshd_pid = proc.pid

    def _registry(self) -> None:
        """The lab's distribution registry on the gateway's address (plain HTTP: the daemons allow it)."""
        proc, _ = self._registry_process(self.registry, "lab")
        self._daemons.append(proc)
        self._wait_for_registry(self.registry, proc)

    def _registry_process(self, addr: str, name: str) -> tuple[subprocess.Popen, str]:
        w = self.workdir / "registry"
        w.mkdir(exist_ok=True)
        store = self.registry_store or w / "data"
        (w / f"{name}.yml").write_text(
            "version: 0.1\n"
            "log: {level: warn}\n"
            f"storage: {{filesystem: {{rootdirectory: '{store}'}}}}\n"
            f"http: {{addr: '{addr}'}}\n"
        )
        log = open(w / f"{name}.log", "w")
        proc = subprocess.Popen([REGISTRY, "serve", str(w / f"{name}.yml")], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        log.close()
        return proc, addr

    def _wait_for_registry(self, addr: str, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                _direct.open(f"http://{addr}/v2/", timeout=5).close()
                return
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    logs = "".join(f"\n--- {p.name}: "
                                   f"{p.read_text()[-1500:]}" for p
                                   in sorted((self.workdir / "registry").glob("*.log")))
                    raise RuntimeError(f"registry on {addr} did not answer{logs}") from None
                time.sleep(0.1)

    def _dockerd(self, host: LabHost) -> None:
        """dockerd in the host's network and mount namespaces (its sshd's): `--network host` is the
        host's, a volume the host's files; a containerd of its own (no /run/containerd/containerd.sock
        in there: dockerd starts one), no bridge or iptables rules (the lab's namespaces stay bare)."""
        assert host.sshd_pid is not None
        w = self.workdir
        for d in ("dk", "dx", "dr"):
            (w / d).mkdir(mode=0o700, exist_ok=True)
        config = w / "dk" / f"{host.name}.json"
        config.write_text("{}\n")  # not /etc/docker/daemon.json: this machine's engine's
        # `ip netns exec` gave the host's namespace a sysfs of its own, without this machine's
        # cgroup hierarchies under /sys/fs/cgroup: mount the same ones there (dockerd needs them).
        mounts = [f"mkdir -p {target} && mount -t {fstype} -o {options} {fstype} {target}" for target, fstype,
                  options in cgroup_mounts()]
        argv = ["nsenter", "--target", str(host.sshd_pid), "--mount", "--net", "--",
                "sh", "-c", " && ".join([*mounts, 'exec "$@"']), "sh",
                "dockerd", "--config-file", str(config), "--host", f"unix://{self.docker_socket(host)}",
                "--data-root", str(w / "dr" / host.name), "--exec-root", str(w / "dx" / host.name),
                "--pidfile", str(w / "dx" / f"{host.name}.pid"), "--storage-driver", self.storage_driver,
                "--bridge", "none", "--iptables=false", "--ip-masq=false", "--userland-proxy=false",
                "--insecure-registry", self.registry, "--log-level", "warn"]
        env = {"PATH": f"{w / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
        log = open(w / f"dockerd-{host.name}.log", "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        log.close()
        self._daemons.append(proc)

    @property
    def storage_driver(self) -> str:
        # overlay2 cannot stack on overlayfs (a workdir inside a container): vfs there, slow but sure.
        fs = sh("stat", "-f", "-c", "%T", str(self.workdir), check=False).stdout.strip()
        return "vfs" if fs == "overlayfs" else "overlay2"

    def _wait_for_dockerd(self) -> None:
        deadline = time.monotonic() + 90
        for host in self.hosts:
            while self.docker_cli(host, "version", "--format", "{{.Server.Version}}", check=False,
                                  timeout=30).returncode != 0:
                if time.monotonic() > deadline or any(p.poll() is not None for p in self._daemons):
                    logs = "".join(f"\n--- {p.name}: "
                                   f"{p.read_text()[-1500:]}" for p in sorted(self.workdir.glob("dockerd-*.log")))
                    raise RuntimeError(f"dockerd in {host.netns} did not answer on {self.docker_socket(host)}{logs}")
                time.sleep(0.2)

    def publish(self, image: str, repo: str = "slimeforge-lab") -> str:
        """Put `image` (of this machine's engine) in the lab's registry: REGISTRY/REPO@sha256:...
        (what `invoke publish` prints). This machine's engine pushes it to a second registry process
        on 127.0.0.1 (plain HTTP is allowed there) that writes the same storage; with a
        `registry_store` kept between runs, an image pushed once is found there by its id."""
        image_id = sh("docker", "image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
        tag = image_id.removeprefix("sha256:")[:16]
        digest = self.manifest_digest(repo, tag)
        if digest is None:
            feeder = self._registry_process(f"127.0.0.1:{_free_port()}", "feeder")
            try:
                self._wait_for_registry(feeder[1], feeder[0])
                local = f"{feeder[1]}/{repo}:{tag}"
                sh("docker", "tag", image, local)
                try:
                    r = sh("docker", "push", local, check=False)
                    if r.returncode != 0:
                        raise RuntimeError(f"docker push {local} failed: {r.stderr[-1000:]}")
                finally:
                    sh("docker", "image", "rm", local, check=False)  # the tag only: the image stays
            finally:
                feeder[0].terminate()
                feeder[0].wait(timeout=30)
            digest = self.manifest_digest(repo, tag)
        if digest is None:
            raise RuntimeError(f"the lab registry {self.registry} has no {repo}:{tag} after the push")
        return f"{self.registry}/{repo}@{digest}"

    def manifest_digest(self, repo: str, tag: str) -> str | None:
        """The digest the lab's registry serves for repo:tag (None: not there)."""
        req = urllib.request.Request(f"http://{self.registry}/v2/{repo}/manifests/{tag}", method="HEAD",
                                     headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        try:
            with _direct.open(req, timeout=30) as resp:
                return resp.headers.get("Docker-Content-Digest")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    @property
    def private_paths(self) -> list[str]:
        return [p.format(workdir=self.workdir) for p in self.private]

    def run_in(self, host: LabHost, argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
        """Run argv in the host's mount namespace (its sshd's): what that host sees of the files."""
        assert host.sshd_pid is not None
        return subprocess.run(["nsenter", "--target", str(host.sshd_pid), "--mount", "--", *argv], input=input,
                              capture_output=True, text=True, check=True)

    # --- inspection ------------------------------------------------------------------------------

    def netns_processes(self, host: LabHost) -> dict[int, str]:
        """{pid: command line} of every process in the host's network namespace."""
        out = {}
        for pid in sh("ip", "netns", "pids", host.netns, check=False).stdout.split():
            try:
                out[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0",
                                                                                  b" ").decode(errors="replace").strip()
            except OSError:
                pass
        return out

    def ray_processes(self) -> dict[str, dict[int, str]]:
        """Ray's processes per host namespace (gcs_server, raylet, dashboard, workers...)."""
        found = {}
        for host in self.hosts:
            procs = {pid: cmd for pid, cmd in self.netns_processes(host).items() if "ray" in cmd}
            if procs:
                found[host.name] = procs
        return found

    # --- teardown --------------------------------------------------------------------------------

    def stop(self) -> None:
        # The daemons first, each by its pid: dockerd stops its containers and unmounts their
        # layers, then its containerd; the registry holds nothing to save.
        for proc in self._daemons:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._daemons:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._daemons.clear()
        # ssh master connections we opened (ControlPersist) would outlive us for a minute.
        cm = self.workdir / "cm"
        if cm.is_dir():
            for sock in cm.iterdir():
                sh("ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x", check=False)
        # Anything still running inside our namespaces was started by this lab (sshd, or Ray left by
        # a failed test): end those processes, by pid.
        for host in self.hosts:
            pids = list(self.netns_processes(host))
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and _not_zombie(p) for p in pids):
                time.sleep(0.1)
            for pid in pids:
                if Path(f"/proc/{pid}").exists() and _not_zombie(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for name in reversed(self._namespaces):
            sh("ip", "netns", "del", name, check=False)
        self._namespaces.clear()
        if self._root_link:
            sh("ip", "link", "del", self._root_link, check=False)  # gone with its peer already, normally
            self._root_link = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        for path in reversed(self._made):
            try:
                path.rmdir()  # only while empty: anything put there since is not ours to remove
            except OSError:
                pass
        self._made.clear()


_TAG_COUNTER = itertools.count(random.randrange(256))


def _fresh_tag() -> str:
    """sfc + this process's pid + a byte: short (interface and namespace names, Unix socket paths
    under the workdir), unique among this process's labs (a counter, not a random draw that two labs
    of one worker can share), and never the tag of a workdir still on the disk (a lab that could not
    remove its own); _start's mkdir claims it."""
    for _ in range(256):
        tag = f"sfc{os.getpid() % 10000:04d}{next(_TAG_COUNTER) % 256:02x}"
        if not (Path("/tmp") / tag).exists():
            return tag
    raise RuntimeError("no free lab tag: 256 workdirs /tmp/sfc<pid><byte> of this pid are on the disk")


_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the lab's addresses: never through a proxy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cgroup_mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, options) of this machine's /sys/fs/cgroup, in mount order: cgroup v1's
    tmpfs and a hierarchy per controller below it, or cgroup v2's one hierarchy there."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        target = left.split()[4]
        fstype, _source, options = right.split()[:3]
        if target == "/sys/fs/cgroup" and fstype in ("tmpfs", "cgroup2"):
            found = [(target, fstype, "mode=0755" if fstype == "tmpfs" else "rw")]  # the last one mounted there counts
        elif fstype in ("cgroup", "cgroup2") and re.fullmatch(r"/sys/fs/cgroup/[a-z0-9_,=]+", target):
            keep = [o for o in options.split(",") if o not in ("rw", "ro")] if fstype == "cgroup" else []
            found.append((target, fstype, ",".join(keep) or "rw"))
    return found


def _not_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"
