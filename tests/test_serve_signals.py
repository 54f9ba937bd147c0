"""Shutdown of ``specledger serve`` with streams in flight, Ctrl-C on every verb, start-up failures.

Issue 46: SIGTERM stops admitting, lets streams run to the grace deadline, then ends each with an error event
(``server shutting down``) and ``[DONE]``; a second signal ends them at once, still properly; Ctrl-C exits 130
with the verb's own line; ``serve`` on a port in use is one ``error:`` line and exit 2. Deadlines here are
generous bounds, never speed assertions.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from specledger.cli import main
from specledger.cli.interrupt import interrupt_line, note_resume
from specledger.serve.drain import SHUTDOWN_MESSAGE, SHUTTING_DOWN, Drain
from specledger.serve.hardening import host_name
from specledger.serve.runner import ServerThread, bind_socket
from tests.draining_server import slow_app, stream_body

ROOT = Path(__file__).resolve().parents[1]
STREAMS = 8


class StreamReader(threading.Thread):
    """One streamed completion read to its end; ``events`` are the data payloads, ``started`` set at the first."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.events, self.started, self.error = url, [], threading.Event(), None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=60) as client, \
                    client.stream("POST", self.url + "/v1/completions", json=stream_body()) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.started.set()
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.started.set()

    def ended_properly(self) -> bool:
        """A finish_reason or the shutdown error event, then ``[DONE]`` last."""
        if not self.events or self.events[-1] != "[DONE]":
            return False
        bodies = [json.loads(e) for e in self.events[:-1]]
        finished = any((b.get("choices") or [{}])[0].get("finish_reason") for b in bodies)
        told = any(SHUTDOWN_MESSAGE in str((b.get("error") or {}).get("message", "")) for b in bodies)
        return finished or told


def start_streams(url: str) -> list[StreamReader]:
    readers = [StreamReader(url) for _ in range(STREAMS)]
    for r in readers:
        r.start()
    for r in readers:
        assert r.started.wait(60), "a stream never started"
    return readers


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_ends_every_stream_with_done(signals: int) -> None:
    """One signal: the streams run to the grace (1 s), then end with the error event and [DONE]; two signals
    (grace 60 s): they end at once, just as properly. The server thread stops by itself either way."""
    app = slow_app(grace_s=1.0 if signals == 1 else 60.0, step_s=0.05)
    with ServerThread(app) as server:
        readers = start_streams(server.url)
        t0 = time.monotonic()
        for _ in range(signals):
            server.signal_exit()
        assert server.join(30), "the server did not stop"
        elapsed = time.monotonic() - t0
        for r in readers:
            r.join(10)
    assert elapsed < 30
    assert all(not r.is_alive() for r in readers)
    assert [r.ended_properly() for r in readers] == [True] * STREAMS, [r.events[-3:] for r in readers]
    told = sum(any(SHUTDOWN_MESSAGE in e for e in r.events) for r in readers)
    assert told >= 1  # 200 tokens at 50 ms a step cannot all have finished within the grace


def test_sigterm_to_a_serving_process_exits_and_closes_streams() -> None:
    """A real SIGTERM to a process serving 8 streams (grace 2 s): it exits within 10 s (generous: 20 s)
    and every stream ends with a finish_reason or the error event, then [DONE]."""
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.draining_server", str(port), "2", "0.05"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):  # bounded: the socket is bound before "ready", uvicorn starts just after
            try:
                httpx.get(url + "/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        readers = start_streams(url)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        elapsed = time.monotonic() - t0
        for r in readers:
            r.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert elapsed < 20
    assert proc.returncode in (-signal.SIGTERM, 0, 143)
    assert [r.ended_properly() for r in readers] == [True] * STREAMS


def test_drain_tells_each_job_once_and_late_ones_at_once() -> None:
    import asyncio

    class J:
        def __init__(self) -> None:
            self.events: asyncio.Queue = asyncio.Queue()

    async def scenario() -> tuple[int, int, int]:
        drain = Drain(grace_s=30)
        early, gone, late = J(), J(), J()
        drain.track(early)
        drain.track(gone)
        drain.untrack(gone)
        drain.begin()
        assert drain.draining and not drain.expired
        drain.hurry()
        await asyncio.sleep(0.05)
        drain.expire()  # idempotent
        drain.track(late)
        return early.events.qsize(), gone.events.qsize(), late.events.qsize()

    assert asyncio.run(scenario()) == (1, 0, 1)
    assert repr(SHUTTING_DOWN) == "SHUTTING_DOWN"


# --- Host header -------------------------------------------------------------------------------


@pytest.mark.parametrize("value, name", [
    ("[::1]:8000", "::1"), ("[::1]", "::1"), ("LocalHost.:80", "localhost"), ("127.0.0.1", "127.0.0.1"),
    ("[::1]evil.example", "[::1]evil.example"), ("localhost:x.evil", "localhost:x.evil"), ("[::1", "[::1"),
])
def test_host_name_cuts_only_a_numeric_port(value: str, name: str) -> None:
    assert host_name(value) == name


def raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_parser_refusals_are_openai_json() -> None:
    """Requests h11 refuses (Content-Length -1, two Host headers, a header block past the limit) and a
    bracketed Host with a tail answer OpenAI-style JSON: 400, 400, 431 and 421."""
    app = slow_app(grace_s=0.5, step_s=0.0)
    with ServerThread(app) as server:
        bad_length = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                                               b"Content-Type: application/json\r\nContent-Length: -1\r\n\r\n")
        two_hosts = raw_exchange(server.port, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nHost: evil\r\n\r\n")
        evil_host = raw_exchange(server.port, b"GET /v1/models HTTP/1.1\r\nHost: [::1]evil.example\r\n"
                                              b"Connection: close\r\n\r\n")
        huge = raw_exchange(server.port, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n"  # never ends
                                         + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 100) for i in range(400)))
    for answer, status in ((bad_length, b"400"), (two_hosts, b"400"), (evil_host, b"421"), (huge, b"431")):
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == status, head
        assert b"application/json" in head.lower()
        assert json.loads(body)["error"]["message"]


# --- start-up failures and Ctrl-C --------------------------------------------------------------


def test_serve_on_a_port_in_use_is_one_error_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exc:
            main(["serve", "--port", str(port)])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # no banner, no model loaded
    assert err.count("\n") == 1 and err.startswith("error: cannot listen on 127.0.0.1:")


def test_bind_socket_refuses_an_unknown_host() -> None:
    from specledger.errors import SpecLedgerError

    with pytest.raises(SpecLedgerError, match="cannot listen on"):
        bind_socket("no-such-host.invalid", 8000)


def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("argv, patch, expect", [
    (["run", "--out", "runs/x"], "specledger.cli.run.run_main_job", "continue with: specledger run --resume runs/x"),
    (["probe", "http://127.0.0.1:9"], "specledger.cli.probe._probe", "nothing was kept"),
    (["serve", "--port", "0"], "specledger.serve.options.build_app", "the server stopped"),
    (["sweep", "--out", "runs/s"], "specledger.cli.sweep.run_sweep", "kept in runs/s"),
])
def test_ctrl_c_exits_130_with_the_verbs_line(argv, patch, expect, monkeypatch, capsys) -> None:
    monkeypatch.setattr(patch, _interrupt)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("interrupted; ") and expect in err[-1]


def test_interrupt_line_prefers_the_noted_resume_command() -> None:
    note_resume("specledger run --resume runs/20261207-0300")
    try:
        assert interrupt_line(["run", "--budget", "3m"]).endswith("specledger run --resume runs/20261207-0300")
    finally:
        from specledger.cli.interrupt import clear_resume

        clear_resume()
    assert "<that folder>" in interrupt_line(["run"])
    assert "same command" in interrupt_line(["probe", "--launch", "x {port}", "--out", "o"])


def test_a_verbs_exit_code_is_the_process_exit_code(monkeypatch) -> None:
    import typer

    def exits(*_args, **_kwargs):
        raise typer.Exit(3)

    monkeypatch.setattr("specledger.cli.probe._probe", exits)
    with pytest.raises(SystemExit) as exc:
        main(["probe", "http://127.0.0.1:9"])
    assert exc.value.code == 3
