"""Which code produced a run's files: the specledger version, the git commit of its checkout, Python, torch.

Written into ``run.json`` (when the run starts) and ``summary.json`` (when the report is built) under
``provenance``, so that two runs' figures can be told apart by the code that made them. Nothing here
imports torch: its version is read from the installed distribution's metadata.
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import specledger

#: the package folder; a checkout is the git work tree whose top level holds it directly
PACKAGE_DIR = Path(specledger.__file__).resolve().parent
_GIT_TIMEOUT_S = 5.0


def _git(args: list[str], cwd: Path) -> str | None:
    """``git ARGS`` in ``cwd``: its stdout stripped, or None when git is missing, fails or hangs."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=_GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(package_dir: Path = PACKAGE_DIR) -> tuple[str | None, bool | None]:
    """(HEAD's commit, dirty) of the checkout ``package_dir`` lives in, or (None, None) when it is not one.

    A checkout: ``git rev-parse --show-toplevel`` run in ``package_dir`` names its parent folder (an
    installed copy in ``site-packages`` is not a checkout, even inside some other repository). Dirty: ``git
    status --porcelain`` lists anything (modified, staged or untracked files that ``.gitignore`` does not
    hide), so the commit alone does not say what ran."""
    top = _git(["rev-parse", "--show-toplevel"], package_dir)
    if top is None or Path(top).resolve() != package_dir.resolve().parent:
        return None, None
    commit = _git(["rev-parse", "HEAD"], package_dir)
    if not commit:
        return None, None
    status = _git(["status", "--porcelain"], package_dir)
    return commit, (bool(status) if status is not None else None)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def provenance(package_dir: Path = PACKAGE_DIR) -> dict[str, Any]:
    """``{"specledger_version", "git_commit", "git_dirty", "python", "torch"}``: ``specledger.__version__``;
    the checkout's HEAD and whether its work tree differs from it (both None when the package is not a
    git checkout, :func:`git_state`); ``platform.python_version()``; torch's installed version (None when
    torch is not installed; torch is never imported)."""
    commit, dirty = git_state(package_dir)
    return {
        "specledger_version": specledger.__version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "torch": _version("torch"),
    }


__all__ = ["PACKAGE_DIR", "git_state", "provenance"]
