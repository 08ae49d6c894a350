"""What a build asks the Docker Engine about images, beside BuildKit's own run: the base pulled by
its digest before the build, an image that exists smoke-tested again (--verify), and what the
image's last step said of its smoke test.

In: a Docker client, a resolved base or an image id, the stack. Out: the base present here, the
smoke test's lines; BuildError naming what failed.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ...errors import OperationFailed
from ..dockerapi import ResolvedBase
from ..stack import Stack
from ..steps import image_layout, smoke_argv
from .buildkit import failure_text


class BuildError(OperationFailed):
    """The image build, or its smoke test, failed; the message names the step/patch/check."""


def smoke_test(client, image_id: str, stack: Stack) -> str:
    """Run the stack's smoke checks again inside an image that exists (--verify), in a container
    without a network, the flag catalog made again and compared; raise BuildError listing the
    failures. (A build runs them in the image's last step, beside finalize: `smoke_lines`.)"""
    import docker

    layout = image_layout(stack)
    try:
        out = client.containers.run(image_id, [f"{layout.state}/sf", "smoke", *smoke_argv(stack, layout)], remove=True,
                                    stdout=True, stderr=True, network_disabled=True)
    except docker.errors.ContainerError as exc:
        text = (exc.stderr or b"").decode(errors="replace")
        raise BuildError(f"smoke test of image {image_id[:19]} failed (an existing image, checked again by --verify: "
                         "rebuild it "
                         f"with --force):\n{failure_text(text.splitlines())}") from None
    return out.decode(errors="replace")


# A line the smoke test printed in the image's last step, as BuildKit's plain progress shows it
# ("#29 12.34 slimeforge: smoke: import torch ok").
SMOKE_LINE_RE = re.compile(r"#\d+ \d+(?:\.\d+)? slimeforge: (smoke[ :].*)")


def smoke_lines(lines: list[str]) -> list[str]:
    """What the smoke test said in the build's last step, in order."""
    return [m.group(1) for line in lines if (m := SMOKE_LINE_RE.fullmatch(line.rstrip("\n")))]


def pull_base(client, base: ResolvedBase, echo: Callable[[str], None]) -> None:
    """Pull the base by its digest when it is not here yet, with a line per layer as it completes
    (BuildKit would pull it too, but silently in build.log and only after the context is sent)."""
    import docker

    if not base.digest or base.from_ref == base.image:
        return
    try:
        client.images.get(base.from_ref)
        return
    except docker.errors.ImageNotFound:
        pass
    from ..imageref import parse_image_ref
    from ..remote.credentials import docker_config_credentials

    repo, _, digest = base.from_ref.partition("@")
    creds = docker_config_credentials(parse_image_ref(repo, "base.image").registry)
    echo(f"pulling base {base.from_ref} ...")
    try:
        for event in client.api.pull(repo, tag=digest, stream=True, decode=True,
                                     auth_config=creds.auth_config(parse_image_ref(repo).registry) if creds else None):
            if "error" in event:
                raise BuildError(f"pulling base {base.from_ref} failed: {event['error']}")
            status = event.get("status", "")
            if status in ("Pull complete", "Already exists") or status.startswith(("Digest:", "Status:")):
                echo(f"  {event.get('id', '')} {status}".rstrip())
    except docker.errors.APIError as exc:
        raise BuildError(f"pulling base {base.from_ref} failed: {exc.explanation or exc}") from None
