"""Container mode's engine: Docker answers here, and the NVIDIA Container Toolkit starts a `--gpus`
container of the run's image, as the launch's `docker run --gpus all` will. A failure is shown in
Docker's own words (toolfix.py), with a fix only where those words name the cause."""

from __future__ import annotations

from .findings import Context, Finding, check, error, ok, warning
from .toolfix import known_fix, tool_message

CHECK = "docker"


def engine_findings(ctx: Context) -> list[Finding]:
    """Docker Engine answers (its server version), then a `--gpus all` container of the image lists
    the GPUs it sees (nvidia-smi -L, which the toolkit puts in every GPU container)."""
    docker = ctx.docker
    try:
        version = ctx.runner.run([docker, "version", "--format", "{{.Server.Version}}"], step="docker version", timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001 - Docker's own message is the finding
        return [error(CHECK, f"Docker Engine does not answer: {tool_message(exc)}",
                      known_fix(exc, "install Docker Engine, or start it (what Docker said above is why it does not answer)"))]
    out = [ok(CHECK, f"Docker Engine {version or '(version not given)'} answers")]
    if not ctx.image:
        return out + [warning(CHECK, "no image given, so the NVIDIA Container Toolkit is not checked",
                              "give --image IMAGE (or image: in the recipe)")]
    # Only an image already here: doctor pulls nothing (the launch pulls a missing one itself).
    present = ctx.runner.run([docker, "image", "inspect", "--format", "{{.Id}}", "--", ctx.image], step="docker image inspect",
                             check=False, timeout=30)
    if present.returncode != 0:
        said = (present.stderr or present.stdout).strip().splitlines()
        return out + [warning(CHECK, f"image {ctx.image} is not on this host, so a --gpus container of it was not started"
                              + (f" (Docker: {said[-1]})" if said else ""),
                              f"`docker pull {ctx.image}` (the launch pulls it too), then run doctor again")]
    argv = [docker, "run", "--rm", "--pull", "never", "--gpus", "all", "--entrypoint", "nvidia-smi", "--", ctx.image, "-L"]
    try:
        listed = ctx.runner.run(argv, step="docker run --gpus all", timeout=120).stdout
    except Exception as exc:  # noqa: BLE001
        return out + [error(CHECK, f"a --gpus container of {ctx.image} does not start: {tool_message(exc)}",
                            known_fix(exc, "what Docker said above is why; the launch's `docker run --gpus all` would stop the same way"))]
    gpus = [line for line in listed.splitlines() if line.startswith("GPU ")]
    return out + [ok(CHECK, f"the NVIDIA Container Toolkit runs a --gpus container of {ctx.image}: {len(gpus)} GPU(s) inside")]


@check(CHECK, "host")
def check_docker(ctx: Context) -> list[Finding]:
    """Container mode: Docker answers, and the NVIDIA Container Toolkit runs a --gpus container of the image."""
    if ctx.mode != "container":
        return []
    return engine_findings(ctx)
