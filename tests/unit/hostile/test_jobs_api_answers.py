"""The Jobs API client against a stand-in dashboard on 127.0.0.1 that misbehaves: it hangs after
accepting, drips one byte at a time, answers 500, an HTML page, a status Ray does not have, a
message with terminal escape sequences, an oversized body. Every case ends within its deadline with
a NoAnswer (exit 3) that says what happened, never a traceback or a hang; real sockets, bounded."""

from __future__ import annotations

import io
import json
import socket
import socketserver
import threading
import time

import pytest

from slimeforge.errors import ConfigError
from slimeforge.run.targets import jobs
from slimeforge.run.targets.jobsapi import JobsApi, NoAnswer, TooLarge, check_versions

SID = "exp-1-20261127-230000-abcdef"
TOKEN = "0" * 32
META = {"slimeforge_exp_id": "exp-1", "slimeforge_run_token": TOKEN}


def job(status="RUNNING", **over):
    return {"submission_id": SID, "status": status, "message": "", "metadata": META, "start_time": 1, "end_time": None,
            "driver_exit_code": None, "type": "SUBMISSION", **over}


class Dashboard:
    """A stand-in Ray dashboard: `routes` maps 'METHOD path' to a behaviour (a callable of the
    handler's socket), changed by the test while it runs."""

    def __init__(self):
        self.routes: dict[str, object] = {}
        self.calls: list[str] = []
        self.bodies: list[bytes] = []
        self.release = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                self.request.settimeout(10)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = self.request.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                method, path = data.split(b" ", 2)[:2]
                key = f"{method.decode()} {path.decode()}"
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":",
                                              1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    chunk = self.request.recv(65536)
                    if not chunk:
                        return
                    body += chunk
                outer.bodies.append(body)
                outer.calls.append(key)
                behave = outer.routes.get(key, outer.routes.get("*"))
                if behave is None:
                    send(self.request, 404, b'{"detail": "not found"}')
                elif callable(behave):
                    behave(self.request, outer)
                else:
                    send(self.request, 200, json.dumps(behave).encode())

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def send(sock, status: int, body: bytes, ctype: str = "application/json") -> None:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    try:
        sock.sendall(head.encode() + body)
    except OSError:
        pass


def hang(sock, dash):
    dash.release.wait(20)


def drip(sock, dash):
    body = json.dumps(job()).encode()
    msg = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    for i in range(len(msg)):
        if dash.release.wait(0.2):
            return
        try:
            sock.sendall(msg[i:i + 1])
        except OSError:
            return


def fast(dash) -> JobsApi:
    return JobsApi(dash.address, connect_s=1, read_s=1, total_s=2)


@pytest.fixture
def dash():
    with Dashboard() as d:
        yield d


def test_a_dashboard_that_never_answers_ends_at_the_read_deadline(dash):
    dash.routes["*"] = hang
    t = time.monotonic()
    with pytest.raises(NoAnswer) as e:
        fast(dash).job(SID)
    assert time.monotonic() - t < 3
    assert "no answer while reading for 1 s" in str(e.value) and f"GET /api/jobs/{SID}" in str(e.value)
    assert e.value.exit_code == 3


def test_one_byte_every_few_tenths_ends_at_the_total_deadline(dash):
    dash.routes["*"] = drip  # each read gets a byte well within read_s: only the total deadline ends it
    t = time.monotonic()
    with pytest.raises(NoAnswer) as e:
        JobsApi(dash.address, connect_s=1, read_s=5, total_s=1.5).job(SID)
    took = time.monotonic() - t
    assert 1.4 < took < 3, took
    assert "no complete answer within 1.5 s" in str(e.value) and "each read 5 s" in str(e.value)


def test_http_500_and_an_html_page_are_named_not_parsed(dash):
    dash.routes[f"GET /api/jobs/{SID}"] = lambda s, d: send(s, 500, b"Internal Server Error \x1b[31mboom")
    with pytest.raises(NoAnswer) as e:
        fast(dash).job(SID)
    assert "answered HTTP 500" in str(e.value) and "\x1b" not in str(e.value)
    dash.routes[f"GET /api/jobs/{SID}"] = lambda s, d: send(s, 200, b"<html><body>Sign in</body></html>", "text/html")
    with pytest.raises(NoAnswer, match="not JSON .*<html><body>Sign in"):
        fast(dash).job(SID)


@pytest.mark.parametrize(("field", "value", "said"), [
    ("status", "RESTARTING", "is not one of Ray's job statuses"),
    ("status", None, "is not one of Ray's job statuses"),
    ("driver_exit_code", "1", "is not an exit code"),
    ("driver_exit_code", 10**12, "is not an exit code"),
    ("driver_exit_code", True, "is not an exit code"),
    ("message", "x" * 20000, "is not text of at most"),
    ("metadata", {"k": ["v"]}, "is not a map"),
    ("start_time", -5, "is not milliseconds"),
    ("submission_id", "../../etc", "is not a submission id"),
])
def test_a_field_out_of_grammar_is_refused_by_name(dash, field, value, said):
    dash.routes[f"GET /api/jobs/{SID}"] = job(**{field: value})
    with pytest.raises(NoAnswer) as e:
        fast(dash).job(SID)
    assert f"field {field!r} {said}" in str(e.value)


def test_an_answer_about_another_job_is_refused(dash):
    dash.routes[f"GET /api/jobs/{SID}"] = job(submission_id="other-20261127-230000-abcdef")
    with pytest.raises(NoAnswer, match="answered for job 'other"):
        fast(dash).job(SID)


def test_an_oversized_answer_is_cut(dash):
    dash.routes[f"GET /api/jobs/{SID}/logs"] = lambda s, d: send(s, 200, b'{"logs": "' + b"a" * (65 << 20) + b'"}')
    with pytest.raises(TooLarge, match="more than 64 MiB"):
        JobsApi(dash.address, total_s=20).logs(SID)


def test_a_message_with_escape_sequences_reaches_the_terminal_quoted_and_inert(dash):
    dash.routes["GET /api/jobs/"] = [job("FAILED", message="\x1b]0;pwned\x07\x1b[2J oops\nforged: SUCCEEDED")]
    dash.routes[f"GET /api/jobs/{SID}"] = job("FAILED", message="\x1b]0;pwned\x07\x1b[2J oops\nforged: SUCCEEDED")
    st = jobs.remote_status(dash.address, "exp-1")
    text = "\n".join(st.lines)
    assert "\x1b" not in text and "\x07" not in text and "\nforged" not in text
    assert 'Ray says: "?]0;pwned??[2J oops?forged: SUCCEEDED"' in st.lines[0]
    assert st.data["status"] == "FAILED"


def test_a_closed_port_is_a_clear_no_answer():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(NoAnswer, match="does not answer .connecting: .*refused"):
        JobsApi(f"http://127.0.0.1:{port}", total_s=2).job(SID)


def test_another_ray_version_is_refused_naming_both(dash):
    dash.routes["GET /api/version"] = {"version": "4", "ray_version": "0.0.1", "ray_commit": "x"}
    with pytest.raises(ConfigError) as e:
        check_versions(fast(dash), "cluster lab")
    assert e.value.exit_code == 2 and "runs Ray 0.0.1" in str(e.value) and ("pip install "
                                                                           "'ray[default]==0.0.1'") in str(e.value)
    dash.routes["GET /api/version"] = {"ray_version": "2.60.0\x1b[2J"}
    with pytest.raises(NoAnswer, match="gave no Ray version"):
        check_versions(fast(dash), "cluster lab")


def test_follow_reads_again_when_the_log_stops_while_the_job_runs(dash):
    """The log stops growing and the logs endpoint fails for a while: the job still runs, so the
    follower asks again, prints only what is new, and returns when the job has ended."""
    state = {"n": 0}

    def logs(sock, d):
        state["n"] += 1
        n = state["n"]
        if n in (3, 4):
            send(sock, 503, b"busy")
            return
        text = "step 1\n" + ("step 2 \x1b[31mred\x1b[0m\n" if n >= 5 else "")
        send(sock, 200, json.dumps({"logs": text}).encode())
        if n >= 7:
            dash.routes[f"GET /api/jobs/{SID}"] = job("SUCCEEDED", driver_exit_code=0)

    dash.routes[f"GET /api/jobs/{SID}"] = job("RUNNING")
    dash.routes[f"GET /api/jobs/{SID}/logs"] = logs
    out, said = io.StringIO(), []
    info = jobs.follow(fast(dash), SID, None, out, said.append, poll_s=0.05, lost_s=5)
    assert info.status == "SUCCEEDED" and jobs.exit_code(info) == 0
    assert out.getvalue() == "step 1\nstep 2 ?[31mred?[0m\n"  # each line once, no escape sequence
    assert any("does not answer" in s and "HTTP 503" in s for s in said)


def test_follow_gives_up_with_a_clear_error_when_the_head_is_gone(dash):
    dash.routes["*"] = lambda s, d: s.close()  # the connection drops at once, every time
    t = time.monotonic()
    with pytest.raises(NoAnswer) as e:
        jobs.follow(fast(dash), SID, None, io.StringIO(), lambda _: None, poll_s=0.05, lost_s=1)
    assert time.monotonic() - t < 5
    assert f"while following job {SID}" in str(e.value) and e.value.exit_code == 3


def test_remote_stop_refuses_a_job_slimeforge_did_not_submit(dash):
    dash.routes[f"GET /api/jobs/{SID}"] = job(metadata={"slimeforge_exp_id": "exp-1"})
    with pytest.raises(Exception, match="refused"):
        jobs.remote_stop(dash.address, SID)
    assert not any("stop" in c for c in dash.calls)


# --- restarts (--max-restarts): a stand-in cluster whose jobs and nodes the test scripts ---------

class Cluster:
    """Serves the upload, the submission and each submitted job's state: attempt n's final state is
    outcomes[n-1] (after one RUNNING poll); `dead_after` marks a node DEAD once that attempt ended."""

    def __init__(self, outcomes: list[str], dead_after: set[int]):
        self.outcomes, self.dead_after = outcomes, dead_after
        self.submitted: list[dict] = []
        self.polls: dict[str, int] = {}
        self.nodes = {"a" * 32: ["ALIVE", "10.0.0.1"], "b" * 32: ["ALIVE", "10.0.0.2"]}

    def __call__(self, sock, dash):
        key = dash.calls[-1]
        method, path = key.split(" ", 1)
        if method == "PUT" or method == "GET" and path.startswith("/api/packages/"):
            send(sock, 200 if method == "PUT" else 404, b"{}")
        elif key == "GET /api/version":
            from slimeforge.run.targets.jobsapi import local_ray_version
            send(sock, 200, json.dumps({"ray_version": local_ray_version()}).encode())
        elif key == "GET /api/v0/nodes?limit=10000&detail=false":
            rows = [{"node_id": k, "state": v[0], "node_ip": v[1]} for k, v in self.nodes.items()]
            send(sock, 200, json.dumps({"result": True, "data": {"result": {"result": rows}}}).encode())
        elif key == "POST /api/jobs/":
            self.submitted.append(json.loads(dash.bodies[-1]))
            send(sock, 200, json.dumps({"submission_id": self.submitted[-1]["submission_id"]}).encode())
        elif path.startswith("/api/jobs/") and path.endswith("/logs"):
            send(sock, 200, json.dumps({"logs": f"attempt {len(self.submitted)}\n"}).encode())
        elif path.startswith("/api/jobs/"):
            sid = path.split("/")[3]
            n = next(i for i, s in enumerate(self.submitted, 1) if s["submission_id"] == sid)
            self.polls[sid] = self.polls.get(sid, 0) + 1
            status = "RUNNING" if self.polls[sid] < 3 else self.outcomes[n - 1]
            if status != "RUNNING" and n in self.dead_after:
                self.nodes["b" * 32][0] = "DEAD"
            send(sock, 200, json.dumps({"submission_id": sid, "status": status,
                                        "metadata": self.submitted[n - 1]["metadata"],
                                        "driver_exit_code": 1 if status == "FAILED" else 0}).encode())
        else:
            send(sock, 404, b"{}")


def cluster_plan(tmp_path):
    from launch_support import make_recipe

    from slimeforge.run.recipecheck import parse_recipe
    from slimeforge.run.rundir import write_run_dir
    from slimeforge.run.targets import jobsubmit
    from slimeforge.run.targets.base import ResolvedRun

    r, stack = parse_recipe(make_recipe(tmp_path, mode="host", install_prefix="/opt/sf"), "test")
    plan = jobsubmit.ClusterTarget(jobsubmit.Cluster("x", "http://x:1")).plan(ResolvedRun(r, stack,
                                                                                          (tmp_path / "run").resolve(),
                                                                                              "test", {}))
    write_run_dir(plan.rundir)
    return plan


@pytest.mark.parametrize(("outcomes", "dead_after", "restarts", "submissions", "code", "healed"), [
    (["FAILED", "SUCCEEDED"], {1}, 2, 2, 0, 1),  # a node lost: healed, resubmitted, resumed, done
    (["FAILED", "FAILED", "FAILED"], {1, 2, 3}, 1, 2, 1, 1),  # lost every time: one restart, then its exit code
    (["FAILED", "SUCCEEDED"], set(), 2, 1, 1, 0),  # its own error, every node alive: never restarted
    (["FAILED", "SUCCEEDED"], {1}, 0, 1, 1, 0),  # restarts not asked for
])
def test_a_job_is_restarted_only_when_a_node_was_lost(tmp_path, monkeypatch, outcomes, dead_after, restarts,
                                                      submissions, code, healed):
    from launch_support import StandInChecks

    from slimeforge.run.targets import jobsubmit

    monkeypatch.setattr(jobs, "POLL_S", 0.01)
    plan = cluster_plan(tmp_path)
    stand_in = Cluster(outcomes, dead_after)
    heals: list[int] = []
    with Dashboard() as dash:
        dash.routes["*"] = stand_in

        def heal(say):
            heals.append(1)
            stand_in.nodes["b" * 32][0] = "ALIVE"

        gates: list[str] = []
        cluster = jobsubmit.Cluster("lab.yaml", dash.address, mode="host",
                                     checks=StandInChecks(heal=heal, preflight=lambda r, say: gates.append(r.exp_id)))
        said: list[str] = []
        got = jobsubmit.submit(plan, cluster, said.append, io.StringIO(), max_restarts=restarts)
    assert (got, len(stand_in.submitted), len(heals), len(gates)) == (code, submissions, healed, healed), said
    attempts = [s["metadata"]["slimeforge_attempt"] for s in stand_in.submitted]
    assert attempts == [str(i) for i in range(1, submissions + 1)]
    assert len({s["metadata"]["slimeforge_run_token"] for s in stand_in.submitted}) == 1  # one run, several attempts
    if healed:
        assert any("Ray node(s) on 10.0.0.2 were lost" in s and "restart 1 of" in s for s in said), said
