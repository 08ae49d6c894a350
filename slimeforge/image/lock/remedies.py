"""The one remedy for each fact a lock can lack, worded once.

    remedy(fact, ref)   the sentence that says what fills `fact` for the stack `ref`

A lock is made where the indexes answer; a fact from outside them (the router wheel's sha256, the
base image's digest, the patch files' sha256) may be missing, and a flavor (cu129) may have no lock
yet. `lock --check`, `lock` and `lock --complete`, `build` and `install` (their dry runs, the plan's
marked slice, a real run that cannot fill the fact) and `stack.show` each print this sentence, so a
fact has one fix wherever it is reported, and every option it names is one of the task it names
(tests/unit/test_invoke_hints.py holds both).
"""

from __future__ import annotations

from pathlib import Path

# {lock}: the stack's `invoke lock` command; {source}: the source the patches are read from.
REMEDIES = {
    "router_sha256": ("`{lock} --complete` downloads the router wheel once and records its sha256; where it cannot be "
                      "downloaded, give the sha256: `{lock} --complete --router-sha256 <sha256>`"),
    "base_digest": ("`{lock} --complete` asks the base image's registry for its digest; where the registry cannot be "
                    "reached, give the digest: `{lock} --complete --base-digest sha256:...`"),
    "uv_wheel": ("`{lock} --complete` finds the wheel of the stack's uv for the lock's platform on the index and "
                 "records its URL and sha256"),
    "patch_sha256": ("re-lock where the patch files can be read, or from a checkout of {source} at its pinned commit: "
                     "`{lock} --source {source}=PATH`"),
    "lock": "`{lock}` makes it where the flavor's indexes are reachable; commit it",
}


def lock_command(ref: str | Path) -> str:
    """The command that (re)makes the lock of a flavor name or a stack file."""
    text = str(ref)
    return f"invoke lock --stack {text}" if text.endswith((".yaml", ".yml")) else f"invoke lock --cuda {text}"


def remedy(fact: str, ref: str | Path, source: str = "slime") -> str:
    """The remedy of a missing `fact` (a key of REMEDIES) for the stack `ref` (a flavor or a stack file)."""
    return REMEDIES[fact].format(lock=lock_command(ref), source=source)

