"""One launched engine process: a free port, the process group started with its log, ``GET /health`` awaited,
SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from specledger.errors import SpecLedgerError

HOST = "127.0.0.1"


def port_taken(port: int, host: str = HOST) -> bool:
    """True when something accepts connections on ``host:port`` or the port cannot be bound."""
    with socket.socket() as probe:
        probe.settimeout(0.5)
        if probe.connect_ex((host, port)) == 0:
            return True
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EngineServer:
    """One engine process (its own process group, output to ``log_path``) serving on ``HOST:port``."""

    def __init__(self, name: str, argv: Sequence[str], port: int, log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        """``env``: the process's environment (default: this one's)."""
        self.name, self.argv, self.port, self.log_path = name, list(argv), port, Path(log_path)
        self.env = env
        self.url = f"http://{HOST}:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if port_taken(self.port):
            raise SpecLedgerError(f"port {self.port} is already taken on {HOST} (another server would answer the "
                                  "probe; the engine was not started, so it has no log); pass another --launch-port, "
                                  "or leave it out to pick a free one")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(f"$ {shlex.join(self.argv)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True, env=self.env)
            except OSError as exc:
                raise SpecLedgerError(f"cannot start the engine of spec {self.name!r} ({exc.strerror or exc}: "
                                      f"{self.argv[0]}); check the --launch command (log: {self.log_path})") from None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def died(self, when: str) -> SpecLedgerError:
        return SpecLedgerError(f"the engine of spec {self.name!r} exited with code {self.exit_code()} {when}; "
                               f"its log: {self.log_path}")

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ``GET /health`` answered 200 with the process alive; a one-line error otherwise."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.exit_code() is not None:
                raise self.died("before it was ready")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200 and self.exit_code() is None:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SpecLedgerError(f"the engine of spec {self.name!r} did not answer {self.url}/health within "
                              f"{timeout_s:.0f} s; its log: {self.log_path} (raise --launch-timeout?)")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue
