"""LaunchRequest's option types are checked strictly by pydantic (issue 41.2: no annotation parsing):
a Python caller's wrong type is a ConfigError naming the option, its type and the value, every one
at once; the types themselves are accepted as they are (an int where a float goes, None where optional)."""

from __future__ import annotations

import pytest

from slimeforge.errors import ConfigError
from slimeforge.run.launch import LaunchRequest

REFUSED = [
    ({"start_timeout": "30"}, "start_timeout",
     "must be int | None"),  # text is not a number here (invoke types the CLI's)
    ({"start_timeout": True}, "start_timeout", "must be int | None"),  # a bool is not a count
    ({"head_timeout": False}, "head_timeout", "must be float"),
    ({"nodes": 2.0}, "nodes", "must be str | int | None"),
    ({"network_checks": 1}, "network_checks", "must be bool"),
    ({"skip_checks": ["flags"]}, "skip_checks",
     "must be tuple[str, ...]"),  # train() turns lists into tuples; the request does not
    ({"overrides": ("lr=1", 2)}, "overrides", "must be tuple[str, ...]"),
    ({"head_args": "--temp-dir /tmp/x"}, "head_args",
     "must be tuple[str, ...] | None"),  # one string is not a list of words
    ({"data": [("exp_id", "x")]}, "data", "must be Mapping[str, Any] | None"),
    ({"recipe": None}, "recipe", "must be str"),
]


@pytest.mark.parametrize(("options", "field", "message"), REFUSED,
                         ids=[r[1] + "-" + type(next(iter(r[0].values()))).__name__ for r in REFUSED])
def test_a_wrong_type_names_the_option_its_type_and_the_value(options, field, message):
    options = {"recipe": "r.yaml", **options}
    with pytest.raises(ConfigError, match="launch options") as err:
        LaunchRequest(**options)
    (problem,) = err.value.problems
    assert (problem.where, problem.message, problem.value) == (field, message, options[field])


def test_every_wrong_type_at_once_in_field_order():
    with pytest.raises(ConfigError) as err:
        LaunchRequest(recipe="r.yaml", head_args="x", network_checks="no", detach=None)
    assert [p.where for p in err.value.problems] == ["network_checks", "head_args", "detach"]


def test_the_types_themselves_pass():
    req = LaunchRequest(recipe="r.yaml", data={"exp_id": "x"}, overrides=("lr=1",), nodes="2", head_timeout=30,
                        start_timeout=None,
                        head_args=("--temp-dir", "/tmp/x"), skip_checks=(), network_checks=False)
    assert req.head_timeout == 30 and req.nodes == "2"
    assert LaunchRequest(recipe="r.yaml", nodes=3).nodes == 3
