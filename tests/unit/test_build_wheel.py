"""slimeforge/scripts/build_wheel.py's checks, before any backend runs: which backend a tree names, the
sdist it unpacks (one top directory, nothing out of it), and pip's form of config settings."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "slimeforge" / "scripts"
sys.path.insert(0, str(SCRIPTS))
from build_wheel import LEGACY_BACKEND, BadInput, backend_of, config_settings, unpack_sdist  # noqa: E402


def tree(tmp_path: Path, pyproject: str | None, setup: bool = True) -> Path:
    t = tmp_path / "src"
    t.mkdir()
    if pyproject is not None:
        (t / "pyproject.toml").write_text(pyproject)
    if setup:
        (t / "setup.py").write_text("")
    return t


@pytest.mark.parametrize("pyproject,backend", [
    (None, LEGACY_BACKEND),  # PEP 517: no [build-system], setuptools' legacy backend
    ('[project]\nname = "x"\n', LEGACY_BACKEND),
    ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n', "setuptools.build_meta"),
    ('[build-system]\nbuild-backend = "setuptools.build_meta:__legacy__"\n', LEGACY_BACKEND),  # TE's sdist
])
def test_the_backend_a_tree_names(tmp_path, pyproject, backend):
    assert backend_of(tree(tmp_path, pyproject)) == (backend, [])


@pytest.mark.parametrize("pyproject,why", [
    ('[build-system]\nbuild-backend = "os; import evil"\n', "is not a module[:object] name"),
    ('[build-system]\nbuild-backend = 3\n', "is not a module[:object] name"),
    ('[build-system]\nbuild-backend = "b"\nbackend-path = ["../out"]\n', "leads out of the source tree"),
    ('[build-system]\nbuild-backend = "b"\nbackend-path = "here"\n', "must be a list of strings"),
    ("[build-system\n", "not TOML"),
])
def test_a_bad_build_system_table_is_named(tmp_path, pyproject, why):
    with pytest.raises(BadInput, match=None) as e:
        backend_of(tree(tmp_path, pyproject))
    assert why in str(e.value) and "pyproject.toml" in str(e.value)


def test_a_tree_without_either_file_is_no_source_tree(tmp_path):
    with pytest.raises(BadInput, match="neither pyproject.toml nor setup.py"):
        backend_of(tree(tmp_path, None, setup=False))


def test_backend_path_inside_the_tree_is_taken(tmp_path):
    t = tree(tmp_path, '[build-system]\nbuild-backend = "b"\nbackend-path = ["tools"]\n')
    assert backend_of(t) == ("b", [str((t / "tools").resolve())])


def sdist(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def test_an_sdist_unpacks_into_a_new_directory_of_its_own(tmp_path):
    s = sdist(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/setup.py": b"", "pkg-1.0/pkg.c": b"int x;"})
    first, second = unpack_sdist(s, tmp_path / "work"), unpack_sdist(s, tmp_path / "work")
    assert first.name == second.name == "pkg-1.0" and first != second and (first / "pkg.c").read_bytes() == b"int x;"


@pytest.mark.parametrize("members,links,why", [
    ({"a-1/setup.py": b"", "b-1/setup.py": b""}, None, "exactly one top directory"),
    ({"setup.py": b""}, None, "exactly one top directory"),
    ({"a-1/../../evil": b"x"}, None, "is not a file or directory inside the sdist"),
    ({"/abs/evil": b"x"}, None, "is not a file or directory inside the sdist"),
    ({"a-1/setup.py": b""}, {"a-1/out": "/etc/passwd"}, "is not a file or directory inside the sdist"),
    ({"a-1/setup.py": b""}, {"a-1/in": "setup.py"}, "is not a file or directory inside the sdist"),
])
def test_an_sdist_that_would_write_outside_or_is_ambiguous_is_refused(tmp_path, members, links, why):
    s = sdist(tmp_path / "bad-1.0.tar.gz", members, links)
    with pytest.raises(BadInput, match=None) as e:
        unpack_sdist(s, tmp_path / "work")
    assert why in str(e.value)
    assert not (tmp_path / "evil").exists() and not list((tmp_path / "work").rglob("*.py"))


@pytest.mark.parametrize("name", ["pkg.zip", "-rf.tar.gz", "a b.tar.gz", "x\n.tar.gz"])
def test_an_sdist_name_outside_the_grammar_is_refused_before_it_is_read(tmp_path, name):
    with pytest.raises(BadInput, match="an sdist is NAME.tar.gz"):
        unpack_sdist(tmp_path / name, tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_config_settings_in_pips_form():
    assert config_settings([]) is None
    assert config_settings(["a=b=c"]) == {"a": "b=c"}  # pip splits at the first "="
    assert config_settings(["editable_mode=compat"]) == {"editable_mode": "compat"}
    assert config_settings(["--build-option=--cpp_ext", "--build-option=--cuda_ext"]) == \
        {"--build-option": ["--cpp_ext", "--cuda_ext"]}
    for bad in ("novalue", "k=a\nb", "=v"):
        with pytest.raises(BadInput, match="expected KEY=VALUE"):
            config_settings([bad])
