"""ECR's control-plane answers read as input (issue 40): batch_get_image entries without an id, a
tag not asked for, a tag twice, a digest outside the grammar, a manifest that is not text; and
describe_images answers of the wrong shape. Each is a RegistryError naming ECR and what it sent
(printable), never a KeyError traceback."""

from __future__ import annotations

import json

import pytest

from slimeforge.image.remote import ecr
from slimeforge.image.remote.registry import RegistryError

REG = ecr.parse_ecr_host("123456789012.dkr.ecr.us-east-1.amazonaws.com")
D = "sha256:" + "e" * 64
BODY = json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + "c" * 64}})


class Client:
    def __init__(self, **answers):
        self.answers = answers

    def batch_get_image(self, **kw):
        return self.answers["batch"]

    def describe_images(self, **kw):
        return self.answers["describe"]


def entry(tag="t1", digest=D, body=BODY):
    return {"imageId": {"imageTag": tag, "imageDigest": digest}, "imageManifest": body}


@pytest.mark.parametrize("reply", [
    {"images": [{"imageManifest": BODY}]},
    {"images": [entry(tag="other")]},
    {"images": [entry(), entry()]},
    {"images": [entry(digest="sha256:xyz\x1b[2J")]},
    {"images": [entry(body=5)]},
    {"images": ["t1"]},
    {"images": {"t1": entry()}},
    {"images": [], "failures": [{"failureCode": "RepositoryNotFound\x1b]0;x\x07", "failureReason": "gone"}]},
    {"images": [], "failures": ["broken"]},
])
def test_a_hostile_batch_get_image_answer_is_a_clear_error(reply):
    with pytest.raises(RegistryError) as exc:
        ecr.manifests(Client(batch=reply), REG, "slime", ["t1"])
    assert "ECR 123456789012.dkr.ecr.us-east-1.amazonaws.com/slime" in str(exc.value)
    assert "\x1b" not in str(exc.value) and "\x07" not in str(exc.value)


def test_a_plain_answer_is_read():
    found = ecr.manifests(Client(batch={"images": [entry()], "failures": [{"failureCode": "ImageNotFound"}]}), REG,
                          "slime", ["t1", "t2"])
    assert list(found) == ["t1"] and found["t1"].config_digest == "sha256:" + "c" * 64


@pytest.mark.parametrize("reply", [{"imageDetails": [{}]}, {"imageDetails": "x"}, {"imageDetails": [D, D]}, {}])
def test_describe_images_of_the_wrong_shape_fails_the_confirmation(reply):
    with pytest.raises(RegistryError) as exc:
        ecr.confirm_digest(Client(describe=reply), REG, "slime", "t1", D)
    assert exc.value.exit_code == 1 and "nothing was recorded" in str(exc.value)
