"""The engine worker: one thread decodes queued requests together (continuous batching).

Invariants:
- Only the worker thread touches the batch engine, its scheduler and the drafters. Each job
  gets its own drafter, forked from the server's (``Drafter.fork``: shared weights and
  cross-request state -- the suffix drafter's global trie learns from every finished request
  -- and per-request state of its own), and its own gamma policy.
- A request is in exactly one place: waiting in the bounded :class:`JobQueue`, in the batch
  (``active``: added to the scheduler, at most ``max_batch``), or done. ``waiting ==
  len(queue)`` and ``running == len(active)`` at every instant, so the gauges cannot leak.
  A job leaves the queue only when the batch has a free place; a cancelled waiting request
  leaves the queue at once, a cancelled one in the batch is dropped at the next step
  boundary (its slot is free for the next step).
- Events travel to the request's asyncio queue with ``loop.call_soon_threadsafe``; every job
  that left the queue ends with exactly one :class:`~specledger.records.RequestRecord`,
  :class:`JobFailed` or :class:`JobCancelled`, pushed after it left ``active``.
- Failure isolation: when one request's drafting / verify / sampling / prefill raises, the
  scheduler ends that request alone with ``RequestFailed`` (its last event, its slot freed) and
  the worker answers it with :class:`JobFailed` -- a 500 that names no internal detail (the
  detail goes to the log); the others decode on. Only an exception outside any one request
  (the packed forward itself) fails the whole batch (the scheduler is rebuilt empty); the server
  keeps serving either way.
- Admission: the server holds at most ``max_queue + max_batch`` requests (waiting + running +
  being encoded); :meth:`JobQueue.offer` counts the jobs the worker has taken and not yet ended,
  so a burst is admitted up to queue + batch (the free batch places fill at the next step
  boundary), not queue + 1. A request reserves its place (:meth:`JobQueue.reserve`) before its
  prompt is tokenized, so a request refused with 429 costs no tokenizing, and at most queue +
  batch prompts are being tokenized at once.
- Liveness: the engine thread never dies silently. A failure while failing the batch (rebuilding
  the scheduler) or any exception outside the per-step handler marks the worker dead
  (:attr:`EngineWorker.error`, logged), fails every job it holds and closes the queue (waiting jobs
  get :class:`JobCancelled`); ``/health`` then answers 503 and new requests 503.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specledger.engine.batch import BatchEngine, BatchRequest, BatchScheduler, RequestFailed
from specledger.engine.decode import Emitted
from specledger.engine.drafters.base import Drafter
from specledger.engine.policy import GammaPolicy
from specledger.engine.protocol import TargetEngine
from specledger.engine.sampling import SamplingParams
from specledger.records import RequestRecord, RoundRecord
from specledger.serve.metrics import ServeMetrics
from specledger.serve.protocol import FINISH_REASONS

log = logging.getLogger("specledger.serve")

#: what a client hears when the engine failed on its request (details stay in the server log)
INTERNAL_FAILURE = "the server failed while generating this request; other requests were not affected"


@dataclass(slots=True)
class JobFailed:
    message: str = INTERNAL_FAILURE


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
    """A bounded FIFO of waiting jobs that also supports removing a job (client gone).

    Capacity: at most ``maxsize + batch`` jobs held (waiting + taken by the worker and not yet
    :meth:`done`), so the batch's free places count as room for a burst.
    """

    def __init__(self, maxsize: int, batch: int = 0) -> None:
        self.maxsize, self.batch = maxsize, batch
        self._items: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._taken = 0
        self._reserved = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def taken(self) -> int:
        """Jobs the worker took and has not reported :meth:`done`."""
        return self._taken

    @property
    def reserved(self) -> int:
        """Places reserved by requests still being encoded (:meth:`reserve`)."""
        return self._reserved

    def _full(self) -> bool:
        return len(self._items) + self._taken + self._reserved >= self.maxsize + self.batch

    def offer(self, job: Job, reserved: bool = False) -> bool:
        """Enqueue unless closed or full (waiting + taken + reserved >= maxsize + batch); True if
        admitted. ``reserved``: the caller holds a place from :meth:`reserve`, which this consumes
        (admitted or not)."""
        with self._cond:
            if reserved:
                self._reserved = max(0, self._reserved - 1)
            if self._closed or self._full():
                return False
            self._items.append(job)
            self._cond.notify()
            return True

    def reserve(self) -> bool:
        """Hold one place for a request about to be encoded; False if closed or full. The caller
        then calls :meth:`offer` with ``reserved=True`` or :meth:`unreserve`, exactly once."""
        with self._cond:
            if self._closed or self._full():
                return False
            self._reserved += 1
            return True

    def unreserve(self) -> None:
        """Give back a place from :meth:`reserve` (the request was refused after all)."""
        with self._cond:
            self._reserved = max(0, self._reserved - 1)

    def take(self, block: bool = True) -> Job | None:
        """The next job, waiting for one if ``block``; None once closed (or, not blocking, if empty).
        The caller owns the job until it calls :meth:`done`."""
        with self._cond:
            while block and not self._items and not self._closed:
                self._cond.wait()
            if self._closed or not self._items:
                return None
            self._taken += 1
            return self._items.popleft()

    def done(self) -> None:
        """A taken job ended (finished, failed or cancelled): its place is free."""
        with self._cond:
            self._taken = max(0, self._taken - 1)

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

#: slot positions allocated up front; the batch cache grows (doubling) when a request needs more
INITIAL_SLOT_POSITIONS = 512


@dataclass
class _InBatch:
    """A job in the batch: what the worker keeps beside the scheduler's state."""

    job: Job
    rounds: list[RoundRecord] = field(default_factory=list)
    last_chunk: float | None = None


class EngineWorker:
    """Decodes the queued jobs on one daemon thread with continuous batching (at most
    ``max_batch`` at once), updating metrics and records.

    ``engine``: the solo :class:`~specledger.engine.decode.Engine` (model, tokenizer, EOS,
    context); the worker builds a :class:`~specledger.engine.batch.BatchEngine` over its model
    with ``max_batch`` slots of its full context. ``drafter``: the server's drafter, forked per job.
    ``records``: RequestRecords of finished requests (newest ``keep_records``; 0, the default,
    keeps none: a record holds the request's rounds, chunks and text, ~0.8 MB at 4k tokens);
    ``aborted_rounds``: rounds run by requests cancelled or failed before they finished (newest
    ``8 * keep_records``). ``error``: None while the engine thread serves; the exception that
    stopped it otherwise.
    """

    def __init__(
        self,
        engine: TargetEngine,
        drafter: Drafter,
        gamma: GammaSpec,
        queue: JobQueue,
        metrics: ServeMetrics,
        max_batch: int = 8,
        keep_records: int = 0,
    ) -> None:
        self.drafter, self.gamma, self.queue, self.metrics = drafter, gamma, queue, metrics
        self.tree_budget = 0  # token-tree nodes per round (0: chains), set by the service
        self.max_batch = max_batch
        self.batch = BatchEngine(
            engine.model, engine.tokenizer, engine.eos_token_ids, max_batch=max_batch,
            capacity=engine.max_context, name=engine.name, dtype=engine.dtype,
            initial_capacity=min(engine.max_context, INITIAL_SLOT_POSITIONS), keep_steps=keep_records,
        )
        self.scheduler: BatchScheduler = self.batch.scheduler(stream_text=True)
        self.active: dict[int, _InBatch] = {}  # scheduler ticket -> job
        self.records: deque[RequestRecord] = deque(maxlen=keep_records)
        self.aborted_rounds: deque[RoundRecord] = deque(maxlen=keep_records * 8)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="specledger-engine", daemon=True)

    @property
    def num_running(self) -> int:
        return len(self.active)

    @property
    def alive(self) -> bool:
        """True while the engine thread runs and has not failed (what ``/health`` reports)."""
        return self.error is None and self._thread.is_alive() and not self.queue.closed

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Close the queue (waiting jobs get JobCancelled); the worker then cancels the jobs in the
        batch at the next step boundary and exits. Joins the thread."""
        for job in self.queue.close():
            job.push(JobCancelled())
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        """The thread's body: the loop, and if anything escapes it, a loud death (see :meth:`_die`)."""
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 -- whatever it is, the server must stop admitting
            self._die(exc)

    def _loop(self) -> None:
        while True:
            try:
                self._drop_cancelled()  # first, so a freed slot takes a waiting job at once
                if not self._fill():
                    break
                if self.active:
                    self._step()
            except Exception:  # a failure outside any one request ends the batch's requests, never the server
                log.exception("engine step failed; failing the %d request(s) in the batch", len(self.active))
                self._fail_all()  # if this raises too, _run marks the worker dead
        for ticket in list(self.active):  # shutting down
            self.scheduler.cancel(ticket)
            self._end(ticket, JobCancelled())

    def _die(self, exc: BaseException) -> None:
        """The engine cannot go on: log it, stop admitting (the queue closes; waiting jobs are
        cancelled) and fail every job in the batch, so no client waits forever."""
        self.error = exc
        log.critical("the engine thread stopped; the server answers 503 from now on", exc_info=exc)
        for job in self.queue.close():
            job.push(JobCancelled())
        for entry in list(self.active.values()):
            self.queue.done()
            self.metrics.observe_failure()
            entry.job.push(JobFailed())
        self.active.clear()

    def _fill(self) -> bool:
        """Take jobs while the batch has room (waiting for one only when the batch is empty);
        False once the queue is closed."""
        while len(self.active) < self.max_batch:
            job = self.queue.take(block=not self.active)
            if job is None:
                break
            if job.cancel_flag.is_set():
                self.queue.done()
                job.push(JobCancelled())
                continue
            self._start(job)
        return not self.queue.closed

    def _start(self, job: Job) -> None:
        now = time.perf_counter()
        room = self.batch.capacity - len(job.prompt_ids) - job.max_tokens
        request = BatchRequest(job.prompt_ids, job.max_tokens, job.params, job.request_id, stop=job.stop,
                               ignore_eos=job.ignore_eos, tree_budget=max(0, min(self.tree_budget, room)))
        try:
            ticket = self.scheduler.add(request, self.drafter.fork(), self.gamma(), t_arrival=now)
        except Exception:
            log.exception("request %s could not join the batch", job.request_id)
            self.queue.done()
            self.metrics.observe_failure()
            job.push(JobFailed())
            return
        self.active[ticket] = _InBatch(job)
        self.metrics.observe_start(len(job.prompt_ids), now - job.arrival)

    def _drop_cancelled(self) -> None:
        """Step boundary: drop the jobs whose client is gone (their slots free for the next step)."""
        for ticket, entry in list(self.active.items()):
            if entry.job.cancel_flag.is_set():
                self.scheduler.cancel(ticket)
                self._end(ticket, JobCancelled())

    def _fail_all(self) -> None:
        self.scheduler = self.batch.scheduler(stream_text=True)  # whatever the failed step left is dropped
        for ticket in list(self.active):
            self._end(ticket, JobFailed())

    def _end(self, ticket: int, final: RequestRecord | JobFailed | JobCancelled) -> None:
        """The job leaves the batch (so the gauge is never stale), then its client hears of the end."""
        self.queue.done()  # first: once the running gauge reads 0, every place is given back
        entry = self.active.pop(ticket)
        if not isinstance(final, RequestRecord):
            self.aborted_rounds.extend(entry.rounds)
        if isinstance(final, JobFailed):
            self.metrics.observe_failure()
        entry.job.push(final)

    def _step(self) -> None:
        """One scheduler step; each job's events go to metrics and to its client, in order."""
        events = self.scheduler.step()
        perf = time.perf_counter
        for ticket, event in events:
            entry = self.active[ticket]
            job, now = entry.job, perf()
            if isinstance(event, Emitted):
                gap = None if entry.last_chunk is None else now - entry.last_chunk
                self.metrics.observe_chunk(len(event.token_ids), now - job.arrival, gap)
                entry.last_chunk = now
                job.push(event)
            elif isinstance(event, RoundRecord):
                self.metrics.observe_round(event)
                entry.rounds.append(event)
            elif isinstance(event, RequestRecord):
                reason = FINISH_REASONS.get(event.stop_reason, "stop")
                self.metrics.observe_finish(reason, (entry.last_chunk or now) - job.arrival)
                self.records.append(event)
                self._end(ticket, event)
            elif isinstance(event, RequestFailed):
                log.error("request %s failed alone: %s", job.request_id, getattr(event, "error", event),
                          exc_info=getattr(event, "exception", None))
                self._end(ticket, JobFailed())
