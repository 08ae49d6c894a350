"""`invoke data.gsm8k`: Hugging Face GSM8K rows ({question, answer "... #### 72"}) become the
seed's training rows ({"prompt", "metadata": {"prompt", "answer"}}), every input row checked
first, the output written whole or not at all, and accepted by the preflight's data check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.errors import ConfigError
from slimeforge.run.gsm8k import convert
from slimeforge.run.preflight.data import data_findings

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "fixtures" / "gsm8k" / "train-sample.jsonl"


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_become_the_seeds_form_and_the_preflight_accepts_them(tmp_path):
    out = tmp_path / "gsm8k.jsonl"
    assert convert(SAMPLE, out) == 3
    got = rows(out)
    source = rows(SAMPLE)
    assert [r["prompt"] for r in got] == [s["question"] for s in source]
    answers = ["7", "1200", "25"]
    assert [r["metadata"] for r in got] == [{"prompt": s["question"], "answer": a}
                                            for s, a in zip(source, answers, strict=True)]
    # a question's newline is escaped within its line
    assert len(out.read_text().splitlines()) == 3 and "\n" in got[2]["prompt"]
    (finding,) = data_findings(str(out), "data_path")
    assert finding.level == "ok", finding


def test_limit_makes_a_small_set(tmp_path):
    out = tmp_path / "tiny.jsonl"
    assert convert(SAMPLE, out, limit=2) == 2 and len(rows(out)) == 2


def test_bad_rows_are_named_and_nothing_is_written(tmp_path):
    src = tmp_path / "bad.jsonl"
    good = SAMPLE.read_text().splitlines()[0]
    src.write_text("\n".join([good, '{"question": "What?", "answer": "no final line"}', "not json",
                              '{"question": "Q\\u001b[2J", "answer": "#### 1"}',
                              '{"question": "Q", "answer": "#### seven"}', "[1, 2]"]) + "\n")
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    with pytest.raises(ConfigError) as err:
        convert(src, out)
    text = str(err.value)
    assert f"{src} row 2: answer: does not end in '#### <number>'" in text
    assert f"{src} row 3: is not a JSON object (got 'not json')" in text
    assert f"{src} row 4: question: holds a control character (U+001B)" in text
    assert (f"{src} row 5: answer: does not end in '#### <number>'" in text
            and f"{src} row 6: is not a JSON object" in text)
    assert "row 1" not in text and len(err.value.problems) == 5
    assert out.read_text() == "old\n"  # all or nothing


def test_options_are_checked_before_anything_is_read(tmp_path):
    with pytest.raises(ConfigError) as err:
        convert(tmp_path / "gsm8k.csv", tmp_path / "no-such-dir" / "out.jsonl", limit=0)
    assert {p.where for p in err.value.problems} == {"--src", "--out", "--limit"}
    with pytest.raises(ConfigError, match="--src: does not exist"):
        convert(tmp_path / "absent.jsonl", tmp_path / "out.jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(ConfigError, match="not a regular file"):
        convert(tmp_path / "fifo.jsonl", tmp_path / "out.jsonl")  # refused by the one reader, never read forever


def test_parquet_as_hugging_face_ships_it(tmp_path):
    pa = pytest.importorskip("pyarrow",
                             reason="Parquet input needs pyarrow (pip install pyarrow); JSONL is covered above")
    import pyarrow.parquet as pq

    source = rows(SAMPLE)
    src = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"question": [r["question"] for r in source], "answer": [r["answer"] for r in source]}),
                   src)
    out = tmp_path / "gsm8k.jsonl"
    assert convert(src, out) == 3
    with pytest.raises(ConfigError, match="--src: is not a Parquet file with question and answer columns"):
        convert(_copy(SAMPLE, tmp_path / "not.parquet"), tmp_path / "x.jsonl")
    assert rows(out) == [{"prompt": r["question"], "metadata": {"prompt": r["question"], "answer": a}}
                         for r, a in zip(source, ["7", "1200", "25"], strict=True)]


def test_the_invoke_task(tmp_path):
    r = subprocess.run([sys.executable, "-m", "invoke", "data.gsm8k", "--src", str(SAMPLE), "--out",
                        str(tmp_path / "g.jsonl"), "--limit", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == f"wrote {tmp_path / 'g.jsonl'}: 1 rows\n", r.stdout + r.stderr
    bad = subprocess.run([sys.executable, "-m", "invoke", "data.gsm8k", "--src", str(SAMPLE), "--out",
                          str(tmp_path / "g.jsonl"), "--limit", "x"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--limit" in bad.stderr, bad.stderr
