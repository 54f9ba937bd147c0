"""Run untrusted Python (model-written code) in a separate, limited process.

This is isolation against accidents, not a security boundary. The program runs:

* in a fresh interpreter, ``sys.executable -I`` (no user site, no PYTHON* variables, no
  script directory on ``sys.path``), with stdin closed;
* with its working directory a fresh temporary directory, deleted afterwards;
* with a minimal environment (PATH, LANG, HOME/TMPDIR = that directory) and no proxies;
* under ``resource`` limits on POSIX (address space, CPU seconds, file size, no core dumps);
* with sockets, process spawning/killing and file deletion replaced by functions that raise
  (in the spirit of HumanEval's ``reliability_guard``);
* in its own session, killed as a process group when the wall-clock timeout expires.

It passes when it exits with status 0 after printing a per-run random marker that the launcher
prints only once the program returned normally, so ``sys.exit(0)``/``os._exit(0)`` in model
code, or a crash, never count as a pass.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MEMORY_LIMIT_BYTES = 2 * 1024**3
OUTPUT_LIMIT_BYTES = 8 * 1024**2
TAIL_CHARS = 2000

_LAUNCHER = r"""
import sys
try:
    import resource
except ImportError:
    resource = None
if resource is not None:
    for limit, value in ((resource.RLIMIT_AS, {memory}), (resource.RLIMIT_CPU, {cpu_seconds}),
                         (resource.RLIMIT_FSIZE, {output_bytes}), (resource.RLIMIT_CORE, 0)):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass

def _guard():
    import builtins, os, shutil, socket, subprocess
    def disabled(name):
        def refuse(*args, **kwargs):
            raise PermissionError(name + " is disabled while scoring model code")
        return refuse
    for name in ("socket", "create_connection", "create_server", "socketpair", "fromfd"):
        setattr(socket, name, disabled("socket." + name))
    for name in ("kill", "killpg", "system", "fork", "forkpty", "execv", "execve", "execvp", "execvpe",
                 "spawnv", "spawnve", "popen", "remove", "unlink", "rmdir", "removedirs", "rename",
                 "renames", "replace", "truncate", "chmod", "chown", "putenv", "setuid", "chroot"):
        if hasattr(os, name):
            setattr(os, name, disabled("os." + name))
    shutil.rmtree = disabled("shutil.rmtree")
    shutil.move = disabled("shutil.move")
    subprocess.Popen = disabled("subprocess.Popen")
    builtins.help = disabled("help")

_guard()
del _guard
import runpy
runpy.run_path({program!r}, run_name="__candidate__")
sys.stdout.flush()
sys.stdout.write("\n" + {marker!r} + "\n")
sys.stdout.flush()
"""


@dataclass(frozen=True)
class ExecutionResult:
    """How a sandboxed run ended: ``status`` is "passed", "failed" or "timeout"."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def minimal_env(home: Path) -> dict[str, str]:
    """The whole environment of a sandboxed run: no proxies, credentials or PYTHON* variables."""
    return {
        "PATH": os.defpath,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(home),
        "TMPDIR": str(home),
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
    }


def _tail(path: Path) -> str:
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 4 * TAIL_CHARS))
        return handle.read().decode("utf-8", errors="replace")


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        process.kill()


def run_python(source: str, timeout_s: float = 5.0) -> ExecutionResult:
    """Run ``source`` as a Python program in the sandbox described in the module doc."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    with tempfile.TemporaryDirectory(prefix="specledger-quality-") as directory:
        workdir = Path(directory).resolve()
        program, launcher = workdir / "program.py", workdir / "launcher.py"
        stdout_path, stderr_path = workdir / "stdout.txt", workdir / "stderr.txt"
        program.write_text(source, encoding="utf-8")
        marker = f"specledger-pass-{secrets.token_hex(16)}"
        launcher.write_text(
            _LAUNCHER.format(
                memory=MEMORY_LIMIT_BYTES,
                cpu_seconds=int(timeout_s) + 2,
                output_bytes=OUTPUT_LIMIT_BYTES,
                program=str(program),
                marker=marker,
            ),
            encoding="utf-8",
        )
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-I", str(launcher)],
                cwd=workdir,
                env=minimal_env(workdir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=os.name == "posix",
            )
            try:
                returncode: int | None = process.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(process)
                process.wait()
                returncode, timed_out = None, True
        stdout, stderr = _tail(stdout_path), _tail(stderr_path)
    if timed_out:
        status = "timeout"
    elif returncode == 0 and stdout.rstrip().endswith(marker):
        status = "passed"
    else:
        status = "failed"
    return ExecutionResult(status, returncode, stdout[-TAIL_CHARS:], stderr[-TAIL_CHARS:])
