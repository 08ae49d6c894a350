"""The one client of Ray's Jobs API (the dashboard's HTTP endpoints): submit, follow, status, logs,
stop, the cluster's Ray version, the working_dir upload. Every answer is read through this module
and validated before anything else sees it, and every request has deadlines.

    api = JobsApi("http://HEAD:8265")
    api.version() -> "2.60.0"                   GET /api/version (ray_version, by grammar)
    api.job(sid) -> JobInfo | None              GET /api/jobs/{sid} (None: the head does not know it)
    api.jobs() -> list[JobInfo]                 GET /api/jobs/ (submitted jobs only)
    api.logs(sid) -> str                        GET /api/jobs/{sid}/logs
    api.submit(...) -> sid                      POST /api/jobs/
    api.stop(sid) -> bool                       POST /api/jobs/{sid}/stop
    api.upload_dir(path) -> gcs://_ray_pkg_...  GET/PUT /api/packages/gcs/... (Ray's packaging zips it)

Deadlines: connecting (CONNECT_S), each read (READ_S: no byte for that long), and the whole answer
(TOTAL_S, enforced by a timer that shuts the socket: a head that sends one byte every few seconds
still ends within it). Each is named in the error. A head that cannot be reached, or answers what
is not a Jobs API answer (an HTTP error, an HTML page, a status Ray does not have, an oversized or
malformed field), raises NoAnswer: exit 3, "the job's state cannot be learned" (docs/exit-codes.md).

Values are checked by type, bound and grammar (JobInfo.parse); a job's message keeps Ray's words
but reaches the terminal only through `shown_message` (schema.printable, quoted).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, TypedDict

from ...errors import SlimeforgeError
from ...schema import printable

JOB_STATUSES = ("PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED")  # ray.job_submission.JobStatus
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
CONNECT_S = 10.0
READ_S = 30.0
TOTAL_S = 60.0
SUBMIT_RETRY_S = 120.0  # a head whose job agent is still starting answers 500 "try again later"
UPLOAD_TOTAL_S = 600.0  # the working_dir package: a few small files, but over a slow link
MAX_ANSWER = 8 << 20  # a job's info, a stop, the version
MAX_JOBS_ANSWER = 32 << 20  # every job the head remembers
MAX_LOG_ANSWER = 64 << 20  # a job's whole log (polled: see jobs.follow)
MAX_MESSAGE = 16 << 10
MAX_META_ITEMS, MAX_META_KEY, MAX_META_VALUE = 64, 256, 4096
# Ray's own submission ids (raysubmit_XXXX) and ours (<exp_id>-YYYYmmdd-HHMMSS-<6 hex>).
RAY_SUBMISSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,159}")
RAY_VERSION_RE = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(?:[.+-]?[A-Za-z0-9.+-]{1,40})?")
PACKAGE_URI_RE = re.compile(r"gcs://(_ray_pkg_[0-9a-f]{16,64}\.zip)")


class Unreachable(SlimeforgeError):
    """A service that would tell whether the job runs (Ray's Jobs API, Slurm, docker) did not answer."""


class NoAnswer(Unreachable):
    """The Ray Jobs API did not answer within its deadlines, or answered something that is not a
    Jobs API answer: the job's state cannot be learned from it (exit 3)."""

    exit_code = 3

    def __init__(self, message: str, http_status: int | None = None):
        super().__init__(message)
        self.http_status = http_status  # the HTTP status it answered with, when it answered one


class TooLarge(NoAnswer):
    """An answer longer than this client reads (a job's whole log past MAX_LOG_ANSWER)."""


class JobDoc(TypedDict):
    """A JobInfo as run.status --json shows it (docs/json.md)."""

    submission_id: str
    status: str
    message: str
    metadata: dict[str, str]
    start_time: int | None
    end_time: int | None
    driver_exit_code: int | None


class RuntimeEnv(TypedDict):
    """What a submission asks Ray to set up for the job: the run directory uploaded (its URI) and the environment."""

    working_dir: str
    env_vars: dict[str, str]


@dataclass(frozen=True)
class JobInfo:
    """One job as the Jobs API reports it, every field checked (parse)."""

    submission_id: str
    status: str  # one of JOB_STATUSES
    message: str  # Ray's words, raw: show them through shown_message
    metadata: dict[str, str]
    start_time: int | None  # ms since the epoch
    end_time: int | None
    driver_exit_code: int | None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL

    @property
    def shown_message(self) -> str:
        """Ray's message as it may reach a terminal: control characters replaced, quoted, cut."""
        text = printable(self.message.strip())
        return f'Ray says: "{text[:2000]}"' + (" (cut)" if len(text) > 2000 else "") if text else ""

    def as_dict(self) -> JobDoc:
        return {"submission_id": self.submission_id, "status": self.status, "message": self.message,
                "metadata": dict(self.metadata),
                "start_time": self.start_time, "end_time": self.end_time, "driver_exit_code": self.driver_exit_code}

    @classmethod
    def parse(cls, doc: Any, where: str) -> JobInfo:
        """`doc`: one job's JSON object; NoAnswer naming the field and value when it is not one Ray writes."""

        def bad(field: str, why: str, value: Any) -> NoAnswer:
            return NoAnswer(f"{where}: field {field!r} {why} (got {printable(repr(value))[:200]}); "
                            "this is not an answer Ray's Jobs API gives: is the address a Ray dashboard of this Ray "
                            "version?")

        if not isinstance(doc, dict):
            raise bad("(the answer)", "is not a JSON object", type(doc).__name__)
        sid = doc.get("submission_id")
        if not isinstance(sid, str) or not RAY_SUBMISSION_ID_RE.fullmatch(sid):
            raise bad("submission_id", f"is not a submission id ({RAY_SUBMISSION_ID_RE.pattern})", sid)
        status = doc.get("status")
        if status not in JOB_STATUSES:
            raise bad("status", f"is not one of Ray's job statuses ({', '.join(JOB_STATUSES)})", status)
        message = doc.get("message")
        if message is None:
            message = ""
        if not isinstance(message, str) or len(message) > MAX_MESSAGE:
            raise bad("message", f"is not text of at most {MAX_MESSAGE} characters", message if not isinstance(message,
                                                                                                               str)
                      else f"{len(message)} "
                                                                                                                         "characters")
        meta = doc.get("metadata")
        if meta is None:
            meta = {}
        if not (isinstance(meta, dict) and len(meta) <= MAX_META_ITEMS
                and all(isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_META_KEY
                        and len(v) <= MAX_META_VALUE for k, v in meta.items())):
            raise bad("metadata", f"is not a map of at most {MAX_META_ITEMS} short strings", meta)
        times: dict[str, int | None] = {}
        for key in ("start_time", "end_time"):
            v = doc.get(key)
            if v is not None and not (type(v) is int and 0 <= v < 10**15):
                raise bad(key, "is not milliseconds since the epoch", v)
            times[key] = v
        code = doc.get("driver_exit_code")
        if code is not None and not (type(code) is int and -255 <= code <= 255):
            raise bad("driver_exit_code", "is not an exit code (an integer, -255..255)", code)
        return cls(sid, status, message, dict(meta), times["start_time"], times["end_time"], code)


def local_ray_version() -> str | None:
    """This machine's Ray (the installed distribution, without importing ray), or None."""
    from importlib import metadata

    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return None


class JobsApi:
    """Requests to one Ray dashboard, each with its deadlines; answers validated."""

    def __init__(self, address: str, *, connect_s: float = CONNECT_S, read_s: float = READ_S, total_s: float = TOTAL_S):
        parts = urllib.parse.urlsplit(address.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SlimeforgeError(f"{address!r} is not a Ray Jobs API address (http(s)://HOST:PORT)")
        self.address = address.rstrip("/")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port or (443 if self._https else 80)
        self.connect_s, self.read_s, self.total_s = connect_s, read_s, total_s

    def _deadlines(self, total: float) -> str:
        return f"deadlines: connect {self.connect_s:g} s, each read {self.read_s:g} s, the whole answer {total:g} s"

    def request(self, method: str, path: str, body: bytes | None = None, *, content_type: str | None = None,
                total_s: float | None = None, max_bytes: int = MAX_ANSWER) -> tuple[int, bytes]:
        """(HTTP status, body) of one request; NoAnswer when a deadline passes or the answer is too large."""
        total = self.total_s if total_s is None else total_s
        what = f"the Ray Jobs API at {self.address} ({method} {path})"
        conn_cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = conn_cls(self._host, self._port, timeout=min(self.connect_s, total))
        fired = threading.Event()

        def cut() -> None:  # the total deadline: a reader blocked in recv() wakes up with an error
            fired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(total, cut)
        timer.daemon = True
        start = time.monotonic()
        timer.start()
        stage = "connecting"
        try:
            conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(self.read_s)
            stage = "sending"
            headers = {"Content-Type": content_type} if content_type else {}
            conn.request(method, path, body=body, headers=headers)
            stage = "reading"
            resp = conn.getresponse()
            chunks, size = [], 0
            while True:
                chunk = resp.read(min(1 << 16, max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise TooLarge(f"{what} answered more than {max_bytes >> 20} MiB; nothing more is read")
                if fired.is_set():
                    break
            if fired.is_set():
                raise TimeoutError
            return resp.status, b"".join(chunks)
        except NoAnswer:
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if fired.is_set() or time.monotonic() - start >= total:
                raise NoAnswer(f"{what} gave no complete answer within {total:g} s "
                               f"({self._deadlines(total)})") from None
            if isinstance(exc, (socket.timeout, TimeoutError)):
                limit = self.connect_s if stage == "connecting" else self.read_s
                raise NoAnswer(f"{what}: no answer while {stage} for {limit:g} s ({self._deadlines(total)})") from None
            reason = printable(str(getattr(exc, "strerror", None) or exc) or type(exc).__name__)[:200]
            raise NoAnswer(f"{what} does not answer ({stage}: {reason})") from None
        finally:
            timer.cancel()
            conn.close()

    def json(self, method: str, path: str, body: Any = None, *, none_on_404: bool = False, total_s: float | None = None,
             max_bytes: int = MAX_ANSWER) -> Any:
        """The JSON answer of a request (None for 404 when `none_on_404`); NoAnswer for any other
        status or a body that is not JSON, showing the start of what came back."""
        data = None if body is None else json.dumps(body).encode()
        status, raw = self.request(method, path, data, content_type="application/json" if data is not None else None,
                                   total_s=total_s, max_bytes=max_bytes)
        what = f"the Ray Jobs API at {self.address} ({method} {path})"
        if status == 404 and none_on_404:
            return None
        text = raw[:300].decode("utf-8", "replace")
        if status != 200:
            raise NoAnswer(f"{what} answered HTTP {status}: {printable(text.strip())[:300]!r}", status)
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise NoAnswer(f"{what} answered something that is not JSON (starting {printable(text.strip())[:120]!r}): "
                           "is this address a Ray dashboard?") from None

    # --- the endpoints -----------------------------------------------------------------------

    def version(self) -> str:
        doc = self.json("GET", "/api/version")
        v = doc.get("ray_version") if isinstance(doc, dict) else None
        if not isinstance(v, str) or not RAY_VERSION_RE.fullmatch(v):
            raise NoAnswer(f"the Ray Jobs API at {self.address} (GET /api/version) gave no Ray version (ray_version: "
                           f"{printable(repr(v))[:100]}): is this address a Ray dashboard?")
        return v

    def job(self, sid: str) -> JobInfo | None:
        path = f"/api/jobs/{_quoted_id(sid)}"
        doc = self.json("GET", path, none_on_404=True)
        if doc is None:
            return None
        info = JobInfo.parse(doc, f"the Ray Jobs API at {self.address} (GET {path})")
        if info.submission_id != sid:
            raise NoAnswer(f"the Ray Jobs API at {self.address} answered for job {info.submission_id!r} when asked "
                           f"for {sid!r}")
        return info

    def jobs(self) -> list[JobInfo]:
        """Every submitted job the head remembers (drivers started without the Jobs API are left out)."""
        doc = self.json("GET", "/api/jobs/", total_s=max(self.total_s, 120), max_bytes=MAX_JOBS_ANSWER)
        if not isinstance(doc, list) or len(doc) > 100_000:
            raise NoAnswer(f"the Ray Jobs API at {self.address} (GET /api/jobs/) answered {type(doc).__name__}, not a "
                           "list of jobs")
        where = f"the Ray Jobs API at {self.address} (GET /api/jobs/)"
        return [JobInfo.parse(d, where) for d in doc if isinstance(d, dict) and d.get("submission_id") is not None]

    def nodes(self) -> dict[str, tuple[str, str]]:
        """Every node the cluster knows: node id -> (state, node ip), from the dashboard's state API
        (GET /api/v0/nodes); a restarted host has a DEAD entry beside its new ALIVE one."""
        path = "/api/v0/nodes?limit=10000&detail=false"
        doc = self.json("GET", path, max_bytes=MAX_JOBS_ANSWER)
        rows = doc.get("data", {}).get("result", {}).get("result") if isinstance(doc,
                                                                                 dict) and isinstance(doc.get("data"),
                                                                                                      dict) \
            and isinstance(doc["data"].get("result"), dict) else None
        if not isinstance(rows, list):
            raise NoAnswer(f"the Ray dashboard at {self.address} (GET {path}) answered no list of nodes")
        out: dict[str, tuple[str, str]] = {}
        for row in rows:
            nid, state, ip = (row.get(k) if isinstance(row, dict) else None for k in ("node_id", "state", "node_ip"))
            if not (isinstance(nid, str) and re.fullmatch(r"[0-9a-f]{16,64}", nid) and state in ("ALIVE", "DEAD")
                    and isinstance(ip, str) and re.fullmatch(r"[0-9A-Fa-f.:]{2,45}", ip)):
                raise NoAnswer(f"the Ray dashboard at {self.address} (GET {path}) answered a node that is not one: "
                               f"{printable(repr(row))[:200]}")
            out[nid] = (state, ip)
        return out

    def logs(self, sid: str) -> str:
        path = f"/api/jobs/{_quoted_id(sid)}/logs"
        doc = self.json("GET", path, total_s=max(self.total_s, 120), max_bytes=MAX_LOG_ANSWER)
        logs = doc.get("logs") if isinstance(doc, dict) else None
        if not isinstance(logs, str):
            raise NoAnswer(f"the Ray Jobs API at {self.address} (GET {path}) answered no logs text")
        return logs

    def submit(self, *, entrypoint: str, submission_id: str, metadata: dict[str, str], runtime_env: RuntimeEnv,
               retry_s: float = SUBMIT_RETRY_S) -> str:
        """Submit; a head that answers 5xx (Ray: "No available agent to submit job, please try again
        later" while its agent starts) is asked again for up to `retry_s`. The submission id makes a
        repeat safe: a job that did arrive is found under it, never submitted twice."""
        body = {"entrypoint": entrypoint, "submission_id": submission_id, "metadata": metadata,
                "runtime_env": runtime_env}
        deadline = time.monotonic() + retry_s
        while True:
            try:
                doc = self.json("POST", "/api/jobs/", body)
                break
            except NoAnswer as exc:
                there = self.job(submission_id)
                if there is not None and all(there.metadata.get(k) == v for k, v in metadata.items()):
                    return submission_id
                if exc.http_status is None or exc.http_status < 500 or time.monotonic() > deadline:
                    raise
                time.sleep(2)
        got = doc.get("submission_id") if isinstance(doc, dict) else None
        if got != submission_id:
            raise NoAnswer(f"the Ray Jobs API at {self.address} (POST /api/jobs/) answered submission id "
                           f"{printable(repr(got))[:100]}, not {submission_id!r}")
        return submission_id

    def stop(self, sid: str) -> bool:
        path = f"/api/jobs/{_quoted_id(sid)}/stop"
        doc = self.json("POST", path, {})
        stopped = doc.get("stopped") if isinstance(doc, dict) else None
        if not isinstance(stopped, bool):
            raise NoAnswer(f"the Ray Jobs API at {self.address} (POST {path}) did not say whether it stopped the job")
        return stopped

    def upload_dir(self, directory: str) -> str:
        """The working_dir package of `directory` on the head (uploaded unless it is there already):
        Ray's own packaging names and zips it; the transfer goes through this client's deadlines."""
        import tempfile
        from pathlib import Path

        # ray's zip format, not its HTTP
        from ray._private.runtime_env.packaging import create_package, get_uri_for_directory

        uri = get_uri_for_directory(directory, include_gitignore=False)
        m = PACKAGE_URI_RE.fullmatch(uri)
        if m is None:
            raise SlimeforgeError(f"Ray's packaging named the working_dir package {uri!r}, not "
                                  "gcs://_ray_pkg_<hash>.zip: a Ray this client does not know")
        path = f"/api/packages/gcs/{m[1]}"
        status, _ = self.request("GET", path)
        if status == 200:
            return uri
        if status != 404:
            raise NoAnswer(f"the Ray Jobs API at {self.address} (GET {path}) answered HTTP {status}")
        with tempfile.TemporaryDirectory(prefix="sf-pkg-") as tmp:
            package = Path(tmp) / m[1]
            create_package(directory, package, include_gitignore=False)
            status, raw = self.request("PUT", path, package.read_bytes(), content_type="application/octet-stream",
                                       total_s=UPLOAD_TOTAL_S)
        if status != 200:
            raise NoAnswer(f"the Ray Jobs API at {self.address} (PUT {path}) answered HTTP {status}: "
                           f"{printable(raw[:200].decode('utf-8', 'replace'))!r}")
        return uri


def _quoted_id(sid: str) -> str:
    if not RAY_SUBMISSION_ID_RE.fullmatch(sid):
        raise SlimeforgeError(f"{sid!r} is not a Ray submission id ({RAY_SUBMISSION_ID_RE.pattern})")
    return sid


def check_versions(api: JobsApi, where: str) -> str:
    """The cluster's Ray version, when it is this machine's; a refusal (exit 2) naming both otherwise.
    The Jobs API's packages and answers change between Ray versions: submitting across them fails late or oddly."""
    from ...errors import ConfigError, Problem

    here = local_ray_version()
    there = api.version()
    if here is None:
        raise ConfigError(where, [Problem("ray", "is not installed on this machine, which submits the job", None,
                                          f"pip install 'ray[default]=={there}' (the cluster's Ray)",
                                          show_value=False)])
    if here != there:
        raise ConfigError(where, [Problem("ray version",
                                          f"this machine has Ray {here}, the cluster at {api.address} runs Ray {there}",
                                          f"{here} / {there}",
                                          f"the same Ray on both: pip install 'ray[default]=={there}' here "
                                          "(or bring the cluster up with this machine's Ray)")])
    return there
