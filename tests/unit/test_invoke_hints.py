"""Every `invoke ...` hint in the code, templates and docs names a real task and real options of
it, as invoke itself knows them: tasks.py's namespace, loaded the way `invoke` loads it, and each
task's parser context (its flags and --no-... inverses). A renamed task or option fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from invoke import Collection
from invoke.loader import FilesystemLoader
from lock_support import fresh_clone_stack

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "slimeforge").rglob("*.py")), ROOT / "tasks" / "__init__.py",
           *sorted((ROOT / "templates").iterdir()),
           *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", *sorted((ROOT / "recipes").rglob("*.yaml")),
           *sorted((ROOT / "images").glob("*.yaml")), *sorted((ROOT / "benchmarks").glob("*.py")), ROOT / ".ci" / "run"]
# `invoke TASK ...` up to the end of the hint: a closing backtick or quote, a bracket, a comment,
# a pipe, or the end of the line.
HINT_RE = re.compile(r"(?<![\w/.-])invoke\s+([a-z][a-z0-9_-]*(?:\.[a-z][a-z0-9_-]*)?)([^`'\"()#|;\n]*)")
PROSE = {"tasks", "task", "import"}  # "thin invoke tasks over ...", "from invoke import": the program, not a hint


def namespace() -> Collection:
    module, _ = FilesystemLoader(start=str(ROOT)).load("tasks")
    return Collection.from_module(module)


def contexts() -> dict[str, set[str]]:
    """Task name (and alias) -> the flags its parser accepts."""
    known: dict[str, set[str]] = {}
    for ctx in namespace().to_contexts():
        flags = set(ctx.flags) | set(ctx.inverse_flags) | {"--help", "-h"}
        for name in (ctx.name, *ctx.aliases):
            known[name] = flags
    return known


def hints() -> list[tuple[str, str, list[str]]]:
    found = []
    for path in SOURCES:
        if not path.is_file():
            continue
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in HINT_RE.finditer(line):
                if m.group(1) in PROSE:
                    continue
                rest = m.group(2)
                # `invoke run.status/run.logs`: each alternative is a task.
                alternatives = re.match(r"((?:/[a-z][a-z0-9_-]*(?:\.[a-z][a-z0-9_-]*)?)*)", rest).group(1)
                tokens = [t.strip("[]\\.,:") for t in rest[len(alternatives):].split()]
                options = [t.split("=", 1)[0] for t in tokens if t.startswith("--") and t != "--"]
                # `run.status/logs/stop`: a bare alternative is a sibling in the first one's collection.
                prefix = m.group(1).rpartition(".")[0]
                siblings = [a if "." in a or not prefix else f"{prefix}.{a}" for a in alternatives.split("/")[1:]]
                for task in (m.group(1), *siblings):
                    found.append((f"{path.relative_to(ROOT)}:{lineno}", task, options))
    return found


def test_the_hints_are_found():
    found = hints()
    assert len(found) > 100  # the scan reads what it should (code, templates, docs)
    assert any(task == "run.stop" for _, task, _ in found) and any("--dry-run" in opts for _, _, opts in found)


def test_every_hint_names_a_real_task_and_real_options():
    known = contexts()
    wrong = []
    for where, task, options in hints():
        if task not in known:
            wrong.append(f"{where}: `invoke {task}`: no such task")
            continue
        wrong += [f"{where}: `invoke {task} {opt}`: no such option" for opt in options if opt not in known[task]]
    assert not wrong, "\n".join(wrong)


def positional_flags() -> dict[str, set[str]]:
    """Task name (and alias) -> the option forms of its positional arguments (`--recipe`): accepted
    for compatibility, never shown (docs/cli.md: one convention, RECIPE positional)."""
    out: dict[str, set[str]] = {}
    for ctx in namespace().to_contexts():
        for name in (ctx.name, *ctx.aliases):
            out[name] = {f"--{a.name.replace('_', '-')}" for a in ctx.positional_args}
    return out


def test_every_hint_passes_a_positional_argument_positionally():
    positional = positional_flags()
    assert positional["doctor"] == positional["run"] == {"--recipe"} and positional["run.status"] == {"--run"}
    wrong = [f"{where}: `invoke {task} {opt}`: give it positionally, `invoke {task} {opt[2:].upper()}`"
             for where, task, options in hints() for opt in options if opt in positional.get(task, ())]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("hint", ["invoke render", "invoke run.stop --run-dir X", "invoke doctor --list"])
def test_a_wrong_hint_is_caught(hint):
    known = contexts()
    (m,) = HINT_RE.finditer(hint)
    task, options = m.group(1), [t for t in m.group(2).split() if t.startswith("--")]
    assert task not in known or any(o not in known[task] for o in options)


# --- one remedy per missing fact, the same from every command that reports it ------------------


def hints_in(text: str) -> set[str]:
    return {m.group(0).strip() for m in HINT_RE.finditer(text)}


def reports_of_missing_outside_facts(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """What each command says about a lock without the router wheel's sha256 and the base digest
    (cu13's committed lock, as a fresh clone has it), where neither can be fetched: GitHub and the
    base image's registry are reached only through a proxy whose port is closed (so a host with
    the network fetches nothing either)."""
    from slimeforge.image.builder.build import BuildOptions, prepare
    from slimeforge.image.builder.install import InstallOptions, install
    from slimeforge.image.lock import lockcheck, lockfacts
    from slimeforge.image.lock.lockfile import LockError, stack_ref
    from slimeforge.image.stack import load_stack

    path = fresh_clone_stack(tmp_path)
    lock_text = (tmp_path / "locks" / "pylock.cu13.toml").read_text()
    reports: dict[str, str] = {}

    def report(name, act):
        lines: list[str] = []
        try:
            act(lines.append)
        except LockError as exc:
            lines.append(f"error: {exc}")
        reports[name] = "\n".join(lines)

    report("lock --check", lambda echo: lockcheck.check(str(path), echo=echo))
    report("lock --complete", lambda echo: lockfacts.complete(str(path), echo=echo))
    report("build --dry-run", lambda echo: prepare(BuildOptions(stack=str(path), dry_run=True,
                                                                build_root=tmp_path / "b", echo=echo)))
    report("build", lambda echo: prepare(BuildOptions(stack=str(path), build_root=tmp_path / "b2", echo=echo)))

    def install_dry_run(echo):
        script = install(InstallOptions(stack=str(path), prefix=str(tmp_path / "p"), dry_run=True, use_store=False,
                                        echo=echo))
        echo(script.read_text())  # the rendered plan: its router slice is marked with the same remedy

    report("install --dry-run", install_dry_run)
    report("install", lambda echo: install(InstallOptions(stack=str(path), prefix=str(tmp_path / "p2"),
                                                          use_store=False, echo=echo)))
    assert (tmp_path / "locks" / "pylock.cu13.toml").read_text() == lock_text  # nothing was filled in
    assert not (tmp_path / "p2").exists()  # the real install was refused before anything
    return stack_ref(load_stack(str(path))), reports


def test_each_missing_outside_fact_has_one_remedy_from_every_command(tmp_path, monkeypatch):
    import base64

    from helpers import free_port

    from slimeforge.image.lock.remedies import remedy

    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{free_port()}")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    ref, reports = reports_of_missing_outside_facts(tmp_path)
    # The install script carries the router slice base64-encoded: decoded, it is text like the rest.
    reports["install --dry-run"] += "\n" + "\n".join(
        base64.b64decode(m.group(1)).decode(errors="replace")
        for m in re.finditer(r"<<'SF_SLICE_\d+'\n(.*?)\nSF_SLICE", reports["install --dry-run"], re.S))
    sentences = {fact: remedy(fact, ref) for fact in ("router_sha256", "base_digest")}
    allowed = set().union(*(hints_in(s) for s in sentences.values()))
    assert len(allowed) == 3  # `lock --complete`, with --router-sha256, with --base-digest
    for command, text in reports.items():
        assert sentences["router_sha256"] in text, f"{command} does not name the router wheel's remedy:\n{text}"
        assert sentences["base_digest"] in text, f"{command} does not name the base digest's remedy:\n{text}"
        lock_hints = {h for h in hints_in(text) if h.startswith("invoke lock")}
        assert lock_hints <= allowed, f"{command} gives another hint: {lock_hints - allowed}"
        # Every option a remedy names is one the named task takes (the test above, on the real text).
        known = contexts()
        for hint in hints_in(text):
            task, *words = hint.split()[1:]
            assert all(w.split("=")[0] in known[task] for w in words if w.startswith("--")), hint


def test_a_flavor_without_a_lock_has_one_remedy_from_every_command(tmp_path):
    import subprocess
    import sys

    from slimeforge.image.builder.build import BuildOptions, prepare
    from slimeforge.image.builder.install import InstallOptions, install
    from slimeforge.image.lock import lockcheck
    from slimeforge.image.lock.lockfile import LockError
    from slimeforge.image.lock.remedies import remedy

    assert not (ROOT / "images" / "locks" / "pylock.cu129.toml").exists()  # cu129 has no lock committed
    sentence = remedy("lock", "cu129")
    said = {}
    for command, act in {
        "lock --check": lambda: lockcheck.check("cu129", echo=print),
        "build --dry-run": lambda: prepare(BuildOptions(stack="cu129", dry_run=True, build_root=tmp_path / "b",
                                                        echo=print)),
        "install --dry-run": lambda: install(InstallOptions(stack="cu129", prefix=str(tmp_path / "p"), dry_run=True,
                                                            echo=print)),
    }.items():
        with pytest.raises(LockError) as refused:
            act()
        said[command] = str(refused.value)
    shown = subprocess.run([sys.executable, "-m", "invoke", "stack.show", "--cuda", "cu129"], cwd=ROOT,
                           capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    said["stack.show"] = shown.stdout
    for command, text in said.items():
        assert sentence in text, f"{command}: {text}"
        assert hints_in(text) == {"invoke lock --cuda cu129"}, f"{command}: {hints_in(text)}"
