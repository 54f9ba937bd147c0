"""Run the app with uvicorn: :func:`serve_app` in the foreground (``specledger serve``), or
:class:`ServerThread` on a background thread (loopback, free port) -- for tests and for commands that
probe our own server in-process. Both use :class:`DrainingServer`: a signal ends streams properly
(:mod:`specledger.serve.drain`)."""

from __future__ import annotations

import errno
import socket
import threading
import time
from types import FrameType
from typing import Any

import uvicorn

from specledger.errors import SpecLedgerError
from specledger.serve.drain import Drain
from specledger.serve.hardening import Limits, uvicorn_config


class DrainingServer(uvicorn.Server):
    """uvicorn's Server with the app's :class:`~specledger.serve.drain.Drain`: the first SIGTERM / SIGINT stops
    admitting and lets requests in flight run to the grace deadline; the second ends them at once (each stream
    still gets its error event and ``[DONE]``); a third gives up waiting (uvicorn's force exit)."""

    def __init__(self, config: uvicorn.Config, drain: Drain | None) -> None:
        super().__init__(config)
        self.drain = drain
        self.signals_seen = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Runs in the signal handler (or any thread): flags only, never a blocking call."""
        self._captured_signals.append(sig)  # re-raised once the server is down, as uvicorn does
        self.signals_seen += 1
        if self.signals_seen >= 2 and self.drain is not None:
            self.drain.hurry()
        if self.signals_seen >= 3 or (self.signals_seen >= 2 and self.drain is None):
            self.force_exit = True
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.drain is not None:
            self.drain.begin()  # on the loop: 503 for new requests, the deadline armed
        await super().shutdown(sockets)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket bound to ``host``:``port`` (SO_REUSEADDR, as uvicorn binds), or a one-line
    :class:`SpecLedgerError` (exit 2) saying why not -- before any model loads or banner prints."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError, OverflowError) as exc:
        raise SpecLedgerError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}; "
                              "give --host an address of this machine") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        hint = {errno.EADDRINUSE: "another process listens there; stop it or pick another --port",
                errno.EACCES: "ports below 1024 need privileges; pick --port 1024 or above",
                errno.EADDRNOTAVAIL: "that address is not one of this machine's; check --host"}
        raise SpecLedgerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                              f"{hint.get(exc.errno, 'pick another --host / --port')}") from None
    sock.set_inheritable(True)
    return sock


def serve_app(app: Any, sock: socket.socket, limits: Limits | None = None) -> None:
    """Serve ``app`` on the bound ``sock`` in the foreground until a signal ends it (see
    :class:`DrainingServer`); a start-up failure is a one-line :class:`SpecLedgerError`, never uvicorn's
    ``sys.exit``."""
    limits = limits or getattr(getattr(app, "state", None), "limits", None)
    server = DrainingServer(uvicorn_config(app, limits=limits), getattr(app.state, "drain", None))
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:
        if server.started:
            raise
        raise SpecLedgerError(f"the server did not start (uvicorn exit {exc.code}); see the log line above") \
            from None
    finally:
        sock.close()
    if not server.started and not server.should_exit:
        raise SpecLedgerError("the server did not start; see the log line above")


class ServerThread:
    """``with ServerThread(app) as s: ... s.url`` -- uvicorn on ``host``:<free port>, lifespan off,
    with the same transport limits as ``specledger serve`` (the app's ``state.limits`` if it has them).

    On exit uvicorn stops and, if the app has a serve worker, so does the worker.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", limits: Limits | None = None) -> None:
        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        limits = limits or getattr(getattr(app, "state", None), "limits", None)
        self._server = DrainingServer(uvicorn_config(app, limits=limits, lifespan="off"),
                                      getattr(getattr(app, "state", None), "drain", None))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the server thread did not start")
            time.sleep(0.01)
        return self

    def signal_exit(self) -> None:
        """What SIGTERM does to ``specledger serve`` (call twice for a second signal)."""
        import signal

        self._server.handle_exit(signal.SIGTERM, None)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the server to stop by itself; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def __exit__(self, *exc: object) -> None:
        service = getattr(getattr(self.app, "state", None), "service", None)
        if service is not None:
            service.worker.stop()
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()
