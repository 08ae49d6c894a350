"""GSM8K as training data: the Hugging Face rows ({"question", "answer"}, the answer's last line
"#### 72") become one rollout request a line in the seed's form,

    {"prompt": QUESTION, "metadata": {"prompt": QUESTION, "answer": "72"}}

(`prompt` for slime's length filter; `metadata` the payload the agent's @rollout_entrypoint gets).
`invoke data.gsm8k --src FILE --out gsm8k.jsonl` reads a local file only (JSONL, or Parquet when
pyarrow is installed): the download is the user's own (`hf download openai/gsm8k ...`, see
docs/quickstart.md). Every row is checked before anything is written; the output is written whole
or not at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import readback
from ..atomic import output_problem, write_output
from ..errors import ConfigError, Problem

MAX_SOURCE_BYTES = 256 << 20  # GSM8K's train split is 4 MB as JSONL, 2 MB as Parquet
MAX_ROWS = 1_000_000
MAX_TEXT = 20_000  # characters of a question or solution (GSM8K's longest is under 1,000)
MAX_PROBLEMS = 20  # a wrong file is named by its first rows, not all of them
FINAL_RE = re.compile(r"-?[0-9][0-9,]*(\.[0-9]+)?")  # "#### 1,200": digits, thousands commas, a decimal part
# C0/C1 controls (newline and tab are text here: JSON escapes them) and bidirectional overrides.
CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
ACCEPTED_ROW = '{"question": "...", "answer": "... #### 72"} (the Hugging Face openai/gsm8k rows)'


def _source_rows(src: Path) -> Iterator[tuple[int, Any]]:
    """(row number, row) of a JSONL or Parquet file; a JSONL line that is not JSON is its text."""
    # Through the one reader, bounded: a FIFO or a device named as --src is refused, never read forever.
    data = readback.read_bytes(src, "--src", "a GSM8K JSONL or Parquet file", max_bytes=MAX_SOURCE_BYTES,
                               follow_symlinks=True)
    if data is None:
        raise ConfigError("data.gsm8k", [Problem("--src", "does not exist", str(src),
                                                 "a GSM8K JSONL or Parquet file you downloaded")])
    if src.suffix == ".parquet":
        try:
            import pyarrow as pa  # optional: only Parquet needs it (pip install pyarrow)
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("data.gsm8k", [Problem("--src", "is Parquet, which needs pyarrow (not installed)",
                                                     str(src),
                                                     "pip install pyarrow, or a JSONL file of the same "
                                                     "rows")]) from None
        try:
            table = pq.read_table(pa.BufferReader(data), columns=["question", "answer"])
        except Exception as exc:  # noqa: BLE001 - pyarrow's own message names what is wrong
            raise ConfigError("data.gsm8k", [Problem("--src",
                                                     "is not a Parquet file with question and answer columns: "
                                                     f"{exc}", str(src))]) from None
        if table.num_rows > MAX_ROWS:
            raise ConfigError("data.gsm8k", [Problem("--src", f"has {table.num_rows} rows, more than {MAX_ROWS}",
                                                     str(src))])
        yield from enumerate(table.to_pylist(), start=1)
        return
    text = readback.decode(src, "--src", "UTF-8 JSONL", data)
    for n, line in enumerate(text.splitlines(), start=1):
        if n > MAX_ROWS:
            raise ConfigError("data.gsm8k", [Problem("--src", f"has more than {MAX_ROWS} rows", str(src))])
        if not line.strip():
            continue
        try:
            yield n, readback.json_loads(line)
        except ValueError:
            yield n, line  # reported as "is not a JSON object", showing the line


def _text_problem(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return "is not a non-empty string"
    if len(value) > MAX_TEXT:
        return f"is {len(value)} characters long (at most {MAX_TEXT})"
    if m := CONTROL_RE.search(value):
        return f"holds a control character (U+{ord(m.group()):04X}) at position {m.start()}"
    return None


def convert_row(row: Any, where: str) -> tuple[dict | None, list[Problem]]:
    """One GSM8K row as a training row, or the problems that stop it."""
    if not isinstance(row, dict):
        return None, [Problem(where, "is not a JSON object", row, ACCEPTED_ROW)]
    problems = [Problem(f"{where}: {key}", why, row.get(key), ACCEPTED_ROW) for key in ("question",
                                                                                        "answer")
                if (why := _text_problem(row.get(key)))]
    if problems:
        return None, problems
    question, solution = row["question"].strip(), row["answer"]
    final = solution.rsplit("####", 1)[1].strip() if "####" in solution else None
    if final is None or not FINAL_RE.fullmatch(final):
        return None, [Problem(f"{where}: answer", "does not end in '#### <number>'", solution[-80:],
                              "GSM8K's solution text, last line e.g. '#### 72'")]
    answer = final.replace(",", "")  # "1,200" -> "1200": what the agent compares its number with
    return {"prompt": question, "metadata": {"prompt": question, "answer": answer}}, []


def convert(src: str | Path, out: str | Path, limit: int | None = None) -> int:
    """Write `out` from the GSM8K file `src` (its first `limit` rows when given); returns the row
    count. Every input row is checked first; nothing is written when any is wrong."""
    src_path = Path(src)
    pre = []
    if limit is not None and not (isinstance(limit, int) and 1 <= limit <= MAX_ROWS):
        pre.append(Problem("--limit", "is not a whole number of rows", limit, f"1 to {MAX_ROWS}"))
    if src_path.suffix not in (".jsonl", ".json", ".parquet"):
        pre.append(Problem("--src", "is neither JSONL (.jsonl) nor Parquet (.parquet)", str(src),
                           "the file you downloaded, e.g. main/train-00000-of-00001.parquet"))
    if why := output_problem(out):
        pre.append(Problem("--out", why, str(out), "a new file in an existing directory, or a regular file to replace"))
    if pre:
        raise ConfigError("data.gsm8k", pre)
    lines: list[str] = []
    problems: list[Problem] = []
    for n, row in _source_rows(src_path):
        if limit is not None and len(lines) >= limit:
            break
        got, bad = convert_row(row, f"{src} row {n}")
        problems += bad
        if got is not None:
            lines.append(json.dumps(got, ensure_ascii=False))
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise ConfigError("data.gsm8k", problems[:MAX_PROBLEMS])
    if not lines:
        raise ConfigError("data.gsm8k", [Problem("--src", "holds no rows", str(src), ACCEPTED_ROW)])
    write_output(out, "\n".join(lines) + "\n", where="--out")
    return len(lines)
