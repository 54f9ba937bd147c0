"""Several solo requests measured side by side: their rounds interleaved, each timed as if it ran alone.

On a shared machine the speed drifts by 10-25 % over seconds to minutes. Settings run one after the
other (plain, then each drafter x γ of the same prompt) each land in a different phase of that drift,
and a speed-up -- a ratio of two of them -- carries it. Round-robin over the requests' streams (one
round of each in turn, every request with its own KV cache) puts every setting in the same phase: drift
slower than one turn of the robin (a few rounds, ~0.2 s) hits all of them alike and cancels in their
ratios, as A B A B timing does for two commands. A long prompt's prefill is one operation of seconds, long
enough for one slow moment to land on one setting alone (an 826-token prefill measured 3.3 s for one
setting, 2.1-2.3 s for the others of its group): side by side, prefills run in passes of
:data:`PREFILL_CHUNK` positions, one pass per turn, so they share the drift as rounds do.

Each request keeps solo semantics: its forward passes run alone (never batched with another), and its
clock (:class:`PausableClock`) stops while its stream is suspended, so arrival, token times, TTFT and
total time count only its own prefill and rounds. A round's draft / verify / other split never spans a
suspension (:meth:`specledger.engine.decode.Engine.stream` yields only between rounds).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from specledger.engine.request import PrefillProgress
from specledger.records import RequestRecord, RoundRecord

if TYPE_CHECKING:
    from specledger.engine.protocol import StreamArgs, TargetEngine
    from specledger.engine.request import Prefilled

    #: one request run side by side: (its engine, its prompt ids, its ``stream`` keyword arguments)
    SideRequest = tuple[TargetEngine, Sequence[int], StreamArgs]

#: prompt positions per prefill pass of requests run side by side (``Engine.stream(prefill_chunk=...)``): a pass
#: of ~0.1 s on a 2-core CPU for SmolLM2-135M, a turn of the robin well under a second. Measured (826- and
#: 1203-token prompts, median of 5, one pass = 1): 64 positions 0.99 and 0.83, 128: 0.88 and 0.78, 32: 1.39
#: and 1.29; greedy outputs of six prompts of 275-1203 tokens identical to one pass
PREFILL_CHUNK = 64

#: opens one request's stream on the given clock (e.g. ``lambda clock: engine.stream(ids, ..., clock=clock)``)
StreamStarter = Callable[[Callable[[], float]], Iterator[Any]]


class PausableClock:
    """``perf_counter`` minus the time spent suspended: the time base of a request that shares the machine
    turn by turn with others. Invariant: between :meth:`suspend` and :meth:`resume` the clock stands still."""

    def __init__(self) -> None:
        self.paused = 0.0
        self._since: float | None = None

    def __call__(self) -> float:
        return (time.perf_counter() if self._since is None else self._since) - self.paused

    def suspend(self) -> None:
        self._since = time.perf_counter()

    def resume(self) -> None:
        if self._since is not None:
            self.paused += time.perf_counter() - self._since
            self._since = None


def _one_turn(stream: Iterator[Any]) -> RequestRecord | None:
    """Advance ``stream`` through its next round, or its next prefill pass when the prefill is chunked
    (the first turn ends with the prefill's first pass, or with the first round when it is one pass):
    the final record when the request ended in this turn, else None."""
    for ev in stream:
        if isinstance(ev, RequestRecord):
            return ev
        if isinstance(ev, RoundRecord | PrefillProgress):
            return None
    raise RuntimeError("a request stream ended without its RequestRecord")


def run_interleaved(starters: Sequence[StreamStarter]) -> list[RequestRecord]:
    """Run every request to the end, one round of each in turn (in ``starters`` order); returns their
    records in that order. One request alone is exactly ``generate``. Python's cyclic garbage collector is
    held off while they run and collects once after (as ``timeit`` does): a full collection of a long
    run's objects is a pause of tens of milliseconds that would land in one request's round or prefill."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run_interleaved(starters)
    finally:
        if was_enabled:
            gc.enable()
            gc.collect()


def _run_interleaved(starters: Sequence[StreamStarter]) -> list[RequestRecord]:
    clocks = [PausableClock() for _ in starters]
    streams = [start(clock) for start, clock in zip(starters, clocks)]
    records: list[RequestRecord | None] = [None] * len(streams)
    live = list(range(len(streams)))
    while live:
        still = []
        for i in live:
            clocks[i].resume()
            records[i] = _one_turn(streams[i])
            clocks[i].suspend()
            if records[i] is None:
                still.append(i)
        live = still
    return [r for r in records if r is not None]


class SideBySide:
    """Runs groups of solo requests side by side (:func:`run_interleaved`), each on a KV cache of its own:
    slot i of a group decodes on engine i's twin (:meth:`~specledger.engine.decode.Engine.sibling`, made once
    and kept, so caches are allocated once per experiment). Slot 0 is the engine itself.

    ``share_prefill`` (default): requests of one engine on one prompt share one prefill
    (:meth:`~specledger.engine.decode.Engine.prefill`, on a twin of its own), copied into each request's cache
    and counted in each request's TTFT and total time. The settings of a prompt differ only after the prefill
    (plain, n-gram and suffix prefill the same target; a draft model or head prefills its own state on the
    request's clock), so their outputs are unchanged, the prefill is paid once instead of once per setting
    (57 % of a default run's solo time was prefill), and its noise is the same number in every setting's total:
    it cancels in their paired ratios instead of landing on one setting alone."""

    def __init__(self, share_prefill: bool = True) -> None:
        self._twins: dict[tuple[int, int], TargetEngine] = {}
        self.share_prefill = share_prefill

    def twin(self, engine: TargetEngine, slot: int) -> TargetEngine:
        key = (id(engine), slot)
        if key not in self._twins:
            self._twins[key] = engine if slot == 0 else engine.sibling()
        return self._twins[key]

    def shared_prefills(self, requests: Sequence[SideRequest]) -> list[Prefilled | None]:
        """Per request, the :class:`~specledger.engine.request.Prefilled` it shares with the others of its engine
        and prompt (None: it prefills alone, e.g. the only request on its prompt)."""
        groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for i, (engine, ids, kwargs) in enumerate(requests):
            if self.share_prefill and "prefilled" not in kwargs:
                groups.setdefault((id(engine), tuple(int(t) for t in ids)), []).append(i)
        shared: list[Prefilled | None] = [None] * len(requests)
        for (_, ids), members in groups.items():
            if len(members) < 2:
                continue
            engine = requests[members[0]][0]
            kwargs = [requests[i][2] for i in members]
            hidden = any(getattr(k.get("drafter"), "wants_hidden", False) for k in kwargs)
            done = self.twin(engine, -1).prefill(ids, max(int(k.get("max_tokens", 1)) for k in kwargs), hidden)
            for i in members:
                shared[i] = done
        return shared

    def run(self, requests: Sequence[SideRequest]) -> list[RequestRecord]:
        """``requests``: (engine, prompt ids, ``stream`` keyword arguments) per request; their records in order.
        Requests that share a prefill (see the class doc) start from it; the others' prefills run in
        :data:`PREFILL_CHUNK` passes (unless the arguments say otherwise), a group of one too, so every record
        of a run prefilled the same way."""
        slots: dict[int, int] = {}
        starters: list[StreamStarter] = []
        for (engine, ids, kwargs), prefilled in zip(requests, self.shared_prefills(requests)):
            slot = slots[id(engine)] = slots.get(id(engine), -1) + 1
            twin = self.twin(engine, slot)
            args: StreamArgs = {"prefill_chunk": PREFILL_CHUNK, **kwargs}
            if prefilled is not None:
                args["prefilled"] = prefilled
            starters.append(lambda clock, twin=twin, ids=list(ids), args=args: twin.stream(ids, clock=clock, **args))
        return run_interleaved(starters)
