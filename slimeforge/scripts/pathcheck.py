"""A recipe's paths as one host sees them: the node agent's `runcheck` (cluster/runcheck.py asks it
of every host before a run is submitted) and a Slurm node's view of the run's files (slurm-check):
a model directory with its config.json and weight sizes, the files the job reads, the checkpoint
directory writable with room for a checkpoint, and the one-filesystem marker (written on one
host, read on all).

Standard library only, Python >= 3.8: it runs on the hosts, inside the node agent's program
(slimeforge.scripts.program). Whatever the host's files are, the answer is JSON.
"""

from __future__ import annotations

import importlib
import os
import re
import stat

try:
    from . import procproof  # imported as slimeforge.scripts.pathcheck
except ImportError:  # on a host: one program (slimeforge.scripts.program) that registered it first
    procproof = importlib.import_module("procproof")

loads_strict = procproof.loads_strict

MARKER_PREFIX = ".slimeforge-fs-"
CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "tie_word_embeddings")
CONFIG_MAX_BYTES = 16 << 20  # a model's config.json is a few KiB; more is not one
CONFIG_INT_MAX = 1 << 31  # a layer count, width or vocabulary beyond this is not a model's
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
WEIGHT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,254}")
MAX_WEIGHT_FILES = 10000
PATH_MAX = 4096
UNUSABLE_PATH = (f"is not a usable path (a NUL byte, a character no file name holds, or longer than {PATH_MAX} "
                "characters)")


def path_problem(path):
    """Why `path` (from the caller's JSON) cannot be looked at here, or None."""
    if not isinstance(path, str) or not path:
        return "is not a path"
    try:
        path.encode("utf-8", "surrogateescape")  # a lone surrogate has no bytes: no file has that name
    except UnicodeEncodeError:
        return UNUSABLE_PATH
    if "\0" in path or len(path) > PATH_MAX:
        return UNUSABLE_PATH
    if not os.path.isabs(path):
        return "is not an absolute path"
    return None


def read_config(config):
    """config.json's shape keys (only well-formed values), or the reason it cannot be read: never
    blocks on a FIFO, never reads more than CONFIG_MAX_BYTES, never recurses without bound."""
    try:
        fd = os.open(config, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return None, f"config.json cannot be opened: {exc.strerror or exc}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "config.json is not a regular file"
        if st.st_size > CONFIG_MAX_BYTES:
            return None, f"config.json is {st.st_size} bytes (a model's is a few KiB)"
        data = procproof.read_bounded(fd, CONFIG_MAX_BYTES)
    except OSError as exc:
        return None, f"config.json cannot be read: {exc.strerror or exc}"
    finally:
        os.close(fd)
    try:
        doc = loads_strict(data.decode("utf-8"))
    except ValueError as exc:
        return None, f"config.json is not JSON: {str(exc)[:200]}"
    if not isinstance(doc, dict):
        return None, "config.json is not a JSON object"
    out = {}  # type: dict[str, object]
    for k in CONFIG_KEYS:
        v = doc.get(k)
        if k == "tie_word_embeddings":
            if isinstance(v, bool):
                out[k] = v
        elif type(v) is int and 0 < v < CONFIG_INT_MAX:
            out[k] = v
    return out, None


def weight_files(path):
    """({name: bytes} of the model's weight files, [problems]): what a checkpoint's size follows and
    what a worker's copy must match. Symlinks are followed (a Hugging Face snapshot is symlinks)."""
    files, problems = {}, []
    try:
        with os.scandir(path) as entries:
            for e in entries:
                if not e.name.endswith(WEIGHT_SUFFIXES):
                    continue
                if not WEIGHT_NAME_RE.fullmatch(e.name):
                    problems.append("has a weights file whose name is not plain text: " + ascii(e.name)[:300])
                    continue
                try:
                    st = os.stat(e.path)
                except OSError as exc:  # a dangling link, a link loop, no permission
                    problems.append(f"has a weights file {e.name} that cannot be read: {exc.strerror or exc}")
                    continue
                if stat.S_ISREG(st.st_mode):
                    files[e.name] = st.st_size
                    if len(files) > MAX_WEIGHT_FILES:
                        problems.append(f"has more than {MAX_WEIGHT_FILES} weights files")
                        break
    except OSError as exc:
        problems.append(f"cannot be listed: {exc.strerror or exc}")
    return files, problems


def cmd_runcheck(p):
    """p: {"paths": [{"what", "path", "kind": model|file|dir}], "checkpoint": {"dir", "token",
    "write"|"read"|"remove"}}. Answers {"problems": [{"what", "path", "why"}], "weights": {name: bytes},
    "weights_bytes", "config", "free_bytes"}; the caller adds the fixes. Whatever the host's files are, the answer is
    JSON."""
    problems, weights = [], {}  # type: list[dict[str, str]], dict[str, int]
    out = {"problems": problems, "weights": weights, "weights_bytes": 0, "config": None, "free_bytes": None}

    def bad(what, path, why):
        problems.append({"what": what, "path": path, "why": why})

    for item in p.get("paths", []):
        what, path, kind = item["what"], item["path"], item["kind"]
        why = path_problem(path)
        if why:
            bad(what, path if isinstance(path, str) else ascii(path), why)
        elif kind == "file" and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            bad(what, path, "no such file here" if not os.path.exists(path) else "is not a readable file")
        elif kind == "dir" and not os.path.isdir(path):
            bad(what, path, "no such directory here")
        elif kind == "model":
            config = os.path.join(path, "config.json")
            if not os.path.isdir(path):
                bad(what, path, "no such directory here")
            elif not (os.path.isfile(config) and os.access(config, os.R_OK)):
                bad(what, path, "has no readable config.json here")
            else:
                out["config"], why = read_config(config)
                if why:
                    bad(what, path, why)
                found, whys = weight_files(path)
                weights.update(found)
                for why in whys:
                    bad(what, path, why)
    out["weights_bytes"] = sum(weights.values())
    ck = p.get("checkpoint")
    if ck:
        d, token = ck["dir"], ck["token"]
        if path_problem(d) or not (isinstance(token, str) and re.fullmatch(r"[0-9a-f]{32}", token)):
            bad("checkpoint_dir", d if isinstance(d, str) else ascii(d),
                "is not an absolute path with a 32-hex-digit token")
            return out
        marker = os.path.join(d, MARKER_PREFIX + token)
        try:
            os.makedirs(d, exist_ok=True)
            probe = os.path.join(d, f".slimeforge-probe-{token}-{os.getpid()}")
            with open(probe, "w") as f:  # writable by this user, as every rank writes its shard
                f.write(token)
            os.remove(probe)
            st = os.statvfs(d)
            out["free_bytes"] = st.f_bavail * st.f_frsize
            if ck.get("write"):
                with open(marker + ".tmp", "w") as f:
                    f.write(token)
                os.replace(marker + ".tmp", marker)
        except OSError as exc:
            bad("checkpoint_dir", d, f"is not writable here: {exc.strerror or exc}")
            return out
        if ck.get("read"):
            if read_marker(marker) != token:  # "" when it is not there, or not a regular file
                bad("checkpoint_dir", d, "is not the head's filesystem: the marker the head wrote there is not here")
        if ck.get("remove"):
            try:
                os.remove(marker)
            except OSError:
                pass  # gone already, or not ours to remove (a directory by that name): a leftover is never read again
    return out


def read_marker(path):
    """A marker's token: "" unless `path` is a regular file (never waits on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        return os.read(fd, 256).decode(errors="replace").strip() if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    finally:
        os.close(fd)


CHECKPOINT_FACTOR = 7  # bytes of a Megatron checkpoint with optimizer state per byte of bf16 weights


def checkpoint_bytes(weights, config):
    """The size of a checkpoint with optimizer state, and how it was found: from the weights' bytes,
    else from config.json's shape; (None, why) when neither is known. cluster/runcheck.py and the
    Slurm nodes' slurm-check both use it."""
    if type(weights) is int and 0 < weights < 1 << 62:
        return CHECKPOINT_FACTOR * weights, f"{CHECKPOINT_FACTOR} x the weights' {weights / 2**30:.2f} GiB"
    c = config if isinstance(config, dict) else {}

    def dim(k):  # a positive int, never a bool, a float or a string
        return type(c.get(k)) is int and 0 < c[k] < CONFIG_INT_MAX

    if all(dim(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")):
        h = c["hidden_size"]
        inter = c["intermediate_size"] if dim("intermediate_size") else 4 * h
        # Per layer: attention's four h x h projections and a gated MLP's three h x intermediate ones;
        # the embedding, and the output layer unless tied to it.
        params = (c["num_hidden_layers"] * (4 * h * h + 3 * h * inter) + (1 if c.get("tie_word_embeddings")
                                                                          else 2) * c["vocab_size"] * h)
        return CHECKPOINT_FACTOR * 2 * params, (f"{CHECKPOINT_FACTOR} x 2 bytes x {params / 1e9:.2f}B parameters "
                                               "(config.json)")
    return None, "no weights and no shape in config.json"


def slurm_paths(p, is_head):
    """The run's files as this node sees them: the run directory (its marker, written where the job
    was submitted), then runcheck's: the model with its config.json (every node), the data (the
    head), a squashfs image (every node), checkpoint_dir writable and holding the batch host's
    marker (one filesystem), with free space for a checkpoint of the model's weights."""
    problems = []
    seen = p.get("visible")
    if seen and read_marker(seen["path"]) != seen["token"]:
        problems.append(f"cannot see the run directory {os.path.dirname(seen['path'])} (its marker is not there, or "
                        "is another copy's): "
                        "put --out on a filesystem every node mounts at the same path")
    ck = p.get("checkpoint")
    answer = cmd_runcheck({"paths": [i for i in p.get("paths", []) if is_head or not i.get("head_only")],
                           "checkpoint": ck and {"dir": ck["dir"], "token": ck["token"], "read": True}})
    problems += [f"{x['what']} {x['path']}: {x['why']}" for x in answer["problems"]]
    need, how = checkpoint_bytes(answer["weights_bytes"], answer["config"])
    free = answer["free_bytes"]
    if ck and free is not None and need is not None and need > free:
        problems.append(f"checkpoint_dir {ck['dir']}: {free / 2**30:.1f} GiB free, a checkpoint needs about "
                        f"{need / 2**30:.1f} GiB ({how})")
    return problems
