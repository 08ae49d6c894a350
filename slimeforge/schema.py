"""A strict pydantic base and the translation of its errors into our Problems (with did-you-mean)."""

from __future__ import annotations

import difflib
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict

from .errors import ConfigError, Problem

M = TypeVar("M", bound=BaseModel)


class Model(BaseModel):
    # Unknown keys are errors: a misspelt key silently ignored is how an hour of GPUs is lost.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


def _fields_at(cls: type[BaseModel], loc: tuple) -> list[str]:
    """The field names accepted at the location of an unknown key, for the did-you-mean."""
    model: Any = cls
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        model = None
        for cand in (ann, *getattr(ann, "__args__", ())):
            for inner in (cand, *getattr(cand, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    model = inner
    return list(getattr(model, "model_fields", {})) if model is not None else []


def did_you_mean(word: str, choices: list[str]) -> str | None:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def problems_from(cls: type[BaseModel], exc: pydantic.ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        kind = err["type"]
        if kind == "extra_forbidden":
            choices = _fields_at(cls, loc)
            hint = did_you_mean(str(loc[-1]), choices)
            msg = "is not a known key" + (f"; did you mean {hint!r}?" if hint else "")
            problems.append(Problem(where, msg, show_value=False, accepted=", ".join(sorted(choices)) or None))
        elif kind == "missing":
            problems.append(Problem(where, "is required but missing", show_value=False))
        else:
            problems.append(Problem(where, err["msg"], err.get("input")))
    return problems


def validate(cls: type[M], data: Any, source: str) -> M:
    try:
        return cls.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(source, problems_from(cls, exc)) from None
