"""Graceful shutdown of ``specledger serve``: stop admitting, let requests run to a deadline, then end them.

The life of a shutdown (:class:`Drain`, driven by :class:`specledger.serve.runner.DrainingServer`):

1. the first SIGTERM / SIGINT: uvicorn closes its listening sockets (new connections are refused) and
   :meth:`Drain.begin` runs on the event loop: new requests on open connections get 503, and a timer is
   armed for ``grace_s`` seconds;
2. requests in flight run on; each one that ends by itself ends as usual (finish_reason, ``[DONE]``);
3. at the deadline, or at once on a second signal (:meth:`Drain.hurry`), :meth:`Drain.expire` hands every
   request still tracked the :data:`SHUTTING_DOWN` event: a stream sends an OpenAI-style error event
   (``server shutting down``) and ``data: [DONE]``, a non-streamed request answers 503; each is then
   released (its batch slot freed at the next step).

Invariant: after :meth:`Drain.expire` every tracked request has been told, exactly once, and every request
tracked later is told at once; nothing here blocks the event loop or the signal handler.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: seconds requests in flight may run after the first signal (``specledger serve --shutdown-grace``)
DEFAULT_SHUTDOWN_GRACE_S = 6.0
#: seconds after the grace that uvicorn waits for connections whose client reads nothing, then cancels them
SHUTDOWN_BACKSTOP_S = 2.0
SHUTDOWN_MESSAGE = "server shutting down"


class _ShuttingDown:
    """Put on a request's event queue when the shutdown deadline passes."""

    def __repr__(self) -> str:
        return "SHUTTING_DOWN"


SHUTTING_DOWN = _ShuttingDown()


class Drain:
    """The shutdown state of one app: ``draining`` (stop admitting) and ``expired`` (end what runs)."""

    def __init__(self, grace_s: float = DEFAULT_SHUTDOWN_GRACE_S) -> None:
        if not grace_s >= 0:
            raise ValueError(f"the shutdown grace must be >= 0 seconds, got {grace_s!r}")
        self.grace_s = float(grace_s)
        self.draining = False
        self.expired = False
        self._hurry = False
        self._jobs: dict[int, Any] = {}  # id -> job (jobs are dataclasses: not hashable)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def track(self, job: Any) -> None:
        """``job`` (anything with an asyncio ``events`` queue) is in flight; told at once if already expired."""
        if self.expired:
            job.events.put_nowait(SHUTTING_DOWN)
        else:
            self._jobs[id(job)] = job

    def untrack(self, job: Any) -> None:
        self._jobs.pop(id(job), None)

    def begin(self) -> None:
        """On the event loop: stop admitting and arm the deadline (idempotent)."""
        if self.draining:
            return
        self.draining = True
        self._loop = asyncio.get_running_loop()
        if self._hurry or self.grace_s == 0:
            self.expire()
        else:
            self._timer = self._loop.call_later(self.grace_s, self.expire)

    def expire(self) -> None:
        """On the event loop: tell every request in flight that the server is shutting down (idempotent)."""
        self.draining = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.expired:
            return
        self.expired = True
        jobs, self._jobs = list(self._jobs.values()), {}
        for job in jobs:
            job.events.put_nowait(SHUTTING_DOWN)

    def hurry(self) -> None:
        """From a signal handler or another thread: end everything now (once :meth:`begin` has run, or as it runs)."""
        self._hurry = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.expire)

    @property
    def in_flight(self) -> int:
        return len(self._jobs)
