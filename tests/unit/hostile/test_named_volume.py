"""Issue 40: a named Docker volume in container.volumes is refused saying why a cluster cannot use
it (it lives inside one host's Docker: not the same data on every host) and what to use instead."""

from __future__ import annotations

import pytest

from slimeforge.cluster.dockerargs import container_problems, volume_problem


@pytest.mark.parametrize("value", ["models:/models", "models:/models:ro", "hf_cache.v2:/root/.cache/huggingface:rw",
                                   "m-1:/m"])
def test_a_named_volume_says_why_a_cluster_cannot_use_it(value):
    problem = volume_problem(0, value)
    assert problem is not None and problem.where == "container.volumes.0"
    text = str(problem)
    assert "names a Docker volume" in text and "inside one host's Docker" in text and ("not the same data on every "
                                                                                      "host") in text
    assert "a host path on a filesystem every host shares" in text and value.split(":")[0] in text


@pytest.mark.parametrize("value", ["models", "./models:/models", "models:relative", "models:/m\x1b[2J", ":/x", "-v:/x"])
def test_other_bad_volumes_keep_the_bind_mount_message(value):
    problem = volume_problem(0, value)
    assert problem is not None and "names a Docker volume" not in str(problem)


def test_a_bind_mount_of_absolute_paths_is_accepted():
    assert container_problems({"volumes": ["/shared/models:/models:ro", "/data:/data"]}) == []
