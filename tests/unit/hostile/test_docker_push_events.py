"""The Docker Engine's push progress stream, read as input (issue 40): events that are not objects,
an errorDetail that is not an object, a digest outside the grammar, progress of the wrong types,
escape sequences in a status, a stream that breaks. Each is a clear PushFailed (exit 1) or a line
shown printable, never a traceback, and nothing is reported as pushed without a valid digest."""

from __future__ import annotations

import pytest
import requests

from slimeforge.image.imageref import ImageRef
from slimeforge.image.publish.push import LayerProgress, PushFailed, push_tag
from slimeforge.image.remote.registry import Retry

TARGET = ImageRef("127.0.0.1:5000", "sf/x", "t1")
DIGEST = "sha256:" + "d" * 64


class Engine:
    def __init__(self, events):
        self.api = self
        self.events = events

    def push(self, name, tag, stream, decode, auth_config):
        yield from self.events()


def push(events):
    said: list[str] = []
    digest = push_tag(Engine(events), TARGET, None, said.append, Retry(attempts=1))
    return digest, said


def broken():
    yield {"status": "Pushing", "id": "abc"}
    raise requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead")


HOSTILE = {
    "a list, not an event": lambda: iter([["status", "Pushed"]]),
    "a string, not an event": lambda: iter(["Pushed"]),
    "errorDetail a string": lambda: iter([{"errorDetail": "boom",
                                           "error": "denied: requested access to the resource is denied"}]),
    "errorDetail a list": lambda: iter([{"errorDetail": ["x"]}]),
    "digest with a newline": lambda: iter([{"aux": {"Digest": DIGEST + "\nforged"}}]),
    "digest a number": lambda: iter([{"aux": {"Digest": 5}}]),
    "no digest at all": lambda: iter([{"status": "Pushed", "id": "abc"}]),
    "aux a list": lambda: iter([{"aux": ["Digest", DIGEST]}]),
    "stream breaks": broken,
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_push_stream_is_a_clear_failure(case):
    with pytest.raises(Exception) as exc:
        push(HOSTILE[case])
    assert type(exc.value).__name__ in ("PushFailed", "RegistryAuthError", "RegistryError"), repr(exc.value)
    assert "\n" not in str(exc.value) and "Traceback" not in str(exc.value)


def test_escape_sequences_in_an_error_never_reach_the_terminal():
    with pytest.raises(PushFailed) as exc:
        push(lambda: iter([{"errorDetail": {"message": "\x1b]0;owned\x07bad layer"}}]))
    assert "\x1b" not in str(exc.value) and "bad layer" in str(exc.value)


def test_progress_of_the_wrong_types_is_skipped_and_statuses_are_printable():
    said: list[str] = []
    p = LayerProgress(said.append)
    for event in [{"id": "abc", "status": "Pushing", "progressDetail": {"current": "5", "total": 0}},
                  {"id": "abc", "status": "Pushing", "progressDetail": ["x"]},
                  {"id": "abc", "status": "Pushing", "progressDetail": {"current": 60, "total": 100}},
                  {"id": ["abc"], "status": "Pushed"},
                  {"id": "abc\x1b[2J", "status": "Pushed\x1b]0;x\x07"}]:
        p.update(event)
    assert said == ["  abc  pushing  50% of 100 B", "  abc?[2J  pushed?]0;x?"]


def test_a_plain_stream_gives_its_digest():
    digest, said = push(lambda: iter([{"status": "Pushing", "id": "abc", "progressDetail": {"current": 30,
                                                                                            "total": 100}},
                                      {"status": "Pushed", "id": "abc"}, {"aux": {"Tag": "t1", "Digest": DIGEST,
                                                                                  "Size": 5}}]))
    assert digest == DIGEST and "  abc  pushed" in said
