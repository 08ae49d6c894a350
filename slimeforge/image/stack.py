"""Stacks: every pin of an environment and its ordered install steps, as data (images/*.yaml).

The Dockerfile and the bare-metal install script are both rendered from `Stack.plan`, one
immutable tuple of resolved steps (`PlanStep`) computed once per stack and handed down, so the two
paths cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PrivateAttr, field_validator, model_validator

from .. import paths
from ..errors import ConfigError, Problem
from ..schema import ENV_NAME_RE, Model, validate
from ..yamlio import deep_merge, load_with_extends
from .imageref import image_ref_problems

# Every value of a stack reaches the Dockerfile, install.sh or an argv (apt-get, git, uv): each is
# held to the grammar of what it names, so none can begin with '-' (an option to the tool) or
# carry a character that ends the line or the word. Control characters are refused everywhere
# before these run (schema.text_problems); the Dockerfile renderer checks again.
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
# Names that become file names, Dockerfile mount paths and environment variables: kept to a safe
# alphabet so that no template has to quote them in a context where quoting is not possible.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# slimeforge's own steps (the venv with the pinned uv, after the system packages; patches; finalize, last),
# a source's `<step>-requirements`, the lock's all.txt: a stack step so named would share their records.
VENV_STEP, PATCHES_STEP, FINALIZE_STEP, REQUIREMENTS_SUFFIX = "venv", "patches", "finalize", "-requirements"
RESERVED_STEP_NAMES = (VENV_STEP, PATCHES_STEP, FINALIZE_STEP, "all")
_WORD = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
# PEP 508 distribution name with optional extras: transformer_engine[pytorch,core-cu13]
PACKAGE_RE = re.compile(rf"{_WORD}(?:\[{_WORD}(?:,{_WORD})*\])?")
# A pin: a bare version (2.11.0, 0.5.15.post1) or PEP 440 clauses (>=0.37.0, <2, >=1,<3)
_VERSION = r"[0-9][A-Za-z0-9.+!*_-]{0,63}"
VERSION_SPEC_RE = re.compile(rf"{_VERSION}|(?:===?|>=|<=|~=|!=|<|>){_VERSION}(?:,(?:===?|>=|<=|~=|!=|<|>){_VERSION})*")
# Debian package names (policy 5.6.1), with an optional =version
APT_RE = re.compile(r"[a-z0-9][a-z0-9+.-]{1,127}(?:=[A-Za-z0-9.+~:-]{1,64})?")
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?"
_URL_PATH = r"/[A-Za-z0-9._~+%-][A-Za-z0-9._~/+%-]*"
GIT_URL_RE = re.compile(rf"(?:https|ssh|git)://(?:[A-Za-z0-9._-]+@)?{_HOST}{_URL_PATH}|file://{_URL_PATH}"
                        rf"|[A-Za-z0-9._-]+@{_HOST}:[A-Za-z0-9._~+-][A-Za-z0-9._~/+-]*")
URL_RE = re.compile(rf"https?://{_HOST}(?:/[A-Za-z0-9._~/+%=:@,-]*)?")
REL_PATH_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(?:/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
ABS_PATH_RE = re.compile(r"(?:/[A-Za-z0-9_][A-Za-z0-9._+-]*)+")
MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
KEY_PATH_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)*")  # a dotted key of this stack


def _grammar(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(v: str) -> str:
        if not pattern.fullmatch(v):
            raise ValueError(f"is not {what}")
        return v

    return AfterValidator(check)


def _image_ref(v: str) -> str:
    problems = image_ref_problems(v, "base.image")
    if problems:
        raise ValueError(problems[0].message)
    return v


Name = Annotated[str, _grammar(NAME_RE, "a name: letters, digits, '.', '_' and '-', starting with a letter or "
                               "digit, at most 128")]
Package = Annotated[str, _grammar(PACKAGE_RE, "a Python package name (PEP 508), optionally with [extras]")]
VersionSpec = Annotated[str, _grammar(VERSION_SPEC_RE, "a version (2.11.0) or PEP 440 specifiers (>=0.37.0,<2)")]
AptName = Annotated[str, _grammar(APT_RE, "a Debian package name (lowercase letters, digits, + . -, starting "
                                  "with a letter or digit)")]
GitUrl = Annotated[str, _grammar(GIT_URL_RE, "a git URL: https://host/path.git, ssh://host/path, git@host:path or file:///path")]
Url = Annotated[str, _grammar(URL_RE, "an http(s) URL")]
RelPath = Annotated[str, _grammar(REL_PATH_RE, "a relative path of names (no '..', no leading '/' or '-')")]
AbsPath = Annotated[str, _grammar(ABS_PATH_RE, "an absolute path of names (letters, digits, . _ + -)")]
Module = Annotated[str, _grammar(MODULE_RE, "a Python module name such as sglang.srt")]
KeyPath = Annotated[str, _grammar(KEY_PATH_RE, "a dotted key of this stack, e.g. router.wheel")]
ImageRefText = Annotated[str, AfterValidator(_image_ref)]


SPEC_OPERATORS = ("<", ">", "=", "!", "~")


class Source(Model):
    git: GitUrl
    commit: str
    dir: RelPath

    @field_validator("commit")
    @classmethod
    def _full_commit(cls, v: str) -> str:
        if not COMMIT_RE.fullmatch(v):
            raise ValueError("must be a full 40-character lowercase commit id (a branch or tag can move)")
        return v


class PatchFile(Model):
    file: Name
    target: Name  # a source name, or "site-packages"
    method: Literal["git", "patch"]
    strip: int = Field(1, ge=0, le=16)


class Patches(Model):
    from_source: Name
    dir: RelPath
    files: list[PatchFile]


class Base(Model):
    image: ImageRefText
    digest: str | None = None
    # The base image's glibc: the newest manylinux tag its Python can install. Wheels are resolved
    # and downloaded for this target, never for the machine that runs slimeforge.
    glibc: str = "2.17"

    @field_validator("glibc")
    @classmethod
    def _glibc(cls, v: str) -> str:
        if not re.fullmatch(r"2\.[0-9]{1,2}", v):
            raise ValueError("must be a glibc version such as 2.39 (Ubuntu 24.04) or 2.36 (Debian 12)")
        return v

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", v):
            raise ValueError("must be sha256:<64 hex digits> or null (resolved at build time)")
        return v


# A command a host package provides (gcc, g++, git), and a package name of another distribution (dnf).
COMMAND_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9+._-]{0,63}")
Command = Annotated[str, _grammar(COMMAND_RE, "a command name such as gcc or g++")]
DistroPackage = Annotated[str, _grammar(re.compile(r"[A-Za-z0-9][A-Za-z0-9+._-]{0,127}"),
                                        "a package name such as gcc-c++")]
# A C header a compiled step includes (cusparse.h, cudnn.h): a file name, nothing else.
HEADER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}\.h")
Header = Annotated[str, _grammar(HEADER_RE, "a header file name such as cusparse.h")]


class Probe(Model):
    """How a host without dpkg shows that an apt package of the system step is there: every command
    on PATH and one of the files (a CA bundle lies in another place on RHEL); `dnf` names the
    package there, for the message."""

    commands: list[Command] = Field(default_factory=list)
    files: list[AbsPath] = Field(default_factory=list)
    dnf: list[DistroPackage] = Field(default_factory=list)
    # A package that only makes things faster (ccache): installed where apt can, named and skipped
    # where it cannot (a host without apt, or without root), never a reason to stop.
    optional: bool = False

    def spec(self, package: str) -> str:
        """PKG:COMMANDS:FILES:DNF[:optional], the form sf_system reads (no field can hold ':' or ',')."""
        return ":".join([package, ",".join(self.commands), ",".join(self.files), ",".join(self.dnf),
                         *(["optional"] if self.optional else [])])


class Step(Model):
    name: Name
    apt: list[AptName] | None = None
    pip: list[Package] | None = None
    source: Name | None = None
    wheel_url: KeyPath | None = None  # dotted key of the stack holding the URL, e.g. router.wheel
    index: KeyPath | None = None  # key of the stack holding an extra index URL
    from_source: bool = False  # build a PyPI package from its sdist
    compiles: bool = False  # gets MAX_JOBS / NVCC threads / arch list
    exclude: list[Package] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    editable: bool = False
    no_deps: bool = False
    requirements: KeyPath | None = None  # key of the stack holding a name -> version map
    patches: list[Name] = Field(default_factory=list)
    constrain_later: bool = False
    # An apt step that also installs the stack's interpreter by its version (python3.12,
    # python3.12-venv, python3.12-dev): CUDA bases ship no Python, and "python3" may be another one.
    python: bool = False
    # apt steps: per package, what shows it is there on a host without dpkg (see Probe).
    without_apt: dict[AptName, Probe] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not ENV_NAME_RE.fullmatch(k)]
        if bad:
            raise ValueError(f"environment variable names expected, got {bad}")
        return v

    @model_validator(mode="after")
    def _python_on_apt(self) -> Step:
        if self.python and self.apt is None:
            raise ValueError(f"step {self.name!r}: python: true installs the interpreter with apt, so it needs "
                             "an apt list")
        return self

    @model_validator(mode="after")
    def _one_kind(self) -> Step:
        kinds = [k for k in ("apt", "pip", "source", "wheel_url") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"step {self.name!r} must have exactly one of apt, pip, source, wheel_url (has "
                             f"{kinds or 'none'})")
        return self

    @property
    def kind(self) -> StepKind:
        if self.apt is not None:
            return "apt"
        if self.pip is not None:
            return "pip"
        return "source" if self.source is not None else "wheel_url"


class Runtime(Model):
    nvidia_lib_dirs: list[RelPath]
    cudart_decoy: Name | None = None
    cudart_name: Name
    # Megatron's --attention-backend. "flash" needs FA2 (or FA3) beside TE; a flavor that ships
    # neither (cu13: sglang's FA4 only) lets TE choose among what it has ("auto": cuDNN fused).
    attention_backend: Literal["flash", "fused", "unfused", "local", "auto"] = "flash"


class Router(Model):
    wheel: Url


class Smoke(Model):
    imports: list[Module]
    # Set by a flavor file (lists are replaced, not merged, by `extends`): its own extra imports.
    flavor_imports: list[Module] = Field(default_factory=list)
    # Imports that need a GPU (they load the CUDA driver when imported): skipped by name, with a
    # line saying so, where none is present (the image build's smoke test runs without one).
    needs_gpu: list[Module] = Field(default_factory=list)
    router_fork_marker: Name | None = None
    # Imported first in each import's own interpreter, as the pieces' users do: torch's C++
    # extensions (apex's amp_C, fused_layer_norm_cuda) need libc10 loaded by `import torch`.
    preload: list[Module] = Field(default_factory=list)

    @model_validator(mode="after")
    def _gpu_subset(self) -> Smoke:
        extra = [m for m in self.needs_gpu if m not in self.all_imports]
        if extra:
            raise ValueError(f"needs_gpu names modules that are not in imports: {extra}")
        return self

    @property
    def all_imports(self) -> list[str]:
        return list(dict.fromkeys([*self.imports, *self.flavor_imports]))


class LockSpec(Model):
    """Inputs of `invoke lock` beyond the steps' own pins (see slimeforge/image/lock/lockinputs.py)."""

    # Runtime dependencies that a source step's checkout declares (its pyproject/setup.py at the
    # pinned commit): the source itself installs with --no-deps, so the lock must hold these.
    source_requirements: dict[str, list[str]] = Field(default_factory=dict)
    # Distributions that a source step builds itself: kept out of the lock even where a dependency asks.
    provided_by_sources: list[str] = Field(default_factory=list)
    # uv --override lines: replace what a dependency asks for (cu129: the CUDA 12 builds of the kernels).
    overrides: list[str] = Field(default_factory=list)
    # Indexes searched (in order) before the default one, beside torch_index.
    extra_indexes: list[Url] = Field(default_factory=list)


StepKind = Literal["apt", "pip", "wheel_url", "source"]


@dataclass(frozen=True)
class _PlanStepBase:
    """What every step of a stack's plan has, whatever its kind."""

    name: str
    env: Mapping[str, str]
    compiles: bool
    no_deps: bool
    constrain_later: bool
    patches: tuple[PatchFile, ...]

    def _head(self, kind: StepKind) -> dict[str, object]:
        return {"name": self.name, "kind": kind, "env": dict(self.env), "compiles": self.compiles,
                "no_deps": self.no_deps, "constrain_later": self.constrain_later,
                "patches": [p.model_dump() for p in self.patches]}


@dataclass(frozen=True)
class AptStep(_PlanStepBase):
    """System packages, each with sf_system's --need spec (how a host without dpkg shows it is there)."""

    packages: tuple[str, ...]
    probes: tuple[str, ...]
    kind: Literal["apt"] = field(default="apt", init=False)

    def to_json(self) -> dict[str, object]:
        return {**self._head(self.kind), "packages": list(self.packages), "probes": list(self.probes)}


@dataclass(frozen=True)
class PipStep(_PlanStepBase):
    """Pinned requirements from an index (`index_url`: an extra one, None: the default), `no_binary`
    built from their sdists, `exclude` kept out of what they pull in."""

    requirements: tuple[str, ...]
    index_url: str | None
    no_binary: tuple[str, ...]
    exclude: tuple[str, ...]
    kind: Literal["pip"] = field(default="pip", init=False)

    def to_json(self) -> dict[str, object]:
        return {**self._head(self.kind), "requirements": list(self.requirements), "no_binary": list(self.no_binary),
                "exclude": list(self.exclude), "index_url": self.index_url}


@dataclass(frozen=True)
class WheelUrlStep(_PlanStepBase):
    """One wheel by its URL, outside any index (the router): `requirements` holds that one URL."""

    requirements: tuple[str]
    kind: Literal["wheel_url"] = field(default="wheel_url", init=False)

    def to_json(self) -> dict[str, object]:
        return {**self._head(self.kind), "requirements": list(self.requirements)}


@dataclass(frozen=True)
class SourceStep(_PlanStepBase):
    """A checkout of `source` at its pinned commit, installed (`editable`: where it lies) with its own
    pinned `requirements`."""

    requirements: tuple[str, ...]
    source: str
    git: str
    commit: str
    dir: str
    editable: bool
    kind: Literal["source"] = field(default="source", init=False)

    def to_json(self) -> dict[str, object]:
        return {**self._head(self.kind), "requirements": list(self.requirements), "source": self.source,
                "git": self.git, "commit": self.commit, "dir": self.dir, "editable": self.editable}


# One step of a stack's plan with every pin resolved; a field exists only on the kind that has it.
# to_json() is what `invoke stack.show --json` prints and compiled keys hash (a pip step always has
# index_url, null when it uses the default index).
PlanStep = AptStep | PipStep | WheelUrlStep | SourceStep


class Stack(Model):
    schema_version: int = Field(alias="schema", ge=1, le=1000)
    name: Name
    version: Annotated[str, _grammar(re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}"), "a version such as 2026.11.1")]
    cuda: Annotated[str, _grammar(re.compile(r"[0-9]{1,2}\.[0-9]{1,2}"), "a CUDA version such as 13.0")] | None = None
    driver_min: int | None = Field(None, ge=1, le=10000)
    python: Annotated[str, _grammar(re.compile(r"3\.[0-9]{1,2}"), "a Python version such as 3.12")]
    base: Base
    torch_index: Url | None = None
    image_root: AbsPath
    venv: AbsPath
    arch_list: list[str] = Field(default_factory=list)  # checked below: one spelling for every compiled piece
    cuda_home: AbsPath | None = None
    sources: dict[Name, Source]
    versions: dict[Package, VersionSpec]
    slime_requirements: dict[Package, VersionSpec] = Field(default_factory=dict)
    router: Router | None = None
    patches: Patches | None = None
    steps: list[Step]
    runtime: Runtime | None = None
    smoke: Smoke
    lock: LockSpec = Field(default_factory=LockSpec)
    # Headers the compiled steps include, each with the locked distribution that ships it in the
    # venv (site-packages/nvidia/*/include): a toolkit of nvcc alone (NVIDIA's wheels, conda's
    # cuda-nvcc, a CUDA runtime base) lacks them. The install's prerequisites name any header that
    # neither the toolkit nor the lock provides, before the first download.
    compile_headers: dict[Header, Package] = Field(default_factory=dict)
    # The YAML file it was loaded from: its lock lies beside it (locks/pylock.<name>.toml).
    _file: Path | None = PrivateAttr(default=None)

    @property
    def file(self) -> Path | None:
        return self._file

    @field_validator("arch_list")
    @classmethod
    def _arch_list(cls, v: list[str]) -> list[str]:
        # One spelling, from which every compiled piece's own variable is derived (steps.arch_env).
        bad = [a for a in v if not isinstance(a, str) or not re.fullmatch(r"[1-9][0-9]?\.[0-9]", a)]
        if bad:
            raise ValueError("entries must be compute capabilities such as 9.0 (Hopper) or 10.0 (Blackwell), "
                             f"got {bad}")
        if len(set(v)) != len(v):
            raise ValueError(f"entries must be unique, got {v}")
        return v

    # --- derived -------------------------------------------------------------------------------

    @cached_property
    def data(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)

    @cached_property
    def hash(self) -> str:
        """sha256 of the canonical form of every pin and step: equal stacks hash equal."""
        canon = json.dumps(self.data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()

    @property
    def id(self) -> str:
        return f"{self.name}-{self.hash[:12]}"

    @property
    def cuda_major(self) -> str | None:
        return self.cuda.split(".")[0] if self.cuda else None

    @property
    def wheel_platform(self) -> str:
        """The manylinux platform tag of the target (pip's --platform): manylinux_2_39_x86_64."""
        return f"manylinux_{self.base.glibc.replace('.', '_')}_x86_64"

    @property
    def uv_platform(self) -> str:
        """The same target in uv's --python-platform spelling: x86_64-manylinux_2_39."""
        return f"x86_64-manylinux_{self.base.glibc.replace('.', '_')}"

    @property
    def interpreter(self) -> str:
        """The stack's Python by its version (python3.12): never plain python3, which may be another."""
        return f"python{self.python}"

    def interpreter_packages(self) -> list[str]:
        """The apt packages of that interpreter with venv/ensurepip and the headers extensions build against."""
        return [self.interpreter, f"{self.interpreter}-venv", f"{self.interpreter}-dev"]

    @property
    def site_packages(self) -> str:
        return f"{self.venv}/lib/python{self.python}/site-packages"

    def source_dir(self, name: str, root: str | None = None) -> str:
        return f"{root or self.image_root}/{self.sources[name].dir}"

    def lookup(self, dotted: str) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            node = node[part]
        return node

    def requirement(self, name: str, pins: dict[str, str] | None = None) -> str:
        spec = (pins if pins is not None else self.versions)[name]
        return f"{name}{spec}" if spec.startswith(SPEC_OPERATORS) else f"{name}=={spec}"

    @cached_property
    def plan(self) -> tuple[PlanStep, ...]:
        """The ordered steps with every pin resolved: the one input of both renderers, the lock,
        the patches and the compiled-wheel store (computed once; a Stack never changes)."""
        patch_files = {p.file: p for p in (self.patches.files if self.patches else [])}
        out: list[PlanStep] = []
        for step in self.steps:
            common = (step.name, MappingProxyType(dict(step.env)), step.compiles, step.no_deps, step.constrain_later,
                      tuple(patch_files[p] for p in step.patches))
            if step.apt is not None:
                out.append(AptStep(*common, packages=tuple(step.apt),
                                   probes=tuple(step.without_apt[p].spec(p) if p in step.without_apt else f"{p}:::"
                                                for p in step.apt)))
            elif step.pip is not None:
                out.append(PipStep(*common, requirements=tuple(self.requirement(p) for p in step.pip),
                                   index_url=self.lookup(step.index) if step.index else None,
                                   no_binary=tuple(p.split("[")[0] for p in step.pip) if step.from_source else (),
                                   exclude=tuple(step.exclude)))
            elif step.wheel_url is not None:
                out.append(WheelUrlStep(*common, requirements=(self.lookup(step.wheel_url),)))
            else:
                assert step.source is not None  # exactly one kind (Step._one_kind)
                src = self.sources[step.source]
                reqs = self.lookup(step.requirements) if step.requirements else []
                out.append(SourceStep(*common, source=step.source, git=src.git, commit=src.commit, dir=src.dir,
                                      editable=step.editable,
                                      requirements=tuple(self.requirement(n, self.slime_requirements) for n in reqs)))
        return tuple(out)

    def plan_step(self, name: str) -> PlanStep:
        step = next((s for s in self.plan if s.name == name), None)
        if step is None:
            raise KeyError(f"stack {self.name} has no step {name!r}")
        return step

    def used_patches(self) -> list[PatchFile]:
        """The patch files the plan applies, in step order."""
        return [p for step in self.plan for p in step.patches]

    def builds_from(self, source: str) -> bool:
        """Whether a step of the plan builds from this source (its checkout is needed)."""
        return any(isinstance(s, SourceStep) and s.source == source for s in self.plan)

    def pins(self) -> dict[str, str]:
        """Flat name -> pin map: what `stack.show` prints and the image labels carry."""
        out = {"base.image": self.base.image, "base.digest": self.base.digest or "(resolved at build)",
               "python": self.python, "cuda": self.cuda or "none"}
        out.update({f"source.{n}": s.commit for n, s in self.sources.items()})
        out.update({f"pip.{n}": s for n, s in self.versions.items()})
        out.update({f"slime-req.{n}": s for n, s in self.slime_requirements.items()})
        if self.router:
            out["router.wheel"] = self.router.wheel
        if self.patches:
            commit = self.sources[self.patches.from_source].commit
            out["patches.dir"] = f"{self.patches.from_source}@{commit[:12]}:{self.patches.dir}"
        return out

    # --- cross-field checks ------------------------------------------------------------------

    def reference_problems(self) -> list[Problem]:
        """The rules between fields (names that must exist elsewhere in the stack), each naming its field."""
        out: list[Problem] = []
        names = [s.name for s in self.steps]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            out.append(Problem("steps", f"names must be unique, repeated: {', '.join(dupes)}", show_value=False))
        if taken := sorted({n for n in names if n in RESERVED_STEP_NAMES or n.endswith(REQUIREMENTS_SUFFIX)}):
            out.append(Problem("steps", "names a step as slimeforge names its own steps and files", taken,
                               f"any name but {', '.join(RESERVED_STEP_NAMES)} and <name>{REQUIREMENTS_SUFFIX}"))
        patch_names = {p.file for p in (self.patches.files if self.patches else [])}
        for i, step in enumerate(self.steps):
            where = f"steps.{i} ({step.name})"
            if step.source and step.source not in self.sources:
                out.append(Problem(f"{where}.source", "is not in sources", step.source,
                                   ", ".join(sorted(self.sources))))
            out += [Problem(f"{where}.pip", f"{pkg!r} has no pin in versions (every package must be pinned)",
                            show_value=False) for pkg in step.pip or [] if pkg not in self.versions]
            for attr, key in (("index", step.index), ("wheel_url", step.wheel_url),
                              ("requirements", step.requirements)):
                if key:
                    try:
                        self.lookup(key)
                    except (KeyError, TypeError, IndexError):
                        out.append(Problem(f"{where}.{attr}", "names no value of this stack", key,
                                           "a dotted key such as router.wheel"))
            out += [Problem(f"{where}.without_apt", "names a package the step does not install", pkg,
                            ", ".join(step.apt or []) or "(none)")
                    for pkg in step.without_apt if pkg not in (step.apt or [])]
            out += [Problem(f"{where}.patches", "is not in patches.files", p,
                            ", ".join(sorted(patch_names)) or "(none)") for p in step.patches if p not in patch_names]
        if self.patches:
            if self.patches.from_source not in self.sources:
                out.append(Problem("patches.from_source", "is not in sources", self.patches.from_source,
                                   ", ".join(sorted(self.sources))))
            for pf in self.patches.files:
                if pf.target != "site-packages" and pf.target not in self.sources:
                    out.append(Problem(f"patches.files ({pf.file}).target", "is neither site-packages nor a source",
                                       pf.target))
        return out


def stack_path(ref: str | Path) -> Path:
    """A flavor name (cu13) means images/<name>.yaml; anything else is a path."""
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return paths.IMAGES / f"{ref}.yaml"


def available_flavors() -> list[str]:
    return sorted(p.stem for p in paths.IMAGES.glob("*.yaml") if p.stem != "common")


def load_stack(ref: str | Path) -> Stack:
    path = stack_path(ref)
    if not path.exists():
        raise ConfigError(
            "stack", [Problem("--cuda/--stack", "names no stack file", str(ref),
                              ", ".join(available_flavors()) + " or a path to a stack YAML")]
        )
    data = load_with_extends(path)
    overrides = data.pop("step_overrides", {}) or {}
    steps = data.get("steps")
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()):
        raise ConfigError(str(path), [Problem("step_overrides", "must map step names to the keys they change",
                                              overrides, "name: {key: value}")])
    if isinstance(steps, list) and overrides:
        # Malformed steps are left as they are for the schema to report.
        known = {s["name"] for s in steps if isinstance(s, dict) and isinstance(s.get("name"), str)}
        unknown = sorted(str(k) for k in overrides if k not in known)
        if unknown:
            raise ConfigError(str(path), [Problem("step_overrides", "names steps that do not exist", unknown,
                                                  ", ".join(sorted(known)))])
        data["steps"] = ([deep_merge(s, overrides[s["name"]]) if isinstance(s, dict) and s.get("name") in overrides
                          else s for s in steps])
    stack = validate(Stack, data, str(path))
    problems = stack.reference_problems()
    if problems:
        raise ConfigError(str(path), problems)
    stack._file = path
    return stack
