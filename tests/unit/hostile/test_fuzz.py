"""Property-based tests: recipes, `--set` items, stacks, inventories and raw YAML generated around
the schemas (wrong types, unicode, control and bidi characters, flag-like text, huge and
non-finite numbers, nesting, duplicate keys). Each input ends in exactly one of two ways:

* refused: a ConfigError whose every problem names a field (or the line, file or option), and
  nothing written; or
* accepted: the output is complete and reads back as what was validated (plan.json's recipe
  validates to the same recipe, the files match plan.json's hashes, a Dockerfile has one FROM and
  no stray control character).

Never a traceback (any other exception fails the test) and never a hang (the deadline is a hang
detector, far above the milliseconds an example takes). CI runs a bounded number of examples.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import yaml
from corpus import BASE_INVENTORY
from helpers import SEED_RECIPE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slimeforge.cluster.inventory import InventoryFile, load_inventory
from slimeforge.errors import ConfigError
from slimeforge.image.builder.build import render_dockerfile
from slimeforge.image.stack import Stack, load_stack
from slimeforge.run.recipe import Recipe, parse_overrides
from slimeforge.run.recipecheck import load_recipe
from slimeforge.run.rundir import build_run_dir, write_run_dir
from slimeforge.yamlio import read_yaml

ROOT = Path(__file__).resolve().parents[3]
TEST_STACK = yaml.safe_load((ROOT / "tests" / "stacks" / "test.yaml").read_text())
# CI: 120 examples per test, the same ones every run. SLIMEFORGE_FUZZ_EXAMPLES=N explores N random ones.
_EXPLORE = int(os.environ.get("SLIMEFORGE_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_EXPLORE or 120, deadline=10_000, suppress_health_check=[HealthCheck.too_slow],
                derandomize=not _EXPLORE,
                database=None)

# --- values ------------------------------------------------------------------------------------------

HOSTILE_CHARS = "\n\r\t\x00\x1b\x7f\x85\u2028\u202e\u2066\u200f\ufeff '\"$`\\;&|*?-=:#@/[]{},."
text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from(HOSTILE_CHARS + "aZ09_"), max_size=20),
    st.sampled_from(["--lr", "-x", "--", "", " ", "/abs/path", "rel/path", "a\n", "sk-" + "a" * 30, "yes", "no", "null",
                     "1e400", "nan", "-1", "../..", "/models/x\u202e", "x" * 5000]),
    st.builds(lambda a, b: a + b, st.sampled_from(["/", "--", "-", "", "gsm8k-"]), st.text(max_size=15)),
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 65535, 65536, 10**12, 2**63, 2**64 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(text, numbers, st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner,
                                                                                                    max_size=4)),
                      max_leaves=12)


def deep(n: int):
    node: object = "x"
    for _ in range(n):
        node = [node]
    return node


# --- recipes -----------------------------------------------------------------------------------------

RECIPE_KEYS = sorted(Recipe.model_fields)
WHERE_HEADS = set(RECIPE_KEYS) | {"ports", "line", "file", "--set", "extends", "recipe", "--out"}


def head(where: str) -> str:
    for sep in (".", "[", " "):
        where = where.split(sep, 1)[0] if not where.startswith("--set") else "--set"
    return where


@st.composite
def recipe_inputs(draw):
    data = dict(SEED_RECIPE, stack="cu13")
    for key in draw(st.lists(st.sampled_from(RECIPE_KEYS), max_size=4, unique=True)):
        data[key] = draw(st.one_of(values, st.just(deep(draw(st.integers(1, 60))))))
    extra = draw(st.dictionaries(st.sampled_from(["num_gpu", "lrr", "Exp_id", "\u202eexp"]), scalars, max_size=1))
    data.update(extra)
    sets = draw(st.lists(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(RECIPE_KEYS + ["env.X",
                                                                                           "env.OPENAI_API_KEY",
                                                                                               "a..b", ""]),
                                   st.one_of(text, st.sampled_from(["no", "true", "[1, 2]", "{a: 1}", "1e9", ".inf",
                                                                    "&a [*a]"]))),
                         max_size=2))
    duplicate = draw(st.sampled_from([None, *RECIPE_KEYS[:5]]))
    return data, sets, duplicate, set(extra)


@FUZZ
@given(recipe_inputs())
def test_recipes_are_refused_by_field_or_rendered_completely(case):
    data, sets, duplicate, extra = case
    with tempfile.TemporaryDirectory(prefix="sf-fuzz-") as tmp:
        path = Path(tmp) / "recipe.yaml"
        try:
            text_out = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
        except yaml.YAMLError:
            return
        if duplicate:
            text_out += f"{duplicate}: again\n"
        path.write_text(text_out, errors="surrogatepass")
        out = Path(tmp) / "run"
        try:
            recipe, stack = load_recipe(path, parse_overrides(sets))
            run = build_run_dir(recipe, stack, out, str(path), environ={})
            write_run_dir(run)
        except ConfigError as exc:
            assert exc.problems, str(exc)
            for p in exc.problems:
                assert head(p.where) in WHERE_HEADS | extra, (p.where, str(exc))
            assert not out.exists()
            return
        assert duplicate is None
        plan = json.loads((out / "plan.json").read_text())
        assert Recipe.model_validate(plan["recipe"]) == recipe  # what was validated is what was written
        for name, digest in plan["files"].items():
            assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest


# --- stacks ------------------------------------------------------------------------------------------

STACK_PATHS = [("name",), ("version",), ("python",), ("venv",), ("image_root",), ("base", "image"), ("base", "digest"),
               ("base", "glibc"), ("sources", "libdemo", "git"), ("sources", "libdemo", "dir"), ("sources", "libdemo",
                                                                                                 "commit"),
               ("versions", "six"), ("versions",), ("steps", 0, "name"), ("steps", 0, "pip"), ("steps", 1, "env"),
               ("steps", 2, "patches"), ("patches", "dir"), ("patches", "files", 0, "file"), ("smoke", "imports"),
               ("steps",)]


@st.composite
def stack_inputs(draw):
    data = copy.deepcopy(TEST_STACK)
    # Longest paths first: a later, shorter one may replace their parent, never the reverse.
    for path in sorted(draw(st.lists(st.sampled_from(STACK_PATHS), min_size=1, max_size=3, unique=True)), key=len,
                       reverse=True):
        node = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = draw(st.one_of(values, st.dictionaries(text, text, max_size=3), st.lists(text, max_size=3)))
    return data


@FUZZ
@given(stack_inputs())
def test_stacks_are_refused_by_field_or_render_one_clean_dockerfile(data):
    with tempfile.TemporaryDirectory(prefix="sf-fuzz-") as tmp:
        path = Path(tmp) / "stack.yaml"
        try:
            path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), errors="surrogatepass")
        except yaml.YAMLError:
            return
        try:
            dockerfile = render_dockerfile(load_stack(path))
        except ConfigError as exc:
            assert exc.problems and all(head(p.where) in set(Stack.model_fields) | {"schema", "line", "file",
                                                                                    "step_overrides", "Dockerfile"}
                                        for p in exc.problems), str(exc)
            return
        lines = dockerfile.split("\n")
        assert sum(1 for line in lines if line.startswith("FROM ")) == 1
        assert not any(ch < " " and ch != "\n" or ch in "\x7f\u2028\u2029\u202e\u2066" for ch in dockerfile)


# --- inventories -------------------------------------------------------------------------------------

INVENTORY_PATHS = [("name",), ("mode",), ("image",), ("ssh", "port"), ("ssh", "user"), ("ray", "port"), ("ray",
                                                                                                         "dashboard_port"),
                   ("ray", "env"), ("ray", "temp_dir"), ("ray", "start_timeout"), ("hosts", 0, "address"), ("hosts", 1,
                                                                                                            "address"),
                   ("hosts", 0, "gpus"), ("hosts", 1, "name"), ("hosts", 1, "port"), ("hosts", 0, "env"), ("hosts",)]


@st.composite
def inventory_inputs(draw):
    data = copy.deepcopy(BASE_INVENTORY)
    for path in sorted(draw(st.lists(st.sampled_from(INVENTORY_PATHS), min_size=1, max_size=3, unique=True)), key=len,
                       reverse=True):
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
        node[path[-1]] = draw(st.one_of(values, st.dictionaries(text, text, max_size=2)))
    return data


@FUZZ
@given(inventory_inputs())
def test_inventories_are_refused_by_field_or_loaded_within_bounds(data):
    with tempfile.TemporaryDirectory(prefix="sf-fuzz-") as tmp:
        path = Path(tmp) / "lab.yaml"
        try:
            path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), errors="surrogatepass")
        except yaml.YAMLError:
            return
        try:
            inv = load_inventory(path)
        except ConfigError as exc:
            assert exc.problems and all(head(p.where) in set(InventoryFile.model_fields) | {"line",
                                                                                            "file"} for p
                                        in exc.problems), str(exc)
            return
        assert 1 <= inv.ray.port <= 65535 and len({h.name for h in inv.hosts}) == len(inv.hosts)
        assert all(0 <= h.gpus <= 64 and h.temp_dir.startswith("/") for h in inv.hosts)


# --- raw YAML ----------------------------------------------------------------------------------------

YAML_ALPHABET = st.sampled_from(list("ab:- \n\t[]{},&*!|>'\"#%@`?\\") + ["&a ", "*a", "<<: ", "\x00", "\ufeff",
                                                                         "\udcff", "\u202e"])


@FUZZ
@given(st.one_of(st.binary(max_size=200),
                 st.lists(YAML_ALPHABET, max_size=80).map("".join).map(lambda s: s.encode(errors="surrogatepass"))))
def test_raw_yaml_is_read_or_refused_never_a_traceback(raw):
    with tempfile.TemporaryDirectory(prefix="sf-fuzz-") as tmp:
        path = Path(tmp) / "x.yaml"
        path.write_bytes(raw)
        try:
            data = read_yaml(path)
        except ConfigError as exc:
            assert exc.problems and exc.source == str(path)
            return
        assert isinstance(data, dict)


# --- the one reader (issue 33): FIFOs, directories, devices, deep nesting, odd digits ----------------

_SHAPES = st.sampled_from(["fifo", "dir", "dev-null", "dev-zero", "symlink-to-fifo", "bytes"])
_BRACKETS = st.integers(min_value=0, max_value=3000).flatmap(
    lambda n: st.sampled_from([("[", "]"), ("{\"a\": ", "}")]).map(lambda p: (p[0] * n + "1" + p[1] * n).encode()))
_FORMATS = st.sampled_from(["yaml", "json", "toml", "text"])


def _place(path: Path, shape: str, raw: bytes) -> None:
    if shape == "fifo":
        os.mkfifo(path)
    elif shape == "dir":
        path.mkdir()
    elif shape == "dev-null":
        path.symlink_to("/dev/null")
    elif shape == "dev-zero":
        path.symlink_to("/dev/zero")
    elif shape == "symlink-to-fifo":
        os.mkfifo(path.with_suffix(".fifo"))
        path.symlink_to(path.with_suffix(".fifo"))
    else:
        path.write_bytes(raw)


def _read(fmt: str, path: Path):
    from slimeforge import readback

    if fmt == "yaml":
        return read_yaml(path)
    if fmt == "json":
        return readback.read_json(path, "record", "a JSON record")
    if fmt == "toml":
        raw = readback.read_bytes(path, "lock", "a TOML file", max_bytes=readback.MAX_TOML_RECORD, follow_symlinks=True)
        return None if raw is None else readback.parse_toml(path, "lock", "a TOML file", readback.decode(path, "lock",
                                                                                                         "a TOML "
                                                                                                         "file", raw))
    return readback.read_text(path, "id", re.compile(r"[0-9a-f]{1,64}"), "hex digits")


@FUZZ
@given(_SHAPES, _FORMATS, st.one_of(_BRACKETS, st.binary(max_size=300)))
def test_the_one_reader_refuses_what_is_not_a_regular_bounded_file(shape, fmt, raw):
    """Whatever stands at the path, in whatever format: a value, or a ConfigError naming the file;
    never a hang (the FIFO would block an open() for reading), a traceback or a deep document."""
    from slimeforge import readback

    with tempfile.TemporaryDirectory(prefix="sf-fuzz-") as tmp:
        path = Path(tmp) / "f"
        _place(path, shape, raw)
        try:
            doc = _read(fmt, path)
        except ConfigError as exc:
            assert exc.problems and (str(path) in str(exc) or "/dev/" in str(exc))  # the file (a symlink: its target)
            if shape in ("fifo", "dir", "dev-null", "dev-zero", "symlink-to-fifo"):
                assert any(w in str(exc) for w in ("FIFO", "directory", "device", "symlink",
                                                   "cannot be read")), str(exc)
            return
        assert shape == "bytes", (shape, fmt)
        assert readback.depth_of(doc) <= readback.MAX_DEPTH


_ODD_DIGITS = "0123456789\u00b2\u00b3\u00b9\u0663\u06f3\u0967\uff13\U0001d7d9_ +-.eE"


@FUZZ
@given(st.one_of(st.text(alphabet=st.sampled_from(_ODD_DIGITS), max_size=25), st.booleans(), st.integers(),
                 st.floats(), st.none()))
def test_numbers_are_ascii_digits_within_bounds_or_refused(value):
    """The one number parser: an int in bounds exactly when the value is ASCII digits (or an int
    that is not a bool) in bounds; otherwise a Problem naming the option; never int()'s traceback."""
    from slimeforge.schema import WHOLE_RE, parse_whole

    good = (isinstance(value, str) and WHOLE_RE.fullmatch(value) is not None and int(value) <= 999_999) or (
        type(value) is int and 0 <= value <= 999_999)
    try:
        got = parse_whole(value, "--min-free-gb", 0, 999_999)
    except ConfigError as exc:
        assert not good and exc.problems[0].where == "--min-free-gb"
        return
    assert good and got == int(value)
