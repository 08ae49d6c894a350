"""Issue 42 item 6, docs that run as written: the extractor (tests/doc_commands.py) on tricky samples,
every `invoke`/`slimeforge` command of docs/*.md and README.md's shell blocks either run or named in
the one table with why (and the table naming only what the docs show), and the help commands run here.
The dry runs and refusals, a second each, run in tests/integration/heavy/test_doc_commands_run.py."""

from __future__ import annotations

import pytest
from doc_commands import (
    ROOT,
    TABLE,
    DocCommand,
    NotHere,
    PageTest,
    Run,
    cut_comment,
    doc_commands,
    extract,
    invocations,
    run_doc_command,
)

SAMPLE = """\
# A page

Prose that mentions `invoke run x.yaml` and invoke run y.yaml is not a command.

```bash
invoke run a.yaml --dry-run          # a comment
invoke lock --check \\
    --cuda cu13   # continued
echo 'not ours' && invoke run b.yaml
FOO=1 invoke run c.yaml
source <(invoke --print-completion-script bash)
pip install invoke
python -c 'import invoke'
```

```
invoke run d.yaml --set 'name=a # b'   # the quoted # stays
invoke run e.yaml --tag a#b
```

```sh
slimeforge run f.yaml
```

```console
$ invoke run
error: `invoke run` needs RECIPE
usage: invoke run [OPTIONS] RECIPE
e.g.:  invoke run recipes/gsm8k.yaml
$ invoke run g.yaml \\
>   --dry-run
```

```python
invoke("run h.yaml")
```

1. A step:

   ```shell
   invoke run i.yaml
   ```

~~~text
invoke run j.yaml
~~~

````
```bash
invoke run k.yaml
```
````

An indented code block:

    invoke flags.catalog --out FILE

```yaml
cmd: invoke run l.yaml
```

```shape slimeforge.x/1
invoke run m.yaml
```
"""


def test_the_extractor_finds_every_command_of_every_shell_block_and_nothing_else():
    found = extract(SAMPLE, "sample.md")
    assert [c.text for c in found] == [
        "invoke run a.yaml --dry-run",
        "invoke lock --check --cuda cu13",
        "echo 'not ours' && invoke run b.yaml",
        "FOO=1 invoke run c.yaml",
        "source <(invoke --print-completion-script bash)",
        "invoke run d.yaml --set 'name=a # b'",
        "invoke run e.yaml --tag a#b",
        "slimeforge run f.yaml",
        "invoke run",
        "invoke run g.yaml --dry-run",
        "invoke run i.yaml",
        "invoke run j.yaml",
        "invoke run k.yaml",
        "invoke flags.catalog --out FILE",
    ]
    assert found[0] == DocCommand("sample.md", 6, "invoke run a.yaml --dry-run")
    assert found[1].line == 7  # a continued command is named by its first line
    assert [c.line for c in found if c.text.startswith("invoke run g.yaml")] == [30]


def test_a_transcript_keeps_only_its_prompted_lines():
    assert [c.text for c in extract("```\n$ invoke --list\ninvoke run x.yaml\n$ ls\n```\n")] == ["invoke --list"]


def test_a_here_document_is_input_not_commands():
    block = ("```bash\ncat > r.yaml <<'EOF'\ninvoke run not-a-command.yaml\nEOF\ninvoke run r.yaml\n"
             "cat <<-END | sh\ninvoke x\nEND\ngrep a <<<x\ninvoke --list\n```\n")
    # <<< is a here-string: no document follows
    assert [c.text for c in extract(block)] == ["invoke run r.yaml", "invoke --list"]


def test_an_unclosed_fence_is_an_error_not_a_page_without_commands():
    with pytest.raises(ValueError, match="never closed"):
        extract("```bash\ninvoke run x.yaml\n", "bad.md")


@pytest.mark.parametrize(("line", "cut"), [
    ("invoke run a.yaml  # why", "invoke run a.yaml"),
    ("invoke run a.yaml --tag a#b", "invoke run a.yaml --tag a#b"),
    ("invoke run a.yaml --set 'x=# y'  # why", "invoke run a.yaml --set 'x=# y'"),
    ('invoke run a.yaml --set "x=\\"# y"', 'invoke run a.yaml --set "x=\\"# y"'),
    ("invoke run a.yaml --set x=\\#y", "invoke run a.yaml --set x=\\#y"),
    ("# all comment", ""),
])
def test_a_comment_is_cut_where_the_shell_cuts_it(line, cut):
    assert cut_comment(line) == cut


def test_invocations_are_the_argv_of_our_commands_only():
    assert (invocations("python3 -m venv .venv && . .venv/bin/activate && invoke run r.yaml --dry-run")
            == [["invoke", "run", "r.yaml", "--dry-run"]])
    assert (invocations("source <(invoke --print-completion-script bash)")
            == [["invoke", "--print-completion-script", "bash"]])
    assert (invocations("invoke --print-completion-script fish | source")
            == [["invoke", "--print-completion-script", "fish"]])
    assert invocations("FOO=1 slimeforge --list") == [["slimeforge", "--list"]]


DOCS = doc_commands()


def test_the_docs_hold_commands_in_every_page_that_shows_one():
    pages = {c.page for c in DOCS}
    assert {"README.md", "docs/cli.md", "docs/quickstart.md", "docs/multinode.md", "docs/slurm.md",
            "docs/run.md"} <= pages
    assert len(DOCS) >= 90  # 97 at this writing: a sudden drop means the extractor lost a kind of block


def test_every_doc_command_is_run_or_named_with_its_reason():
    missing = [str(c) for c in DOCS if c.text not in TABLE]
    assert not missing, ("commands in the docs neither run nor listed in tests/doc_commands.py's TABLE:\n  "
                         + "\n  ".join(missing))


def test_the_table_names_only_commands_the_docs_show():
    shown = {c.text for c in DOCS}
    stale = [text for text in TABLE if text not in shown]
    assert not stale, "TABLE entries no doc shows any more (remove them, or fix the doc):\n  " + "\n  ".join(stale)


def test_the_table_is_whole():
    for text, entry in TABLE.items():
        assert invocations(text), text
        if isinstance(entry, NotHere):
            assert len(entry.reason) > 20, text
        elif isinstance(entry, PageTest):
            assert (ROOT / entry.test).is_file(), text
        else:
            assert entry.tier in ("unit", "heavy") and entry.says, text
            if entry.before:  # what runs first is itself a doc command that runs, successfully
                before = TABLE[entry.before]
                assert isinstance(before, Run) and before.status == 0, text


def test_the_docs_slurm_dry_runs_are_run_with_the_image_placeholder():
    """Issue 42: `invoke run recipes/gsm8k.yaml --slurm --nodes 2 --dry-run` (a plain fence) renders
    with <IMAGE> as the other dry runs do; held here so that it stays run, not listed."""
    slurm = {c.text for c in DOCS if "--slurm" in c.text and "--dry-run" in c.text}
    assert "invoke run recipes/gsm8k.yaml --slurm --nodes 2 --dry-run" in slurm
    for text in slurm:
        entry = TABLE[text]
        assert isinstance(entry, Run) and entry.status == 0 and "<IMAGE>" in entry.writes[1], text


UNIT = [text for text, entry in TABLE.items() if isinstance(entry, Run) and entry.tier == "unit"]


@pytest.mark.parametrize("text", UNIT)
def test_a_help_command_of_the_docs_runs_as_written(text, tmp_path):
    entry = TABLE[text]
    assert isinstance(entry, Run)
    res = run_doc_command(text, tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == entry.status, f"{text}: exit {res.returncode}\n{out}"
    assert entry.says in out and "Traceback" not in out, f"{text}:\n{out}"
