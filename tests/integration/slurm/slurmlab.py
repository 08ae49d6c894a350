"""A real Slurm cluster on this machine: slurmctld in the root namespace, one slurmd per host of a
NetLab (tests/integration/cluster/netlab.py: network namespaces with their own IP addresses).

    root namespace:  munged (private socket) ── slurmctld (10.213.X.254:<port>)
    namespace h1:    slurmd -N h1 (10.213.X.1:<port>)     count-only GPU GRES: gpu:2, no device files
    namespace h2:    slurmd -N h2 ...                      (gres.conf `Count=`; slurmd accepts it)
    namespace h3:    slurmd -N h3 ...               (+ its own mount namespace: see `private`)

The hosts share this machine's files, as a cluster shares its filesystem. `private` gives a node
a view that differs: its slurmd (and every job step it starts) runs in a mount namespace of its own
where each listed directory is covered by an empty tmpfs, so a run directory placed there exists
where the job was submitted and on the other nodes, but not on that one.

Everything is private to one lab: its own munge key and socket, slurm.conf, state and spool
directories under the lab's workdir, free ports and a unique ClusterName, so test sessions running
at the same time never see each other's jobs. Clients find the cluster through SLURM_CONF (`env`).
Daemons run in the foreground as children of this process and are stopped by pid.

Used by tests/integration/slurm/conftest.py and benchmarks/slurm_bench.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))  # netlab.py, shared with the SSH lab

from netlab import NetLab, can_create_namespaces  # noqa: E402

DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")


def can_run_slurm() -> str | None:
    """None when this machine can run the lab, else why not."""
    why = can_create_namespaces()
    if why:
        return why
    for tool in (*DAEMONS, "sbatch", "scontrol", "sinfo", "scancel", "srun"):
        if not shutil.which(tool):
            return f"{tool} not found (apt-get install slurmctld slurmd slurm-client munge)"
    return None


def client(lab_env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    """A Slurm client command against the lab (not checked: callers look at the answer)."""
    return subprocess.run(list(argv), capture_output=True, text=True, env={**os.environ, **lab_env}, check=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@dataclass
class SlurmLab:
    size: int = 3
    gpus: int = 2
    private: dict[str, Path] = field(default_factory=dict)  # node -> a directory that node cannot see
    net: NetLab = field(init=False)
    ctld_port: int = 0
    slurmd_port: int = 0
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.net = NetLab(self.size)

    @property
    def dir(self) -> Path:
        return self.net.workdir / "slurm"

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def cluster_name(self) -> str:
        return self.net.tag.replace("-", "")

    @property
    def nodes(self) -> list[str]:
        return [h.name for h in self.net.hosts]

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, scontrol, slimeforge) needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmLab:
        try:
            self.net.start()
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        d = self.dir
        for sub in ("state", "log", "run", *(f"spool/{n}" for n in self.nodes)):
            (d / sub).mkdir(parents=True, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = d / "run" / "munge.socket"
        # --force: munged refuses to run as root, and this lab runs everything as root.
        self._spawn("munged", ["/usr/sbin/munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}",
                               f"--pid-file={d / 'run' / 'munged.pid'}", f"--seed-file={d / 'run' / 'munged.seed'}",
                               f"--log-file={d / 'log' / 'munged.log'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged's socket", "munged")
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        self._write_config()
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: client(self.env, "scontrol", "ping").stdout.count("is UP") >= 1, "slurmctld to answer",
                   "slurmctld")
        for host in self.net.hosts:
            slurmd = ["/usr/sbin/slurmd", "-D", "-N", host.name, "-f", str(self.conf)]
            hidden = self.private.get(host.name)
            if hidden is not None:
                hidden.mkdir(parents=True, exist_ok=True)
                # A mount namespace of its own (private propagation: nothing leaks back), an empty
                # tmpfs over the directory, then slurmd in its place.
                cover = ("import os, subprocess, sys; subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m', "
                         "'sf-private', sys.argv[1]], check=True); "
                         "os.execv(sys.argv[2], sys.argv[2:])")
                slurmd = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c", cover,
                          str(hidden), *slurmd]
            self._spawn(f"slurmd-{host.name}", ["ip", "netns", "exec", host.netns, *slurmd])
        self._wait(self._all_idle, "every node to be idle", "slurmd-h1")

    def _write_config(self) -> None:
        d = self.dir
        net = self.net
        lines = [
            f"ClusterName={self.cluster_name}",
            # slurmctld only runs where SlurmctldHost names this host; the address is the lab's leg.
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({net.gateway})",
            "MailProg=/bin/true",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'state'}",
            # %n: every slurmd shares this filesystem, so each needs its own spool, pid and log.
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
            # No cgroups in this container: process groups track a job's processes.
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "ReturnToService=2",
            # The nodes are namespaces of one machine: take CPUs and GRES as declared here.
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "SwitchType=switch/none",
            # A requeued job may start again at once (the default holds it back for a while).
            "SchedulerParameters=defer_batch=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=600",
        ]
        for host in net.hosts:
            lines.append(f"NodeName={host.name} NodeAddr={host.ip} CPUs=2 RealMemory=1000 Gres=gpu:{self.gpus} "
                         "State=UNKNOWN")
        lines.append(f"PartitionName=gpu Nodes={','.join(self.nodes)} Default=YES MaxTime=02:00:00 State=UP")
        lines.append(f"PartitionName=small Nodes={self.nodes[0]} MaxTime=00:10:00 State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        # There are no /dev/nvidia* here. slurmd 22.05 drops a GPU GRES that has no File= ("Removing
        # file-less GPU ... from final GRES list") and then drains the node, so a count-only
        # `Name=gpu Count=N` is not enough: each GPU names a placeholder file (nothing opens it;
        # task/none constrains no devices).
        devdir = d / "dev"
        devdir.mkdir(exist_ok=True)
        for i in range(self.gpus):
            (devdir / f"gpu{i}").touch()
        files = f"{devdir}/gpu[0-{self.gpus - 1}]" if self.gpus > 1 else f"{devdir}/gpu0"
        (d / "gres.conf").write_text(f"Name=gpu Count={self.gpus} File={files}\n")
        # slurmd 22.05 loads a cgroup plugin even with proctrack/pgid; this machine's hierarchy is v1.
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / "log" / f"{name}.out", "w")  # noqa: SIM115 - the child owns it
        self._procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env={**os.environ, **self.env})
        log.close()

    def _wait(self, ready, what: str, proc: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}: {self.log(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}: {self.log(proc)}")
            time.sleep(0.2)

    def log(self, name: str) -> str:
        parts = []
        for path in (self.dir / "log" / f"{name}.out", self.dir / "log" / f"{name}.log"):
            if path.exists():
                parts.append(path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def _all_idle(self) -> bool:
        out = client(self.env, "sinfo", "-h", "-N", "-p", "gpu", "-o", "%N %t").stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return len(states) == self.size and all(s == "idle" for s in states.values())

    def stop(self) -> None:
        for name in [n for n in self._procs if n.startswith("slurmd")] + ["slurmctld", "munged"]:
            p = self._procs.get(name)
            if p and p.poll() is None:
                p.terminate()
        for p in self._procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.net.stop()  # also ends anything left in the namespaces (job steps), by pid
        # Ray's temp dirs of this lab's jobs (/tmp/sfr-<cluster>-<job>-...: the name is unique to the lab).
        for path in Path("/tmp").glob(f"sfr-{self.cluster_name[:16]}-*"):
            shutil.rmtree(path, ignore_errors=True)
