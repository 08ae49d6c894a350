"""Publishing against real services: a TLS registry with htpasswd auth on loopback, the Docker
Engine, and moto's server for the ECR API (which hosts no layers: ECR pushes go to the registry)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import free_port
from publish_support import LocalRegistry, ResetProxy

from slimeforge.image.publish.publish import PublishError, PublishOptions, plan, publish, read_credentials
from slimeforge.image.remote import ecr
from slimeforge.image.remote.registry import Credentials, RegistryAPI, RegistryError, Retry

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = f"publish-{uuid.uuid4().hex}"
ENV = {"SF_PUBLISH_PASSWORD": PASSWORD}
REGION = "us-east-1"
ECR_HOST = f"123456789012.dkr.ecr.{REGION}.amazonaws.com"  # moto's default account
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def fake_aws(mp: pytest.MonkeyPatch) -> None:
    """moto's credentials, and no profile or endpoint of the user's: set for one test (or one
    fixture's setup) at a time, never for the session (no test leaks environment variables)."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": REGION}.items():
        mp.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_ECR"):
        mp.delenv(name, raising=False)


@pytest.fixture(scope="session")
def moto_server():
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def moto_ecr(moto_server, monkeypatch):
    fake_aws(monkeypatch)
    return moto_server


@pytest.fixture(scope="session")
def registry(docker_engine, moto_server, tmp_path_factory):
    # Users: ours, and the login an ECR token decodes to, so ECR publishes can push here with it.
    with pytest.MonkeyPatch.context() as mp:
        fake_aws(mp)
        ecr_login, _ = ecr.login(ecr.client(REGION, moto_server), ecr.parse_ecr_host(ECR_HOST))
    reg = LocalRegistry(tmp_path_factory.mktemp("publish-registry"),
                        {"publisher": PASSWORD, ecr_login.username: ecr_login.password}).start()
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def built_image(base_image):
    """A small image on the test base, unique to this session (the build helper's code is not
    used here: its report.json is written by `make_build`, by the keys of the interface)."""
    import docker

    client = docker.from_env()
    marker = uuid.uuid4().hex
    repo, tag = "slimeforge-publish-test/cu13", marker[:12]
    dockerfile = f"FROM {base_image}\nRUN echo {marker} > /slimeforge-publish-test\n"
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=f"{repo}:{tag}", rm=True)
    yield {"repo": repo, "tag": tag, "ref": f"{repo}:{tag}", "human": "2026.11.1-cu13", "id": image.id}
    try:
        client.api.remove_image(image.id, force=True)  # every tag this session put on it (unique names)
    except docker.errors.NotFound:
        pass


def make_build(root: Path, image: dict) -> Path:
    """A build directory as the build writes it: report.json and stack.lock.json."""
    from slimeforge.image.stack import load_stack

    stack = load_stack("cu13")
    d = root / f"cu13-{image['tag']}"
    d.mkdir(parents=True)
    report = {"tag": image["ref"], "human_tags": [f"{image['repo']}:{image['human']}"], "image_id": image["id"],
              "digest": None}
    (d / "report.json").write_text(json.dumps(report, indent=2))
    (d / "stack.lock.json").write_text(json.dumps({"stack": stack.id, "hash": stack.hash, "pins": stack.pins(),
                                                   "digest": None}))
    return d


def cli(*args: str, input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "publish", *args], cwd=ROOT, input=input, text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=600)


def test_publish_build_pull_by_digest_and_republish_is_a_noop(registry, built_image, tmp_path):
    import docker

    build = make_build(tmp_path / "build", built_image)
    dest = f"{registry.host}/publish-test/cu13"
    p = plan(PublishOptions(cuda="cu13", build_dir=str(tmp_path / "build"), registry=dest, username="publisher",
                            password_env="SF_PUBLISH_PASSWORD"), environ=ENV)
    lines: list[str] = []
    record = publish(p, read_credentials(p, io.StringIO(), ENV), echo=lines.append)

    digest = record["digest"]
    assert DIGEST_RE.match(digest) and record["verified"] is True
    assert record["tags"] == record["pushed"] == [built_image["tag"], built_image["human"]]
    assert any(re.match(r"^  [0-9a-f]{12}  (pushed|layer already exists)", line) for line in lines), lines
    assert lines[-2:] == [f"digest {digest}", f"image  {dest}@{digest}"]
    assert json.loads((build / "publish.json").read_text()) == record
    for name in ("report.json", "stack.lock.json"):
        doc = json.loads((build / name).read_text())
        assert doc["digest"] == digest and doc["published"] == [f"{dest}@{digest}"], name
    assert json.loads((build / "stack.lock.json").read_text())["pins"]  # the lock's own content is kept

    # Pull it back by the recorded digest with the image gone locally: the same image comes back.
    client = docker.from_env()
    client.api.remove_image(built_image["id"], force=True)
    pulled = client.images.pull(f"{dest}@{digest}", auth_config={"username": "publisher", "password": PASSWORD})
    assert pulled.id == built_image["id"]
    client.api.tag(pulled.id, built_image["repo"], built_image["tag"])

    # Re-publishing the unchanged image pushes nothing and leaves the records as they were.
    before = {n: (build / n).read_bytes() for n in ("publish.json", "report.json", "stack.lock.json")}
    out = cli("--cuda", "cu13", "--build-dir", str(tmp_path / "build"), "--registry", dest, "--username", "publisher",
              "--password-stdin", input=PASSWORD + "\n")
    assert out.returncode == 0, out.stderr
    assert "nothing to push" in out.stdout and "pushing" not in out.stdout
    assert out.stdout.splitlines()[-1] == f"image  {dest}@{digest}"
    assert {n: (build / n).read_bytes() for n in before} == before


def test_wrong_password_is_refused_clearly_and_records_nothing(registry, built_image, tmp_path):
    build = make_build(tmp_path / "build", built_image)
    before = {n: (build / n).read_bytes() for n in ("report.json", "stack.lock.json")}
    out = cli("--cuda", "cu13", "--build-dir", str(tmp_path / "build"), "--registry",
              f"{registry.host}/publish-test/denied",
              "--username", "publisher", "--password-env", "SF_WRONG", env={"SF_WRONG": "not-the-password"})
    assert out.returncode == 2
    assert f"registry {registry.host} refused access to 'publish-test/denied'" in out.stderr
    assert ("user 'publisher' from --password-env "
           "SF_WRONG") in out.stderr and "check the username and password" in out.stderr
    assert "not-the-password" not in out.stdout + out.stderr and "pushing" not in out.stdout
    assert not (build / "publish.json").exists()
    assert {n: (build / n).read_bytes() for n in before} == before


def test_reset_connections_are_retried(registry, built_image, tmp_path):
    """The first connection (our registry check) is reset, and so is the first one the Engine opens
    to push (armed when the push starts): both are retried and the publish completes."""
    creds = Credentials("publisher", PASSWORD, "test")
    record_path = tmp_path / "record.json"
    lines: list[str] = []
    with ResetProxy(registry.port, resets=1) as proxy:
        registry.trust(proxy.host)

        def echo(line: str) -> None:
            lines.append(line)
            if line.startswith("pushing ") and proxy.resets == 1:
                proxy.arm(1)

        p = plan(PublishOptions(image=built_image["ref"], registry=f"{proxy.host}/publish-test/retry",
                                record=str(record_path), tags=["retry"]))
        record = publish(p, creds, echo=echo, retry=Retry(first_delay=0.5))
    assert proxy.resets == 2
    retries = [line for line in lines if "retrying in" in line]
    assert len(retries) == 2, lines
    assert "manifest publish-test/retry" in retries[0] and "reset" in retries[0].lower()
    # The Engine reports its reset HTTPS request as a failed plain-HTTP fallback (loopback is "insecure").
    assert retries[1].startswith(f"  push {proxy.host}/publish-test/retry:") and "retrying in 0.5s" in retries[1]
    assert json.loads(record_path.read_text()) == record and record["verified"] is True
    # Asked directly, not through the proxy, the registry holds what the record says.
    direct = RegistryAPI(registry.host, creds).manifest("publish-test/retry", "retry")
    assert (direct.digest, direct.config_digest) == (record["digest"], built_image["id"])


def test_ecr_login_decodes_the_token(moto_ecr, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_ECR", moto_ecr)  # boto3 reads the override itself
    client = ecr.client(REGION)
    token = client.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    creds, push_host = ecr.login(client, ecr.parse_ecr_host(ECR_HOST))
    assert f"{creds.username}:{creds.password}" == base64.b64decode(token).decode() and creds.username == "AWS"
    assert push_host == ECR_HOST and creds.password not in repr(creds)


def test_ecr_publish_creates_repository_and_keeps_tags_immutable(registry, moto_ecr, built_image, tmp_path):
    import boto3

    build = make_build(tmp_path / "build", built_image)
    name = "publish-test/ecr"
    opts = PublishOptions(cuda="cu13", build_dir=str(tmp_path / "build"), registry=f"{ECR_HOST}/{name}",
                          ecr_endpoint=moto_ecr, ecr_push_host=registry.host)
    lines: list[str] = []
    record = publish(plan(opts), echo=lines.append)
    aws = boto3.client("ecr", region_name=REGION, endpoint_url=moto_ecr)
    repo = aws.describe_repositories(repositoryNames=[name])["repositories"][0]
    assert repo["imageTagMutability"] == "IMMUTABLE" and repo["imageScanningConfiguration"]["scanOnPush"] is True
    assert f"created ECR repository {name} (tags immutable, scan on push on)" in lines
    assert record["reference"] == f"{ECR_HOST}/{name}@{record['digest']}" and record["push_host"] == registry.host
    first = (build / "publish.json").read_bytes()

    # ECR now reports: the content-addressed tag at another build's image, the human tag at ours.
    ours = RegistryAPI(registry.host, Credentials("publisher", PASSWORD)).manifest(name, built_image["tag"])
    other = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 2,
                                   "digest": "sha256:" + hashlib.sha256(b"another build").hexdigest()},
                        "layers": []})
    other_digest = "sha256:" + hashlib.sha256(other.encode()).hexdigest()
    aws.put_image(repositoryName=name, imageManifest=other, imageTag=built_image["tag"], imageDigest=other_digest)
    aws.put_image(repositoryName=name, imageManifest=ours.raw.decode(), imageTag=built_image["human"],
                  imageDigest=ours.digest)
    # The post-push check (describe_images) that runs when ECR itself is the push host:
    ecr.confirm_digest(aws, ecr.parse_ecr_host(ECR_HOST), name, built_image["human"], ours.digest)
    with pytest.raises(RegistryError, match="describe_images reports"):
        ecr.confirm_digest(aws, ecr.parse_ecr_host(ECR_HOST), name, built_image["tag"], ours.digest)

    lines.clear()
    with pytest.raises(PublishError) as err:
        publish(plan(opts), echo=lines.append)
    message = str(err.value)
    assert "refusing to move immutable tag(s); nothing was pushed" in message
    assert f"  - {built_image['tag']} already points at {other_digest}" in message
    assert f"  - {built_image['human']} " not in message  # already ours: not a move
    assert not any(line.startswith("pushing") for line in lines)
    assert (build / "publish.json").read_bytes() == first


@pytest.fixture
def plain_registry(docker_engine, tmp_path):
    """The everyday `registry:2` on localhost: plain HTTP, no auth (Docker pushes to it without TLS)."""
    reg = LocalRegistry(tmp_path / "plain-registry", None, tls=False).start()
    yield reg
    reg.stop()


def test_publish_to_a_plain_http_loopback_registry(plain_registry, built_image, tmp_path):
    """Docker's rule: a loopback registry may speak plain HTTP. The push and our verification both
    work, with no TLS error retried as if it were transient."""
    dest = f"{plain_registry.host}/publish-test/plain"
    record_path = tmp_path / "record.json"
    out = cli("--image", built_image["ref"], "--registry", dest, "--record", str(record_path), "--tag", "plain")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "retrying" not in out.stdout + out.stderr and "SSL" not in out.stdout + out.stderr
    record = json.loads(record_path.read_text())
    assert record["verified"] is True and record["reference"] == f"{dest}@{record['digest']}"
    api = RegistryAPI(plain_registry.host)
    seen = api.manifest("publish-test/plain", "plain")
    assert (seen.digest, seen.config_digest) == (record["digest"], built_image["id"])
    assert api._base.startswith("http://")  # after HTTPS was tried and the server answered in plain text


def _blob(registry: LocalRegistry, repository: str, digest: str) -> bytes:
    """A blob as any reader gets it: GET over TLS with the registry's CA and our login."""
    import ssl
    import urllib.request

    request = urllib.request.Request(f"https://{registry.host}/v2/{repository}/blobs/{digest}", headers={
        "Authorization": "Basic " + base64.b64encode(f"publisher:{PASSWORD}".encode()).decode()})
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(registry.ca)),
                                timeout=60) as resp:
        return resp.read()


def test_publish_with_zstd_layers_keeps_the_image_and_is_read_back_layer_by_layer(registry, built_image, tmp_path):
    """--compression zstd: an OCI manifest of zstd layers whose config is the built image (so its
    digest verifies like a gzip push), each layer decompressing to the config's diff_id; a second
    zstd publish is a no-op, and a gzip publish to the same tag moves it back to gzip layers."""
    import zstandard

    build = make_build(tmp_path / "build", built_image)
    dest, repository = f"{registry.host}/publish-test/zstd", "publish-test/zstd"
    args = ["--cuda", "cu13", "--build-dir", str(tmp_path / "build"), "--registry", dest, "--username", "publisher",
            "--password-stdin"]
    out = cli(*args, "--compression", "zstd", input=PASSWORD + "\n")
    assert out.returncode == 0, out.stdout + out.stderr
    record = json.loads((build / "publish.json").read_text())
    assert record["compression"] == "zstd" and record["verified"] is True
    assert record["pushed"] == [built_image["tag"], built_image["human"]]

    api = RegistryAPI(registry.host, Credentials("publisher", PASSWORD))
    seen = api.manifest(repository, built_image["tag"])
    assert (seen.digest, seen.config_digest, seen.layer_compression) == (record["digest"], built_image["id"], "zstd")
    manifest = json.loads(seen.raw)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    config = _blob(registry, repository, built_image["id"])
    assert "sha256:" + hashlib.sha256(config).hexdigest() == built_image["id"]
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    assert len(manifest["layers"]) == len(diff_ids) >= 2  # the base's layer and the RUN's
    for layer, diff_id in zip(manifest["layers"], diff_ids, strict=True):
        packed = _blob(registry, repository, layer["digest"])
        assert ("sha256:" + hashlib.sha256(packed).hexdigest(), len(packed)) == (layer["digest"], layer["size"])
        raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(packed)).read()
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == diff_id

    again = cli(*args, "--compression", "zstd", input=PASSWORD + "\n")
    assert again.returncode == 0 and "nothing to push" in again.stdout, again.stdout + again.stderr

    back = cli(*args, input=PASSWORD + "\n")  # the default, gzip: the Engine's own push
    assert back.returncode == 0, back.stdout + back.stderr
    assert "gzip" in back.stdout and "moves from" in back.stdout
    seen = api.manifest(repository, built_image["tag"])
    assert (seen.config_digest, seen.layer_compression) == (built_image["id"], "gzip")
    assert json.loads((build / "publish.json").read_text())["compression"] == "gzip"
