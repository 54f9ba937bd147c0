"""Run an ASGI app with uvicorn on a background thread (loopback, free port) -- for tests and
for commands that probe our own server in-process."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from specledger.serve.hardening import Limits, uvicorn_config


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
        self._server = uvicorn.Server(uvicorn_config(app, limits=limits, lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the server thread did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        service = getattr(getattr(self.app, "state", None), "service", None)
        if service is not None:
            service.worker.stop()
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()
