"""Write a directory of files so that it is either complete or absent (never half written)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def write_dir(target: Path, files: dict[str, str | bytes], modes: dict[str, int] | None = None, last: str | None = None) -> None:
    """Create `target` with `files`, or replace those files in an existing `target`.

    A new directory is assembled beside the target and renamed into place in one step. In an
    existing directory (a run directory keeps job.log and state across launches) each file is
    replaced atomically, `last` (the file that marks completeness) after all the others.
    """
    modes = modes or {}
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            for name, content in files.items():
                _write(tmp / name, content, modes.get(name))
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return
    order = [n for n in files if n != last] + ([last] if last in files else [])
    for name in order:
        path = target / name
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", dir=target)
        os.close(fd)
        try:
            _write(Path(tmp_name), files[name], modes.get(name))
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise


def _write(path: Path, content: str | bytes, mode: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    if mode is not None:
        os.chmod(path, mode)
