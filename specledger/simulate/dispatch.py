"""Requests on their way to the replicas: open-loop arrival times or a closed loop's clients, and the router
that picks a replica for each."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from specledger.simulate.arrivals import Arrivals
from specledger.simulate.replica import Replica
from specledger.simulate.state import SimCounters

Router = Callable[[Sequence[Replica], int], int]


def round_robin() -> Router:
    state = {"next": 0}

    def pick(replicas: Sequence[Replica], rid: int) -> int:
        i = state["next"] % len(replicas)
        state["next"] += 1
        return i

    return pick


class Dispatcher:
    """The requests not yet handed to a replica (request ids in order): open-loop arrival times, or the
    closed loop's clients, each sending its next request when one of theirs finishes. A lone replica's
    fast path (:func:`specledger.simulate.fastpath.run_small_batch`) takes arrivals from it directly."""

    def __init__(self, counters: SimCounters, replicas: Sequence[Replica], pick: Router, arrivals: Arrivals,
                 n: int) -> None:
        self.counters, self.replicas, self.pick, self.n = counters, replicas, pick, n
        self.closed = arrivals.closed
        self.times = arrivals.times[:n].tolist() if arrivals.times is not None else None  # floats: cheap to index
        self.next_request = 0  # the next request id to hand out
        self.done = 0  # requests finished

    def next_time(self) -> float:
        """The next open-loop arrival (inf when none is left or the loop is closed)."""
        return self.times[self.next_request] if self.times is not None and self.next_request < self.n else math.inf

    def dispatch(self, t: float) -> None:
        """Hand the next request, arriving at ``t``, to the replica the router picks."""
        rid = self.next_request
        self.next_request += 1
        self.counters.arrival[rid] = t
        reps = self.replicas
        reps[self.pick(reps, rid) if len(reps) > 1 else 0].add(rid, t)

    def dispatch_until(self, t: float) -> float:
        """Hand over every open-loop arrival up to ``t``; returns the next arrival's time after them."""
        nxt = self.next_time()
        while nxt <= t:
            self.dispatch(nxt)
            nxt = self.next_time()
        return nxt

    def finish(self, finished: list[int], t: float) -> None:
        """Requests finished at ``t``: counted; in a closed loop each client sends its next one now."""
        self.done += len(finished)
        if self.closed:
            for _ in finished:
                if self.next_request < self.n:
                    self.dispatch(t)
