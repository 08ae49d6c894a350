"""Push, pull and unpack of one image on a loopback registry, layer by layer, gzip against zstd.

What a node pays before the first step is: download each compressed layer, decompress it, and
write its files (unpack). This measures each part per layer, for the same image pushed twice:

  push      gzip: the Docker Engine's own push (what `invoke publish` does by default), seconds per
            layer from the Engine's progress events; zstd: `invoke publish --compression zstd`'s
            path (slimeforge/image/publish/layerpush.py), compress and upload seconds per layer.
  download  GET of each blob from the registry (loopback: no network limit, so the bytes are
            reported too, for any link: seconds = bytes / link speed).
  unpack    `gzip -dc` / `zstd -dc` piped into `tar -x` into an empty directory: the decompression
            and the file writes a runtime does (tar's --totals gives the uncompressed bytes).
  pull      end to end, by a real runtime: containerd (`ctr images pull` in a namespace of its own,
            on the Docker Engine's containerd, which reads zstd since 1.5): fetch + unpack into its
            overlayfs snapshotter. The Docker Engine here (20.10) cannot pull zstd (23.0 can), and it
            holds the image already, so `docker pull` would move nothing: it is not used.

And with --changed-step STEP (default slime): the bytes a node pulls when that step changes, the
layer of that step and every layer after it (each is rebuilt, so each has a new digest), read
from the image's own history (each RUN names its `sf <step>`).

    python benchmarks/image_pull_bench.py                       # a small image on the test base
    python benchmarks/image_pull_bench.py --image REF --json out.json
    python benchmarks/image_pull_bench.py --real                # the real stack's image (results.json "build")

The registry is Debian's docker-registry on 127.0.0.1 (tests/publish_support.py), plain HTTP;
its storage and the downloaded blobs go under --workdir (default /var/tmp), removed after.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from publish_support import LocalRegistry  # noqa: E402

from slimeforge.image.publish import layerpush  # noqa: E402
from slimeforge.image.remote.registry import RegistryAPI  # noqa: E402

BASE = "slimeforge-test/base:bookworm"
REAL_RESULTS = Path("/var/tmp/slimeforge-real/results.json")
CONTAINERD = "/run/docker/containerd/containerd.sock"
CTR_NS = "slimeforge-pull-bench"
SF_STEP_RE = re.compile(r"/opt/slimeforge/sf '?([a-z0-9][a-z0-9-]*)'? ")


def small_image(client) -> str:
    """Three layers over the test base: a venv-like tree of text (compressible), random bytes
    (incompressible), and a small change on top."""
    marker = uuid.uuid4().hex
    dockerfile = (f"FROM {BASE}\n"
                  "RUN mkdir -p /opt/venv && cp -a /usr/lib/python3* /usr/share/perl* /opt/venv/\n"
                  "RUN head -c 32000000 /dev/urandom > /opt/blob\n"
                  f"RUN echo {marker} > /opt/marker\n")
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=f"slimeforge-bench/pull:{marker[:12]}",
                                   rm=True)
    return image.id


def layer_labels(config: dict) -> list[str]:
    """A name per layer, in order: the `sf <step>` a RUN calls, else the instruction's start."""
    labels = []
    for h in config.get("history", []):
        if h.get("empty_layer"):
            continue
        created = h.get("created_by", "")
        m = SF_STEP_RE.search(created)
        labels.append(m.group(1) if m else re.sub(r"\s+", " ", created.replace("/bin/sh -c #(nop) ",
                                                                               "")).strip()[:60] or "base")
    n = len(config["rootfs"]["diff_ids"])
    return (["base"] * (n - len(labels)) + labels)[-n:] if len(labels) != n else labels


def push_gzip(client, image_id: str, host: str, repo: str, tag: str) -> dict[str, float]:
    """The Engine's push; seconds per layer (short diff id -> first progress event to Pushed)."""
    client.api.tag(image_id, f"{host}/{repo}", tag)
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    for event in client.api.push(f"{host}/{repo}", tag=tag, stream=True, decode=True):
        if "error" in event:
            raise RuntimeError(event["error"])
        layer = event.get("id")
        if layer and len(layer) == 12:
            now = time.monotonic()
            first.setdefault(layer, now)
            if event.get("status", "").startswith(("Pushed", "Layer already exists", "Mounted")):
                done[layer] = now
    client.api.remove_image(f"{host}/{repo}:{tag}", noprune=True)
    return {k: done[k] - first[k] for k in done}


def fetch(host: str, repo: str, digest: str, dest: Path) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://{host}/v2/{repo}/blobs/{digest}", timeout=600) as resp, dest.open("wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)
    return time.monotonic() - started


def decompress(blob: Path, compression: str) -> tuple[float, float, int]:
    """Decompression alone (its output counted, then dropped): wall seconds, the decompressor's own
    CPU seconds (user + system: what it costs a node, whatever else shares the host's cores), and
    the uncompressed bytes."""
    started = time.monotonic()
    proc = subprocess.Popen([compression, "-dc", str(blob)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    total = 0
    while chunk := proc.stdout.read(1 << 20):
        total += len(chunk)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{compression} -dc {blob} failed")
    return time.monotonic() - started, usage.ru_utime + usage.ru_stime, total


def unpack(blob: Path, compression: str, into: Path) -> tuple[float, int]:
    """decompress | tar -x, timed; the uncompressed bytes tar read."""
    into.mkdir()
    started = time.monotonic()
    dec = subprocess.Popen([compression, "-dc", str(blob)], stdout=subprocess.PIPE)
    tar = subprocess.run(["tar", "-x", "--totals", "--numeric-owner", "-C", str(into)], stdin=dec.stdout,
                         capture_output=True, text=True)
    assert dec.stdout is not None
    dec.stdout.close()
    if dec.wait() != 0 or tar.returncode != 0:
        raise RuntimeError(f"unpacking {blob} failed: {tar.stderr[-500:]}")
    seconds = time.monotonic() - started
    m = re.search(r"Total bytes read: (\d+)", tar.stderr)
    shutil.rmtree(into)
    return seconds, int(m.group(1)) if m else -1


def tree_bytes(image_id: str, paths: list[str], compression: str) -> tuple[int, int]:
    """(uncompressed tar bytes, compressed bytes) of `paths` in the image, as a layer holding only
    them would be: `tar -c` in a container, compressed here (gzip -6, Docker's; zstd -3, publish's)."""
    tar = subprocess.Popen(["docker", "run", "--rm", "--network", "none", image_id, "tar", "-c", "-C", "/",
                            *[p.lstrip("/") for p in paths]], stdout=subprocess.PIPE)
    level = "-6" if compression == "gzip" else "-3"
    comp = subprocess.Popen([compression, level, "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert tar.stdout is not None and comp.stdin is not None and comp.stdout is not None
    raw = 0
    import threading

    packed = [0]

    def count() -> None:
        while chunk := comp.stdout.read(1 << 20):
            packed[0] += len(chunk)

    reader = threading.Thread(target=count)
    reader.start()
    while chunk := tar.stdout.read(1 << 20):
        raw += len(chunk)
        comp.stdin.write(chunk)
    comp.stdin.close()
    reader.join()
    if tar.wait() != 0 or comp.wait() != 0:
        raise RuntimeError(f"tar of {paths} in {image_id} failed")
    return raw, packed[0]


def transcode_zstd(api: RegistryAPI, host: str, image_id: str, workdir: Path) -> None:
    """bench/zstd:t from bench/gzip:t, one layer at a time (gzip -dc, checked against the config's
    diff_id, then zstd as publish compresses it): the same image with zstd layers, for a host whose
    disk cannot hold `docker save`'s staging copy of a 14 GB image (the Engine writes the whole
    export under /var/lib/docker/tmp before it streams) beside the registry's two copies."""
    gz = api.manifest("bench/gzip", "t")
    assert gz is not None
    config = urllib.request.urlopen(f"http://{host}/v2/bench/gzip/blobs/{image_id}").read()
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    descriptors = []
    for desc, diff_id in zip(json.loads(gz.raw)["layers"], diff_ids, strict=True):
        blob, packed = workdir / "transcode.gz", workdir / "transcode.zst"
        fetch(host, "bench/gzip", desc["digest"], blob)
        dec = subprocess.Popen(["gzip", "-dc", str(blob)], stdout=subprocess.PIPE)
        assert dec.stdout is not None
        with packed.open("wb") as out:
            sha, _, csha, csize = layerpush._compress_stream(dec.stdout.read, out, layerpush.ZSTD_LEVEL)
        if dec.wait() != 0 or sha != diff_id:
            raise RuntimeError(f"layer {desc['digest']}: gunzipped to {sha}, the config says {diff_id}")
        if not api.has_blob("bench/zstd", csha):
            api.upload_blob("bench/zstd", csha, csize, packed)
        descriptors.append({"mediaType": layerpush.LAYER_TYPES["zstd"], "digest": csha, "size": csize})
        blob.unlink()
        packed.unlink()
    (workdir / "config.json").write_bytes(config)
    api.upload_blob("bench/zstd", image_id, len(config), workdir / "config.json")
    manifest = json.dumps({"schemaVersion": 2, "mediaType": layerpush.OCI_MANIFEST,
                           "config": {"mediaType": layerpush.OCI_CONFIG, "digest": image_id, "size": len(config)},
                           "layers": descriptors}, separators=(",", ":")).encode()
    api.put_manifest("bench/zstd", "t", manifest, layerpush.OCI_MANIFEST)


def drop_blobs(registry: LocalRegistry, digests: list[str]) -> None:
    """Free the registry's disk of blobs measured already (their files, under its storage)."""
    for digest in digests:
        shutil.rmtree(registry.workdir / "data/docker/registry/v2/blobs/sha256" / digest[7:9] / digest[7:],
                      ignore_errors=True)


def ctr_pull(host: str, repo: str, tag: str) -> float | None:
    if not Path(CONTAINERD).exists() or not shutil.which("ctr"):
        return None
    ctr = ["ctr", "--address", CONTAINERD, "--namespace", CTR_NS]
    ref = f"{host}/{repo}:{tag}"
    started = time.monotonic()
    subprocess.run([*ctr, "images", "pull", "--plain-http", ref], check=True, capture_output=True)
    seconds = time.monotonic() - started
    subprocess.run([*ctr, "images", "rm", "--sync", ref], check=True, capture_output=True)
    return seconds


def ctr_cleanup() -> None:
    if Path(CONTAINERD).exists() and shutil.which("ctr"):
        ctr = ["ctr", "--address", CONTAINERD, "--namespace", CTR_NS]
        for ref in subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True).stdout.split():
            subprocess.run([*ctr, "images", "rm", "--sync", ref], capture_output=True)
        subprocess.run(["ctr", "--address", CONTAINERD, "namespaces", "rm", CTR_NS], capture_output=True)


def measure(client, image_id: str, workdir: Path, compressions: list[str], changed_step: str, with_ctr: bool,
            with_unpack: bool = True, transcode: bool = False) -> dict:
    inspect = client.api.inspect_image(image_id)
    out: dict = {"image": image_id, "size": inspect.get("Size"), "compressions": {}}
    registry = LocalRegistry(workdir / "registry", None, tls=False).start()
    try:
        api = RegistryAPI(registry.host)
        for compression in compressions:
            repo, tag = f"bench/{compression}", "t"
            started = time.monotonic()
            if compression == "gzip":
                per_layer_push = push_gzip(client, image_id, registry.host, repo, tag)
                figures = None
            elif transcode:
                transcode_zstd(api, registry.host, image_id, workdir)
                gz = api.manifest("bench/gzip", "t")
                assert gz is not None
                drop_blobs(registry, [d["digest"] for d in json.loads(gz.raw)["layers"]])
                figures, per_layer_push = None, {}
            else:
                figures = layerpush.push(client, image_id, api, repo, [tag], compression=compression,
                                         echo=lambda s: None,
                                         workdir=workdir).layers
                per_layer_push = {}
            push_s = time.monotonic() - started
            manifest = api.manifest(repo, tag)
            assert manifest is not None and manifest.config_digest == image_id
            doc = json.loads(manifest.raw)
            config_bytes = urllib.request.urlopen(f"http://{registry.host}/v2/{repo}/blobs/{image_id}").read()
            config = json.loads(config_bytes)
            labels = layer_labels(config)
            layers = []
            for i, (desc, diff_id) in enumerate(zip(doc["layers"], config["rootfs"]["diff_ids"], strict=True)):
                blob = workdir / f"blob-{compression}-{i}"
                download_s = fetch(registry.host, repo, desc["digest"], blob)
                decompress_s, decompress_cpu_s, raw = decompress(blob, compression)
                unpack_s = unpack(blob, compression, workdir / f"rootfs-{compression}-{i}")[0] if with_unpack else None
                blob.unlink()
                push_layer = (per_layer_push.get(diff_id[7:19]) if figures is None else (figures[i].compress_s
                                                                                         + (figures[i].upload_s or 0)))
                layers.append({"index": i + 1, "step": labels[i], "size": desc["size"], "uncompressed": raw,
                               "push_s": None if push_layer is None else round(push_layer, 3),
                               "download_s": round(download_s, 3),
                               "decompress_s": round(decompress_s, 3),
                               "decompress_cpu_s": round(decompress_cpu_s, 3),
                               "unpack_s": None if unpack_s is None else round(unpack_s, 3)})
            pull_s = ctr_pull(registry.host, repo, tag) if with_ctr else None
            first = next((i for i, lay in enumerate(layers) if lay["step"] == changed_step), None)
            out["compressions"][compression] = {
                "push_s": round(push_s, 2), "pushed_by": ("docker push" if compression == "gzip" else
                                                          "transcoded from the gzip "
                                                          "layers" if transcode else "layerpush (publish)"),
                                                "bytes": sum(lay["size"] for lay in layers),
                "uncompressed": sum(lay["uncompressed"] for lay in layers),
                "download_s": round(sum(lay["download_s"] for lay in layers), 2),
                                                "unpack_s": round(sum(lay["unpack_s"] for lay in layers),
                                                                  2) if with_unpack else None,
                "decompress_s": round(sum(lay["decompress_s"] for lay in layers), 2),
                "decompress_cpu_s": round(sum(lay["decompress_cpu_s"] for lay in layers), 2),
                "containerd_pull_s": None if pull_s is None else round(pull_s, 2),
                "changed_step": changed_step,
                "changed_step_bytes": None if first is None else sum(lay["size"] for lay in layers[first:]),
                "changed_step_uncompressed": None if first is None else sum(lay["uncompressed"] for lay
                                                                            in layers[first:]),
                "layers": layers,
            }
    finally:
        registry.stop()
        if with_ctr:
            ctr_cleanup()
    return out


def table(result: dict) -> str:
    rows = []
    for compression, r in result["compressions"].items():
        changed = ("is not in the image" if r["changed_step_bytes"] is None else
                   f"pulls {r['changed_step_bytes'] / 1e6:.1f} MB ({r['changed_step_uncompressed'] / 1e6:.1f} MB "
                   "unpacked)")
        rows.append(f"{compression}: {r['bytes'] / 1e6:.1f} MB compressed of {r['uncompressed'] / 1e6:.1f} MB; push "
                    f"{r['push_s']} s, "
                    f"download {r['download_s']} s, decompress {r['decompress_s']} s ({r['decompress_cpu_s']} CPU s), "
                    f"unpack {r['unpack_s']} s, "
                    f"containerd pull {r['containerd_pull_s']} s; a change of step {r['changed_step']} {changed}")
        rows.append(f"  {'#':>3} {'step':<24} {'MB':>9} {'MB raw':>9} {'push s':>8} {'get s':>7} {'decomp s':>9} "
                    f"{'unpack s':>9}")
        for lay in r["layers"]:
            push = "" if lay["push_s"] is None else f"{lay['push_s']:.2f}"
            raw = f"{lay['uncompressed'] / 1e6:.1f}"
            unpacked = "" if lay["unpack_s"] is None else f"{lay['unpack_s']:.2f}"
            rows.append(f"  {lay['index']:>3} {lay['step'][:24]:<24} {lay['size'] / 1e6:>9.1f} {raw:>9} "
                        f"{push:>8} {lay['download_s']:>7.2f} {lay['decompress_s']:>9.2f} {unpacked:>9}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="a local image (default: a small one built on the test base)")
    parser.add_argument("--real", action="store_true", help=f"the real stack's image, from {REAL_RESULTS}")
    parser.add_argument("--compression", action="append", choices=layerpush.COMPRESSIONS, help="default: both")
    parser.add_argument("--changed-step", default="slime")
    parser.add_argument("--no-containerd", action="store_true", help="skip the end-to-end containerd pull")
    parser.add_argument("--no-unpack", action="store_true",
                        help="skip tar -x of each layer (containerd's pull unpacks too)")
    parser.add_argument("--transcode", action="store_true",
                        help="zstd layers made from the pushed gzip ones, one at a time (little disk), not by "
                             "publish's path")
    parser.add_argument("--workdir", default="/var/tmp")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--late-tree", action="append", default=[],
                        help="a path in the image (repeatable) whose layer alone a change moves in the new layer order "
                             "(e.g. /root/slime: the checkout, which is the last step): its size as a layer, per "
                             "compression")
    args = parser.parse_args()

    import docker

    client = docker.from_env(timeout=3600)
    if args.real:
        image = json.loads(REAL_RESULTS.read_text())["build"]["image"]
    else:
        image = args.image or small_image(client)
    image_id = client.images.get(image).id
    try:
        with tempfile.TemporaryDirectory(prefix="sf-pull-bench-", dir=args.workdir) as tmp:
            result = measure(client, image_id, Path(tmp), args.compression or list(layerpush.COMPRESSIONS),
                             args.changed_step,
                             not args.no_containerd, not args.no_unpack, args.transcode)
        result["ref"] = image
        if args.late_tree:
            result["late_tree"] = {"paths": args.late_tree, **{c: dict(zip(("uncompressed", "bytes"),
                                                                           tree_bytes(image_id, args.late_tree, c),
                                                                             strict=True))
                                                                 for c in args.compression
                                                               or list(layerpush.COMPRESSIONS)}}
    finally:
        if not (args.real or args.image):
            client.api.remove_image(image_id, force=True)  # the small image this run built
    if args.late_tree:
        print(f"a layer of {', '.join(args.late_tree)} alone: " + ", ".join(
            f"{c} {v['bytes'] / 1e6:.1f} MB ({v['uncompressed'] / 1e6:.1f} MB raw)" for c,
                                                                            v in result["late_tree"].items()
            if c in layerpush.COMPRESSIONS))
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
