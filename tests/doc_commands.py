"""Every `invoke` / `slimeforge` command the docs show in a shell block, as the shell reads it.

A shell block is a fence whose info string is empty or a shell's (bash, sh, shell, console, ...; and
`text`, which the docs use for commands too), at any indentation (a fence inside a list item), or an
indented code block. Inside one, a block with `$ `-prompted lines is a transcript: only the prompted
lines are commands, the rest is output. A command is one logical line: backslash-newline
continuations joined, the prompt and a trailing `# comment` cut (a `#` inside quotes, or inside a word,
is not one). A line counts when `invoke` or `slimeforge` is one of its commands (first word, or the
word after `&&`, `||`, `;`, `|`, `<(`, `$(`), so `source <(invoke --print-completion-script bash)`
counts and `usage: invoke run [OPTIONS] RECIPE` (output) does not.

TABLE below names every command the docs show, keyed by its exact text: run here (Run: the exit
status the docs give and a line of what it says), run by its page's own test (PageTest), or not here
(NotHere, with why). tests/unit/test_doc_commands.py holds the extractor to tricky samples and the
docs and the table to each other both ways (a new doc command not in the table fails, and so does an
entry no doc shows any more) and runs the help commands; tests/integration/heavy/test_doc_commands_run.py
runs the rest of the Run entries.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("invoke", "slimeforge")
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "shell-session", "shellsession", "zsh", "terminal", "text"}
FENCE = re.compile(r"(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)")
# Words after which the shell expects a command: where `invoke` would be run rather than be an argument.
COMMAND_START = re.compile(r"(?:^|&&|\|\||[;|]|<\(|\$\()\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?P<word>[^\s;&|()<>]+)")

HEREDOC = re.compile(r"(?<!<)<<(?!<)-?\s*(?P<q>['\"]?)(?P<word>[A-Za-z_][A-Za-z0-9_]*)(?P=q)")


@dataclass(frozen=True)
class DocCommand:
    page: str  # relative to the repository root: docs/run.md, README.md
    line: int  # 1-based, the command's first line
    text: str  # the logical line: continuations joined, prompt and comment cut

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def pages(root: Path = ROOT) -> list[Path]:
    return sorted((root / "docs").glob("*.md")) + [root / "README.md"]


def cut_comment(line: str) -> str:
    """The line without a trailing shell comment: `#` that starts a word, outside quotes."""
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == quote:
                quote = ""
            elif ch == "\\" and quote == '"':
                i += 1
        elif ch == "\\":
            i += 1
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
        i += 1
    return line.rstrip()


def runs_a_program(text: str) -> bool:
    """Whether `invoke` or `slimeforge` is one of the line's commands (not an argument, not output)."""
    return any(m.group("word") in PROGRAMS for m in COMMAND_START.finditer(text))


def logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(first line number, text) with backslash-newline continuations joined (one space between)."""
    out: list[tuple[int, str]] = []
    start, parts = 0, list[str]()
    for number, line in lines:
        if not parts:
            start = number
        body = line.rstrip()
        if body.endswith("\\") and not body.endswith("\\\\"):
            parts.append(body[:-1].strip())
            continue
        parts.append(body.strip())
        out.append((start, " ".join(p for p in parts if p)))
        parts = []
    if parts:
        out.append((start, " ".join(p for p in parts if p)))
    return out


def block_commands(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The commands of one shell block's lines (number, text as in the block)."""
    prompted = any(line.lstrip().startswith("$ ") for _, line in lines)
    if prompted:  # a transcript: a prompted line and its continuations, not the output between
        kept: list[tuple[int, str]] = []
        inside = False
        for number, line in lines:
            if line.lstrip().startswith("$ "):
                kept.append((number, line.lstrip()[2:]))
            elif inside:  # a continuation, without its `> ` prompt
                kept.append((number, re.sub(r"^\s*> ", "", line)))
            else:
                continue
            inside = line.rstrip().endswith("\\")
        lines = kept
    out = []
    heredoc = ""  # the word that ends a here-document: the lines up to it are its input, not commands
    for number, text in logical_lines(lines):
        if heredoc:
            heredoc = "" if text.strip() == heredoc else heredoc
            continue
        text = cut_comment(text).strip()
        if text and runs_a_program(text):
            out.append((number, text))
        m = HEREDOC.search(text)
        if m:
            heredoc = m.group("word")
    return out


def extract(text: str, page: str = "<sample>") -> list[DocCommand]:
    """Every command in the page's shell blocks, in order."""
    found: list[DocCommand] = []
    fence: tuple[str, int, str] | None = None  # (fence marker, its indent, language) while inside one
    block: list[tuple[int, str]] = []
    indented: list[tuple[int, str]] = []
    previous_blank = True

    def flush_indented() -> None:
        found.extend(DocCommand(page, n, t) for n, t in block_commands(indented))
        indented.clear()

    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.fullmatch(line)
        if fence is not None:
            marker, indent, lang = fence
            if (m and m.group("fence")[0] == marker[0] and len(m.group("fence")) >= len(marker)
                    and not m.group("info").strip()):
                if lang in SHELL_LANGS:
                    found.extend(DocCommand(page, n, t) for n, t in block_commands(block))
                fence, block = None, []
            else:  # the fence's own indentation is not part of the block's text
                block.append((number, line[indent:] if line[:indent].isspace() else line.lstrip()))
            continue
        if m:
            flush_indented()
            info = m.group("info").strip()
            fence = (m.group("fence"), len(m.group("indent")), info.split()[0].lower() if info else "")
            previous_blank = False
            continue
        if line.startswith(("    ", "\t")) and line.strip() and (indented or previous_blank):
            indented.append((number, line.strip()))
            continue
        if indented and not line.strip():
            continue  # a blank line inside an indented block keeps it open
        flush_indented()
        previous_blank = not line.strip()
    flush_indented()
    if fence is not None:
        raise ValueError(f"{page}: a fence opened with {fence[0]} is never closed")
    return found


def doc_commands(root: Path = ROOT) -> list[DocCommand]:
    return [c for page in pages(root) for c in extract(page.read_text(), str(page.relative_to(root)))]


def invocations(text: str) -> list[list[str]]:
    """The argv of each `invoke`/`slimeforge` command in a logical line (the other commands left out)."""
    out = []
    for m in COMMAND_START.finditer(text):
        if m.group("word") in PROGRAMS:
            rest = text[m.start("word"):]
            out.append(shlex.split(re.split(r"&&|\|\||[;|)]", rest, maxsplit=1)[0]))
    return out


# ---- the table: every command the docs show, keyed by its exact text (as `extract` gives it) ----


@dataclass(frozen=True)
class Run:
    """Run here, exactly as written (its `invoke`/`slimeforge` commands; a `source <(...)` or a venv
    set-up around them is the reader's shell, this test's environment), in a fresh directory where
    recipes/, tasks/ and tests/ are the checkout's, with the status the docs give and a line they say."""

    status: int
    says: str
    before: str = ""  # a doc command run first in the same directory (a status of the run it rendered)
    tier: str = "heavy"  # "unit": help and --list only (about 0.3 CPU-s each); the rest costs more
    writes: tuple[str, str] = ("", "")  # a file the command writes (relative to its directory) and a line in it
    json: str = ""  # --json: stdout is one document of this schema, held to docs/json.md's shape


@dataclass(frozen=True)
class PageTest:
    """Run by a page's own test, which builds what the page builds first (its /root/ files)."""

    test: str


@dataclass(frozen=True)
class NotHere:
    reason: str


GPU = "needs GPUs (and the driver) on this host"
HOSTS = ("reaches the example inventory's hosts over ssh (gpu-a, gpu-b): none here; the ssh lab "
        "(tests/integration/cluster) runs it on sshd hosts")
SLURM = ("submits to (or reads a job of) a Slurm cluster: no sbatch, partition or /shared here; "
        "tests/integration/slurm runs it on the Slurm lab")
BUILD = ("a real build or install: Docker or the host, the base image from Docker Hub, an hour of compiling "
        "(tests/real runs it with SLIMEFORGE_REAL=1)")
SOURCES = ("/src/... and PATH stand for the reader's slime, Megatron-LM (and demo) checkouts, which come from GitHub "
          "(unreachable here)")
NETWORK = ("resolves against PyPI and Docker Hub and rewrites a committed lock (tests/integration/test_lock.py "
          "resolves against indexes served here)")
PLACEHOLDER = "a usage line: the capitalized words and `...` are placeholders for the reader's values"
REGISTRY = ("pushes to a registry named by example (registry.example.com) or to ECR (AWS): "
           "tests/integration/test_publish.py pushes to a local registry and moto")
LAUNCH = ("a launch: needs GPUs, an image and AWS (the quickstart's refused launch is run by "
         "tests/integration/heavy/test_quickstart_doc.py)")
QUICKSTART = "tests/integration/heavy/test_quickstart_doc.py"
NEVER_LAUNCHED = "never launched (no job recorded)"
DRY_RUN = "invoke run recipes/gsm8k.yaml --dry-run"
DRY_RUN_2NODE = "invoke run recipes/gsm8k-2node.yaml --cluster recipes/clusters/example.yaml --dry-run"
NO_BRINGUP = "no record of a bring-up from this machine"
NOT_BUILT = "run invoke build --cuda cu13 first"
SBATCH = ("runs/gsm8k-3b-smoke/slurm.sbatch",
          "--container-image=<IMAGE>")  # issue 42.6: not refused for want of an image
PLAN = ("runs/gsm8k-3b-smoke/plan.json", '"exp_id": "gsm8k-3b-smoke"')

TABLE: dict[str, Run | PageTest | NotHere] = {
    # help, --list, completion scripts: the unit tier
    "invoke --list": Run(0, "run.status", tier="unit"),
    "invoke run -h": Run(0, "[--options] RECIPE", tier="unit"),
    "invoke --help run": Run(0, "[--options] RECIPE", tier="unit"),
    "invoke run": Run(2, "error: `invoke run` needs RECIPE", tier="unit"),
    "source <(invoke --print-completion-script bash)": Run(0, "complete -F", tier="unit"),
    "source <(invoke --print-completion-script zsh)": Run(0, "compctl -K _complete_invoke", tier="unit"),
    "invoke --print-completion-script fish | source": Run(0, "complete --command invoke", tier="unit"),
    "slimeforge --list": Run(0, "run.status", tier="unit"),
    # dry runs and checks: the heavy tier (a second each)
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]' && invoke run recipes/gsm8k.yaml "
    "--dry-run":
        Run(0, "recipe recipes/gsm8k.yaml: valid", writes=PLAN),
    "slimeforge run gsm8k.yaml --dry-run": Run(0, "recipe gsm8k.yaml: valid", writes=PLAN),
    DRY_RUN: Run(0, "note: no image given: <IMAGE> stands for --image", writes=PLAN),
    "invoke run recipes/gsm8k.yaml --slurm --nodes 2 "
    "--dry-run": Run(0, "note: no image given: <IMAGE> stands for --image", writes=SBATCH),
    "invoke run recipes/gsm8k.yaml --slurm --dry-run --nodes "
    "2": Run(0, "note: no image given: <IMAGE> stands for --image", writes=SBATCH),
    DRY_RUN_2NODE: Run(0, "target ray-cluster", writes=("runs/gsm8k-3b-2node/slime.args", "agentcore.yaml")),
    "invoke build --cuda cu13 --dry-run": Run(0, "would run:\n  DOCKER_BUILDKIT=1 "),
    "invoke install --cuda cu13 --prefix /opt/slime --dry-run": Run(0, "/opt/slime/.slimeforge/install/install.sh"),
    "invoke lock --check --cuda cu13": Run(0, "pylock.cu13.toml: ok ("),
    "invoke cluster.up recipes/clusters/example.yaml --dry-run": Run(0, "gpu-a (head, 10.0.0.11, 8 GPU(s))"),
    # --json documents (docs/json.md), each held to its documented shape
    "invoke run recipes/gsm8k.yaml --dry-run --json": Run(0, "warning: model_dir", json="slimeforge.run-plan/1",
                                                          writes=PLAN),
    "invoke doctor recipes/gsm8k.yaml --json": Run(2, "aws-credentials", json="slimeforge.doctor/1"),
    "invoke doctor --list-checks --json": Run(0, "model-config", json="slimeforge.doctor-checks/1"),
    "invoke stack.show --json | python3 -m json.tool": Run(0, "torch", json="slimeforge.stack/1"),
    # refusals the docs give (exit 2: nothing started)
    "invoke doctor": Run(2, "gpus "),  # no GPU here: the host checks' error
    "invoke doctor recipes/gsm8k.yaml": Run(2, "aws-credentials"),  # no GPU, no AWS credentials here
    "invoke publish --cuda cu13 --registry registry.example.com:5000/slimeforge --dry-run": Run(2, NOT_BUILT),
    "invoke publish --cuda cu13 --registry registry.example.com:5000/team/slime --dry-run": Run(2, NOT_BUILT),
    "invoke publish --cuda cu13 --registry 123456789012.dkr.ecr.us-west-2.amazonaws.com/slime "
    "--dry-run": Run(2, NOT_BUILT),
    "invoke run.status recipes/gsm8k.yaml": Run(2, NEVER_LAUNCHED, before=DRY_RUN),
    "invoke run.logs recipes/gsm8k.yaml --follow": Run(2, NEVER_LAUNCHED, before=DRY_RUN),
    "invoke run.stop recipes/gsm8k.yaml": Run(2, NEVER_LAUNCHED, before=DRY_RUN),
    "invoke run.status runs/gsm8k-3b-2node": Run(2, NEVER_LAUNCHED, before=DRY_RUN_2NODE),
    "invoke run.logs runs/gsm8k-3b-2node --follow": Run(2, NEVER_LAUNCHED, before=DRY_RUN_2NODE),
    "invoke run.stop runs/gsm8k-3b-2node": Run(2, NEVER_LAUNCHED, before=DRY_RUN_2NODE),
    # no cluster was brought up from here: refused before any host is reached
    "invoke run recipes/gsm8k-2node.yaml --cluster recipes/clusters/example.yaml": Run(2, NO_BRINGUP),
    "invoke run recipes/gsm8k-2node.yaml --cluster recipes/clusters/example.yaml --detach": Run(2, NO_BRINGUP),
    "invoke run.status gsm8k-3b-2node --cluster recipes/clusters/example.yaml": Run(2, NO_BRINGUP),
    "invoke run.logs gsm8k-3b-2node --cluster recipes/clusters/example.yaml --follow": Run(2, NO_BRINGUP),
    "invoke run.stop gsm8k-3b-2node --cluster recipes/clusters/example.yaml": Run(2, NO_BRINGUP),
    # the quickstart's own files first (a model config, a GSM8K parquet, the page's recipe)
    "invoke data.gsm8k --src /root/data/gsm8k/main/train-00000-of-00001.parquet --out "
    "/root/data/gsm8k.jsonl": PageTest(QUICKSTART),
    "invoke data.gsm8k --src /root/data/gsm8k/main/train-00000-of-00001.parquet --out /root/data/gsm8k_tiny.jsonl "
    "--limit 64": PageTest(QUICKSTART),
    "invoke run my-gsm8k.yaml --dry-run": PageTest(QUICKSTART),
    "invoke doctor my-gsm8k.yaml": PageTest(QUICKSTART),
    "invoke run my-gsm8k.yaml": PageTest(QUICKSTART),
    "invoke run.status my-gsm8k.yaml": PageTest(QUICKSTART),
    "invoke run.logs my-gsm8k.yaml --follow": PageTest(QUICKSTART),
    "invoke run.stop my-gsm8k.yaml --head": PageTest(QUICKSTART),
    # not here, with why
    "invoke build --cuda cu13": NotHere(BUILD),
    "invoke install --cuda cu13 --prefix /opt/slime": NotHere(BUILD),
    "invoke install --cuda cu13 --prefix /opt/slime --verify": NotHere(BUILD + "; then the smoke test on a GPU"),
    "invoke build --stack tests/stacks/test.yaml --source slime=/src/slime --source libdemo=/src/libdemo":
        NotHere(SOURCES + "; tests/integration/test_build.py builds this stack from sources made here"),
    "invoke install --stack tests/stacks/test.yaml --prefix /tmp/p --source slime=/src/slime --source "
    "libdemo=/src/libdemo":
        NotHere(SOURCES + "; tests/integration/test_install.py installs this stack from sources made here"),
    "invoke patches.check --cuda cu13 --source slime=/src/slime --source megatron=/src/Megatron-LM": NotHere(SOURCES),
    "invoke flags.catalog --python /opt/venv/bin/python --slime /src/slime --megatron /src/Megatron-LM --out "
    "flags.json":
        NotHere(SOURCES + ", and an environment with slime's dependencies (torch, Megatron) at /opt/venv"),
    "invoke flags.catalog --python PY --slime DIR --megatron DIR --out FILE": NotHere(PLACEHOLDER),
    "invoke lock --cuda cu13": NotHere(NETWORK),
    "invoke lock --all": NotHere(NETWORK),
    "invoke lock --complete --cuda cu13": NotHere(NETWORK),
    "invoke lock --upgrade --cuda cu13": NotHere(NETWORK),
    "invoke lock --cuda cu13 --base-digest sha256:...": NotHere(PLACEHOLDER + " (a digest); " + NETWORK),
    "invoke lock --cuda cu13 --router-sha256 HEX": NotHere(PLACEHOLDER + " (a sha256); " + NETWORK),
    "invoke lock --cuda cu13 --source slime=PATH": NotHere(PLACEHOLDER + "; " + SOURCES),
    "invoke lock --stack tests/stacks/test.yaml": NotHere("resolves the test stack against PyPI and rewrites its "
                                                          "committed lock (tests/integration/test_lock.py resolves "
                                                          "stacks against indexes served here)"),
    "invoke publish --cuda cu13 --registry registry.example.com:5000/slimeforge": NotHere(REGISTRY),
    "invoke publish --cuda cu13 --registry registry.example.com:5000/team/slime": NotHere(REGISTRY),
    "invoke publish --cuda cu13 --registry 123456789012.dkr.ecr.us-east-1.amazonaws.com/slime": NotHere(REGISTRY),
    "invoke publish --cuda cu13 --registry 123456789012.dkr.ecr.us-west-2.amazonaws.com/slime": NotHere(REGISTRY),
    "invoke publish --image my/local:tag --tag extra --registry registry.example.com/team/x --record "
    "pub.json": NotHere(REGISTRY),
    "invoke publish --image slimerl/slime:latest --registry 123456789012.dkr.ecr.us-west-2.amazonaws.com/slime "
    "--record slime-image.json":
        NotHere(REGISTRY + "; slime's image comes from Docker Hub"),
    "invoke doctor my-gsm8k.yaml --image slimerl/slime:latest":
        NotHere("needs slime's image (Docker Hub); an image of its layout built here is probed in "
                "tests/integration/test_any_image.py"),
    "invoke doctor --kernels --prefix /opt/sf": NotHere(GPU + ", and an install at /opt/sf"),
    "invoke cluster.up recipes/clusters/example.yaml": NotHere(HOSTS),
    "invoke cluster.up recipes/clusters/example.yaml --nccl-check": NotHere(HOSTS + "; and GPUs for the all-reduce"),
    "invoke cluster.status recipes/clusters/example.yaml": NotHere(HOSTS),
    "invoke cluster.down recipes/clusters/example.yaml": NotHere(HOSTS),
    "invoke run recipes/gsm8k.yaml": NotHere(LAUNCH),
    "invoke run recipes/my-run.yaml": NotHere("a recipe of the reader's (recipes/my-run.yaml is not shipped), "
                                              "and " + LAUNCH),
    "invoke run recipes/gsm8k.yaml --slurm --nodes 2 --time 04:00:00": NotHere(SLURM),
    "invoke run recipes/gsm8k.yaml --slurm --partition gpu --account ml --time 04:00:00 --nodes 2": NotHere(SLURM),
    "invoke run recipes/gsm8k.yaml --slurm --nodes 2 --partition gpu --time 04:00:00 --out "
    "/shared/runs/gsm8k": NotHere(SLURM),
    "invoke run recipes/gsm8k.yaml --slurm --nodes 2 --mode container --image REG/repo@sha256:... --squashfs-dir "
    "/shared/images --out /shared/runs/gsm8k":
        NotHere(SLURM + "; REG/repo@sha256:... is a placeholder"),
    "invoke run.status /shared/runs/gsm8k": NotHere(SLURM),
    "invoke run.logs /shared/runs/gsm8k --follow": NotHere(SLURM),
    "invoke run.stop /shared/runs/gsm8k": NotHere(SLURM),
}


def run_doc_command(text: str, where: Path, before: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a table's Run command in `where` (made ready as the docs assume: the checkout's recipes/,
    tasks/ and tests/; for `slimeforge`, the README's copied gsm8k.yaml); its `before` first unless
    that has run there already. Returns the last invocation's result; an earlier one that fails is
    returned at once."""
    entry = TABLE[text]
    assert isinstance(entry, Run), text
    where.mkdir(parents=True, exist_ok=True)
    for name in ("tasks", "recipes", "tests"):
        if not (where / name).exists():
            (where / name).symlink_to(ROOT / name)
    if not (where / "gsm8k.yaml").exists():
        shutil.copy(ROOT / "recipes" / "gsm8k.yaml", where / "gsm8k.yaml")  # README: cp .../recipes/gsm8k.yaml .
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("RAY_ADDRESS",
                                                                                         "WANDB_API_KEY", "HF_TOKEN")}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}", SLIMEFORGE_STATE_HOME=str(where / ".state"),
               SLIMEFORGE_STATE_DIR=str(where / ".state-dir"), XDG_STATE_HOME=str(where / ".xdg-state"))
    argvs = ([*invocations(entry.before)] if entry.before and before else []) + invocations(text)
    result = None
    for argv in argvs:
        result = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=where, env=env, capture_output=True,
                                text=True, timeout=300)
        if result.returncode and argv is not argvs[-1]:
            break
    assert result is not None, f"{text}: no invoke/slimeforge command in it"
    return result
