"""The engine worker: one thread decodes queued requests one at a time.

Invariants:
- Only the worker thread touches the engine and the drafter (one drafter per server, so the
  suffix drafter learns across requests).
- A request is in exactly one place: waiting in the bounded :class:`JobQueue`, running on the
  worker, or done. ``waiting == len(queue)`` and ``running in {0, 1}`` at every instant, so the
  gauges cannot leak: a cancelled waiting request leaves the queue at once, a cancelled running
  one stops at the next round boundary (between the engine's events, after a completed round).
- Events travel to the request's asyncio queue with ``loop.call_soon_threadsafe``; the last
  event of every job that started is a :class:`~specledger.engine.trace.RequestRecord`,
  :class:`JobFailed` or :class:`JobCancelled`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specledger.engine.decode import Emitted
from specledger.engine.policy import GammaPolicy
from specledger.engine.sampling import SamplingParams
from specledger.engine.trace import RequestRecord, RoundRecord
from specledger.serve.metrics import ServeMetrics
from specledger.serve.protocol import FINISH_REASONS


@dataclass(slots=True)
class JobFailed:
    message: str


@dataclass(slots=True)
class JobCancelled:
    pass


@dataclass
class Job:
    """One admitted request; ``arrival`` is ``time.perf_counter()`` when it was admitted."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    stop: list[str]
    ignore_eos: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrival: float = field(default_factory=time.perf_counter)
    cancel_flag: threading.Event = field(default_factory=threading.Event)

    def push(self, event: Any) -> bool:
        """Hand ``event`` to the request's event loop; False if that loop is gone."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
            return True
        except RuntimeError:  # loop closed: nobody is listening any more
            self.cancel_flag.set()
            return False


class JobQueue:
    """A bounded FIFO of waiting jobs that also supports removing a job (client gone)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, job: Job) -> bool:
        """Enqueue unless full (or closed); True if admitted."""
        with self._cond:
            if self._closed or len(self._items) >= self.maxsize:
                return False
            self._items.append(job)
            self._cond.notify()
            return True

    def take(self) -> Job | None:
        """Block for the next job; None once closed."""
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            return None if self._closed else self._items.popleft()

    def remove(self, job: Job) -> bool:
        """Drop ``job`` if it is still waiting; True if it was."""
        with self._cond:
            try:
                self._items.remove(job)
                return True
            except ValueError:
                return False

    def close(self) -> list[Job]:
        """Stop handing out jobs; return those still waiting."""
        with self._cond:
            self._closed = True
            left = list(self._items)
            self._items.clear()
            self._cond.notify_all()
            return left


GammaSpec = Callable[[], "int | GammaPolicy"]


class EngineWorker:
    """Runs ``engine.stream`` for each job on one daemon thread, updating metrics and records.

    ``records``: RequestRecords of finished requests (newest ``keep_records``);
    ``aborted_rounds``: rounds run by requests cancelled before they finished.
    """

    def __init__(
        self,
        engine: Any,
        drafter: Any,
        gamma: GammaSpec,
        queue: JobQueue,
        metrics: ServeMetrics,
        keep_records: int = 10000,
    ) -> None:
        self.engine, self.drafter, self.gamma, self.queue, self.metrics = engine, drafter, gamma, queue, metrics
        self.records: deque[RequestRecord] = deque(maxlen=keep_records)
        self.aborted_rounds: deque[RoundRecord] = deque(maxlen=keep_records * 8)
        self.running: Job | None = None
        self._thread = threading.Thread(target=self._loop, name="specledger-engine", daemon=True)

    @property
    def num_running(self) -> int:
        return 0 if self.running is None else 1

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Close the queue (waiting jobs get JobCancelled), cancel the running job, join."""
        for job in self.queue.close():
            job.push(JobCancelled())
        job = self.running
        if job is not None:
            job.cancel_flag.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            job = self.queue.take()
            if job is None:
                return
            if job.cancel_flag.is_set():
                job.push(JobCancelled())
                continue
            self.running = job
            try:
                final = self._decode(job)
            except Exception as exc:  # an engine failure ends this request, never the server
                final = JobFailed(f"engine error: {type(exc).__name__}: {exc}")
            finally:
                self.running = None  # before the client hears of the end, so the gauge is never stale
            job.push(final)

    def _decode(self, job: Job) -> RequestRecord | JobCancelled:
        """Decode ``job``, pushing its chunks; return its final event (not yet pushed)."""
        perf = time.perf_counter
        start = perf()
        self.metrics.observe_start(len(job.prompt_ids), start - job.arrival)
        stream = self.engine.stream(
            job.prompt_ids, drafter=self.drafter, gamma=self.gamma(), params=job.params,
            max_tokens=job.max_tokens, stop=job.stop, request_id=job.request_id, ignore_eos=job.ignore_eos,
        )
        rounds: list[RoundRecord] = []
        last_chunk: float | None = None
        final: RequestRecord | JobCancelled = JobCancelled()
        try:
            for event in stream:
                now = perf()
                if isinstance(event, Emitted):
                    gap = None if last_chunk is None else now - last_chunk
                    self.metrics.observe_chunk(len(event.token_ids), now - job.arrival, gap)
                    last_chunk = now
                    job.push(event)
                elif isinstance(event, RoundRecord):
                    self.metrics.observe_round(event)
                    rounds.append(event)
                    if job.cancel_flag.is_set():  # a round just completed: the cheapest place to stop
                        break
                elif isinstance(event, RequestRecord):
                    reason = FINISH_REASONS.get(event.stop_reason, "stop")
                    self.metrics.observe_finish(reason, (last_chunk or now) - job.arrival)
                    self.records.append(event)
                    final = event
                    break
        finally:
            stream.close()
            if not isinstance(final, RequestRecord):
                self.aborted_rounds.extend(rounds)
        return final
