"""Container mode's engine: Docker answers here, and the NVIDIA Container Toolkit starts a `--gpus`
container of the run's image, as the launch's `docker run --gpus all` will. A failure is shown in
Docker's own words (toolfix.py), with a fix only where those words name the cause."""

from __future__ import annotations

from .findings import Context, Finding, check, error, ok, skipped
from .toolfix import known_fix, tool_message

CHECK = "docker"


def engine_findings(ctx: Context) -> list[Finding]:
    """Docker Engine answers (its server version), then a `--gpus all` container of the image lists
    the GPUs it sees (nvidia-smi -L, which the toolkit puts in every GPU container)."""
    docker = ctx.docker
    try:
        version = ctx.runner.run([docker, "version", "--format", "{{.Server.Version}}"], step="docker version",
                                 timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001 - Docker's own message is the finding
        # The checks that need the image read it through Docker: they name this error, not a second one.
        ctx.cache.setdefault("image-facts", exc)
        ctx.cache.setdefault("image-blocked-by", CHECK)
        return [error(CHECK, f"Docker Engine does not answer: {tool_message(exc)}",
                      known_fix(exc,
                                "install Docker Engine, or start it (what Docker said above is why it does not "
                                "answer)"))]
    out = [ok(CHECK, f"Docker Engine {version or '(version not given)'} answers")]
    if not ctx.image:
        return out + [skipped(CHECK, "--image",
                              "the NVIDIA Container Toolkit starts a --gpus container of the image, and no image is "
                              "given",
                              "give --image IMAGE (or image: in the recipe)")]
    # The image once for every check that needs it: pulled here if it is not on this host, as the
    # launch's `docker run` would; one that cannot be had is this check's one error (Docker's words).
    if blocker := ctx.image_blocker(CHECK):
        return out + [blocker]
    argv = [docker, "run", "--rm", "--pull", "never", "--gpus", "all", "--entrypoint", "nvidia-smi", "--", ctx.image,
            "-L"]
    try:
        listed = ctx.runner.run(argv, step="docker run --gpus all", timeout=120).stdout
    except Exception as exc:  # noqa: BLE001
        return out + [error(CHECK, f"a --gpus container of {ctx.image} does not start: {tool_message(exc)}",
                            known_fix(exc,
                                      "what Docker said above is why; the launch's `docker run --gpus all` would stop "
                                      "the same way"))]
    gpus = [line for line in listed.splitlines() if line.startswith("GPU ")]
    return out + [ok(CHECK,
                     f"the NVIDIA Container Toolkit runs a --gpus container of {ctx.image}: {len(gpus)} GPU(s) inside")]


@check(CHECK, "host")
def check_docker(ctx: Context) -> list[Finding]:
    """Container mode: Docker answers, and the NVIDIA Container Toolkit runs a --gpus container of the image."""
    if ctx.mode != "container":
        return []
    return engine_findings(ctx)
