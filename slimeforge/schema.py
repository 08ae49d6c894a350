"""A strict pydantic base and the translation of its errors into our Problems (with did-you-mean)."""

from __future__ import annotations

import difflib
import re
import types
import typing
import unicodedata
from dataclasses import dataclass
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.fields import FieldInfo

from .errors import ConfigError, Problem

M = TypeVar("M", bound=BaseModel)


# --- numbers -------------------------------------------------------------------------------------
# Every number that comes as text (an option, an environment variable, a record, a quoted YAML
# value) is parsed here and nowhere else. ASCII digits only: str.isdigit() takes '²' and int()
# takes '٣' (Arabic-Indic three) and '1_000'; bash reads 099 as octal. Bounds come first in the
# grammar (at most 18 digits), so a 10,000-digit value is refused before int() spends time on it.
WHOLE_RE = re.compile(r"[0-9]{1,18}")


def whole_problem(value: object, where: str, low: int, high: int, unit: str = "") -> Problem | None:
    """Why `value` (text of ASCII digits, or an int that is not a bool) is not a whole number in
    low..high, or None."""
    accepted = f"a whole number{f' of {unit}' if unit else ''}, {low}..{high}, in ASCII digits"
    if isinstance(value, bool):  # YAML's true is an int to Python: never a count or a port
        return Problem(where, "is a yes/no value, not a number", value, accepted)
    if isinstance(value, str):
        if not WHOLE_RE.fullmatch(value):
            return Problem(where, "is not a whole number", value, accepted)
        value = int(value)
    if not isinstance(value, int):
        return Problem(where, f"is {type(value).__name__}, not a whole number", value, accepted)
    if not low <= value <= high:
        return Problem(where, f"is out of range ({low}..{high})", value, accepted)
    return None


def parse_whole(value: object, where: str, low: int, high: int, *, unit: str = "", source: str = "command line") -> int:
    """The one parser of whole numbers: `value` as an int in low..high, or a ConfigError naming
    `where` (an option, a field, a variable), the value and what is accepted."""
    if problem := whole_problem(value, where, low, high, unit):
        raise ConfigError(source, [problem])
    return int(value)  # type: ignore[call-overload]  # checked above: text of digits or an int


def _number_problem(ann: Any, value: Any) -> str | None:
    """Why `value` cannot stand where the annotation `ann` wants a number (a bool, or text that is
    not ASCII digits), or None. Looks into lists and mappings of numbers too."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann in (int, float):
        if isinstance(value, bool):
            return "is a yes/no value (true/false), not a number"
        if isinstance(value, str) and not (WHOLE_RE if ann is int else _FLOAT_TEXT_RE).fullmatch(value):
            return "is text, not a number in ASCII digits"
        return None
    if origin in (list, tuple) and args and isinstance(value, list | tuple):
        return next((why for v in value if (why := _number_problem(args[0], v))), None)
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return next((why for v in value.values() if (why := _number_problem(args[1], v))), None)
    if origin in (typing.Union, types.UnionType) and bool not in args and str not in args:
        numeric = [a for a in args if a in (int, float)]
        return _number_problem(numeric[0], value) if len(numeric) == 1 else None
    return None


_FLOAT_TEXT_RE = re.compile(r"-?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][-+]?[0-9]{1,3})?")


class Model(BaseModel):
    # Unknown keys are errors: a misspelt key silently ignored is how an hour of GPUs is lost.
    # inf and nan are never a setting: `--weight-decay nan` would reach slime as given.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Lax pydantic takes YAML's `true` as 1 and any text int() reads: a bool is never a count or
        a port here, and a number given as text must be ASCII digits (the one grammar of WHOLE_RE)."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and (why := _number_problem(field.annotation, value)):
            raise ValueError(why)
        return value


# --- text that may reach a file, an argv or a template --------------------------------------------
# Control characters start a new Dockerfile instruction or a new line of launch.sh; bidirectional
# controls (Trojan Source) make a value read differently from what it is. Neither is ever part of
# a name, path, version or URL, so every string of every input is checked for them.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# An environment variable name (bounded): stack env, recipe env and secrets, inventory env, build args.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Lone surrogates: bytes that are not UTF-8 in an argv or a file name (Python's surrogateescape); they
# cannot be written to a UTF-8 file or terminal, so they are refused (and shown as '?') like controls.
_SURROGATES = "\ud800-\udfff"
_CONTROL_RE = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_BIDI}{_SURROGATES}]")
_CONTROL_NAMES = {"\n": "newline", "\r": "carriage return", "\t": "tab", "\x00": "NUL", "\x1b": "escape"}
MAX_TEXT = 4096  # longest string accepted anywhere (a path is at most 4096 bytes on Linux)


def text_problem(value: str) -> str | None:
    """Why `value` may not be used as text in a generated file, or None if it may."""
    m = _CONTROL_RE.search(value)
    if m:
        ch = m.group()
        if 0xDC80 <= ord(ch) <= 0xDCFF:
            return f"holds a byte that is not UTF-8 text (0x{ord(ch) - 0xDC00:02x}) at position {m.start()}"
        if 0xD800 <= ord(ch) <= 0xDFFF:
            return f"holds a lone surrogate (U+{ord(ch):04X}), not text, at position {m.start()}"
        name = _CONTROL_NAMES.get(ch) or unicodedata.name(ch, None) or "a control character"
        return f"holds a control character ({name}, U+{ord(ch):04X}) at position {m.start()}"
    if len(value) > MAX_TEXT:
        return f"is {len(value)} characters long"
    return None


def printable(text: str) -> str:
    """`text` from a report or a tool with every control and bidirectional character replaced by
    '?': what reaches a terminal never carries an escape sequence or a forged line."""
    return _CONTROL_RE.sub("?", text)


def excerpt(text: str, limit: int = 300, sep: str = "; ") -> str:
    """Another program's words (Docker's, ssh's) fit for one line of ours: whole lines, blank ones
    dropped, as many as `limit` characters hold, joined by `sep`, each `printable`. A cut never
    falls inside a line, except the first one when it alone is longer (then it ends in '...')."""
    lines = [printable(line.strip()) for line in text.splitlines() if line.strip()]
    kept: list[str] = []
    for line in lines:
        if len(sep.join([*kept, line])) > limit:
            break
        kept.append(line)
    if not kept and lines:
        return lines[0][: max(limit - 3, 1)] + "..."
    return sep.join(kept) + (f"{sep}..." if len(kept) < len(lines) else "")


def _key_text(key: Any) -> str:
    """A mapping key as a field path shows it: a number too long for str() by its size."""
    if isinstance(key, int) and key.bit_length() > 1000:
        return f"(a number of {key.bit_length()} bits)"
    return str(key)


def text_problems(data: Any, where: str = "") -> list[Problem]:
    """Every key and string value under `data` that `text_problem` refuses, by its field path."""
    out: list[Problem] = []
    stack: list[tuple[str, Any]] = [(where, data)]
    while stack:
        path, node = stack.pop()
        items: list[tuple[str, Any]] = []
        if isinstance(node, dict):
            for key, value in node.items():
                sub = f"{path}.{_key_text(key)}" if path else _key_text(key)
                if isinstance(key, str) and (why := text_problem(key)):
                    out.append(Problem(sub, f"key {why}", key,
                                       "printable text without control or bidirectional characters"))
                items.append((sub, value))
        elif isinstance(node, list | tuple):
            items = [(f"{path}.{i}" if path else str(i), v) for i, v in enumerate(node)]
        elif isinstance(node, str) and (why := text_problem(node)):
            out.append(Problem(path or "(value)", why, node,
                               f"printable text without control or bidirectional characters, at most {MAX_TEXT}"))
        stack.extend(reversed(items))
    return out


# --- secrets -------------------------------------------------------------------------------------
# A name is a secret's when one of its words (split at '_' or '-', any case) is one of these, or
# two adjacent words are: OPENAI_API_KEY, github_pat, HF_TOKEN, wandb-key, DB_PASSWD, ...
_SECRET_WORDS = {"token", "tokens", "secret", "secrets", "password", "passwd", "pass", "passphrase", "pat",
                 "credential", "credentials", "creds", "apikey", "key", "keys", "auth", "cookie", "signature",
                 "privatekey", "accesskey"}
# Values by the shape of well-known credentials: OpenAI/Anthropic (sk-), GitHub (ghp_, github_pat_),
# Slack (xox?-), Hugging Face (hf_), AWS access key ids (AKIA/ASIA), JWTs and PEM private keys.
_SECRET_VALUE_RE = re.compile(r"(?:sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
                              r"|xox[abposr]-[A-Za-z0-9-]{10,}|hf_[A-Za-z0-9]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
                              r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*"
                              r"|-----BEGIN [A-Z ]*PRIVATE KEY-----)")


def secret_name(name: str) -> bool:
    """Whether an environment variable or flag name looks like it carries a secret."""
    words = [w for w in re.split(r"[_\-.]+", name.lower()) if w]
    return (any(w in _SECRET_WORDS for w in words)
            or any(a + b in _SECRET_WORDS for a, b in zip(words, words[1:], strict=False)))


def secret_value(value: object) -> bool:
    """Whether a value has the shape of a well-known kind of credential."""
    return isinstance(value, str) and _SECRET_VALUE_RE.search(value) is not None


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


@dataclass(frozen=True)
class Worded:
    """How a field's bounds read when a value breaks them: pydantic checks the Field(ge=..., le=...)
    beside it in the field's Annotated type; a Problem then says `message`, the value, and the
    accepted range read from those bounds (`note` after it). A field without one keeps pydantic's words."""

    message: str
    note: str = ""


_BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def accepted_range(name: str, info: FieldInfo) -> str:
    """A field's bounds as a Problem's accepted text: `1..64` for whole numbers, `> 0`, `0 < name < 1`."""
    b = {attr: getattr(m, attr) for m in info.metadata for attr in ("ge", "gt", "le", "lt")
         if getattr(m, attr, None) is not None}
    low = ("<=", b["ge"]) if "ge" in b else ("<", b["gt"]) if "gt" in b else None
    high = ("<=", b["le"]) if "le" in b else ("<", b["lt"]) if "lt" in b else None
    if info.annotation in (int, int | None) and "ge" in b and "le" in b:
        text = f"{b['ge']}..{b['le']}"
    elif low and high:
        text = f"{low[1]} {low[0]} {name} {high[0]} {high[1]}"
    elif low:
        text = f"{low[0].replace('<', '>')} {low[1]}"
    else:
        text = f"{high[0]} {high[1]}" if high else ""
    note = next((m.note for m in info.metadata if isinstance(m, Worded) and m.note), "")
    return text + (f" {note}" if note else "") + (", or leave it "
                                                  "out" if info.default is None and not info.is_required() else "")


def _bound_problem(cls: type[BaseModel], loc: tuple, kind: str, value: Any) -> Problem | None:
    """The Problem of a value out of a Worded field's bounds, or None (another error, another field)."""
    info = cls.model_fields.get(str(loc[0])) if len(loc) == 1 and kind in _BOUND_ERRORS else None
    worded = next((m for m in info.metadata if isinstance(m, Worded)), None) if info is not None else None
    if info is None or worded is None:
        return None
    return Problem(str(loc[0]), worded.message, value, accepted_range(str(loc[0]), info))


def problems_from(cls: type[BaseModel], exc: pydantic.ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        kind = err["type"]
        if bound := _bound_problem(cls, loc, kind, err.get("input")):
            problems.append(bound)
        elif kind == "extra_forbidden":
            choices = _fields_at(cls, loc)
            hint = did_you_mean(str(loc[-1]), choices)
            msg = "is not a known key" + (f"; did you mean {hint!r}?" if hint else "")
            problems.append(Problem(where, msg, show_value=False, accepted=", ".join(sorted(choices)) or None))
        elif kind == "missing":
            problems.append(Problem(where, "is required but missing", show_value=False))
        else:
            value = err.get("input")
            # A rule between fields fails on the whole mapping: the message names the culprit.
            show = not isinstance(value, dict | list)
            # A validator's own ValueError reads as a sentence of ours, without pydantic's "Value error, ".
            msg = err["msg"].removeprefix("Value error, ") if kind == "value_error" else err["msg"]
            problems.append(Problem(where, msg, value if show else None, show_value=show))
    return problems


# Every whole number of every input fits in 64 bits (the largest real one is a byte count); sizes are
# bounded before anything formats, compares or renders a number: Python refuses to turn an int of
# more than 4300 digits into text (a ValueError in any str(), f-string or repr).
MAX_INT_BITS = 63


def number_problems(data: Any, where: str = "") -> list[Problem]:
    """Every whole number under `data` outside +-2**63 (bool aside), by its field path; its size in
    bits is said, never the number (it may be too long to print)."""
    out: list[Problem] = []
    stack: list[tuple[str, Any]] = [(where, data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                sub = f"{path}.{_key_text(key)}" if path else _key_text(key)
                if isinstance(key, int) and not isinstance(key, bool) and key.bit_length() > MAX_INT_BITS:
                    out.append(Problem(path or "(top level)", f"has a key that is a number of {key.bit_length()} bits",
                                       show_value=False))
                stack.append((sub, value))
        elif isinstance(node, list | tuple):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool) and node.bit_length() > MAX_INT_BITS:
            out.append(Problem(path or "(value)",
                               f"is a number of {node.bit_length()} bits (about "
                               f"{int(node.bit_length() * 0.30103) + 1} digits)",
                               show_value=False,
                               accepted=f"a whole number from -2**{MAX_INT_BITS} to 2**{MAX_INT_BITS}"))
    return out


def model_problems(cls: type[M], data: Any) -> tuple[M | None, list[Problem]]:
    """(the model, []) or (None, every problem): control characters and sizes first, then the schema's."""
    problems = text_problems(data) + number_problems(data)
    if problems:
        return None, problems
    try:
        return cls.model_validate(data), []
    except pydantic.ValidationError as exc:
        return None, problems_from(cls, exc)


def validate(cls: type[M], data: Any, source: str) -> M:
    model, problems = model_problems(cls, data)
    if problems or model is None:
        raise ConfigError(source, problems)
    return model
