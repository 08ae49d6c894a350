"""One image pushed through the Docker Engine (`docker push`'s path, for gzip layers): the Engine's
progress stream read as input, a line per layer, its failures sorted into auth, retryable and final.

    push_tag(docker, target, credentials, echo, retry) -> digest   the digest the Engine reports
    push_failure(target, message, credentials) -> Exception        auth, transient (retried) or final

In: a Docker client, an image reference to push, credentials. Out: the pushed manifest's digest, or
RegistryAuthError / TransientError / PushFailed. Publish and the wheel store both push through here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ...errors import OperationFailed, SlimeforgeError
from ...schema import printable
from ..imageref import ImageRef
from ..remote.registry import Credentials, RegistryAuthError, Retry, TransientError, auth_advice

_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


class PublishError(SlimeforgeError):
    """Publishing stopped before pushing (refused: exit 2); the message says at which step and what to do."""


class PushFailed(PublishError, OperationFailed):
    """The push itself failed, or the registry does not hold what was pushed (exit 1)."""


def push_tag(docker, target: ImageRef, credentials: Credentials | None, echo: Callable[[str], None],
             retry: Retry) -> str:
    """Push one tag through the Docker Engine, streaming per-layer progress; return its digest."""
    from docker.errors import APIError
    from requests.exceptions import ConnectionError as DaemonConnectionError
    from requests.exceptions import RequestException

    # None lets the docker SDK read the user's docker config and credential helpers, as `docker push` does.
    auth = credentials.auth_config(target.registry) if credentials else None

    def once() -> str:
        echo(f"pushing {target}")
        progress, digest = LayerProgress(echo), None
        try:
            for event in docker.api.push(target.name, tag=target.tag, stream=True, decode=True, auth_config=auth):
                # The Engine's progress stream, read as input: an object per event, its fields of the types it
                # documents.
                if not isinstance(event, dict):
                    raise PushFailed(f"push {target}: the Docker Engine sent {printable(repr(event))[:200]}, not a "
                                     "progress event")
                if "error" in event or "errorDetail" in event:
                    detail = event.get("errorDetail")
                    message = detail.get("message") if isinstance(detail, dict) else None
                    message = message if isinstance(message, str) and message else event.get("error")
                    raise push_failure(target, printable(str(message or "(no message)"))[:1000], credentials)
                aux = event.get("aux")
                said = aux.get("Digest") if isinstance(aux, dict) else None
                if said is not None:
                    if not (isinstance(said, str) and _DIGEST_RE.fullmatch(said)):
                        raise PushFailed(f"push {target}: the Docker Engine reported the digest "
                                         f"{printable(repr(said))[:100]}, "
                                         "not sha256:<64 hex>; nothing was recorded")
                    digest = said
                progress.update(event)
        except APIError as exc:
            raise push_failure(target, printable(str(exc.explanation or exc))[:1000], credentials) from None
        except (DaemonConnectionError, RequestException, ValueError) as exc:
            # ValueError: a line of the stream that is not JSON (the SDK's decode).
            raise PushFailed(f"push {target}: lost the connection to the Docker Engine, or it sent what is not a "
                             "progress event: "
                             f"{printable(str(exc))[:300]}") from None
        if not digest:
            raise PushFailed(f"push {target}: the Docker Engine finished without reporting a digest; nothing was "
                             "recorded")
        return digest

    return retry.call(f"push {target}", once, echo)


_AUTH_WORDS = ("unauthorized", "authentication required", "denied", "no basic auth credentials", "forbidden")
_TRANSIENT_WORDS = ("connection reset", "connection refused", "broken pipe", "eof", "timeout", "i/o timeout",
                    "tls handshake", "500 internal", "502 bad gateway", "503 service", "504 gateway",
                    "unexpected http status: 5", "toomanyrequests", "too many requests",
                    # For an "insecure" registry (loopback, or listed in daemon.json) the Engine falls back
                    # to plain HTTP when its HTTPS request fails, so a dropped connection surfaces as this.
                    "client sent an http request to an https server")


def push_failure(target: ImageRef, message: str, credentials: Credentials | None) -> Exception:
    """The Engine reports registry failures as text; sort them into auth, retryable, and final."""
    low = message.lower()
    if any(w in low for w in _AUTH_WORDS):
        return RegistryAuthError(auth_advice(target.registry, target.repository, credentials,
                                             f"push: {message.strip()}"))
    if any(w in low for w in _TRANSIENT_WORDS):
        return TransientError(message.strip())
    return PushFailed(f"push {target}: {message.strip()}")


class LayerProgress:
    """A compact line per layer: each quarter of an upload, then how it ended."""

    DONE = ("Pushed", "Layer already exists", "Mounted from")

    def __init__(self, echo: Callable[[str], None]):
        self.echo = echo
        self.quarters: dict[str, int] = {}

    def update(self, event: dict) -> None:
        layer, status = event.get("id"), event.get("status", "")
        if not (isinstance(layer, str) and isinstance(status, str) and layer and status):
            return
        layer = printable(layer)[:80]
        if status == "Pushing":
            detail = event.get("progressDetail")
            detail = detail if isinstance(detail, dict) else {}
            current, total = detail.get("current"), detail.get("total")
            current = current if isinstance(current, int) and not isinstance(current, bool) and current >= 0 else 0
            total = total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else 0
            quarter = 4 * current // total if total else 0
            if quarter > self.quarters.get(layer, 0) and quarter < 4:
                self.quarters[layer] = quarter
                self.echo(f"  {layer}  pushing {25 * quarter:3d}% of {_size(total)}")
        elif status.startswith(self.DONE):
            status = printable(status)[:200]
            self.echo(f"  {layer}  {status[0].lower()}{status[1:]}")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)
