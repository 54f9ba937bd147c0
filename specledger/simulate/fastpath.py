"""Event skipping: a replica's steps between two events, computed at once -- exactly the step path's.

Between two events (a request admitted, a request finishing, an arrival the router must place) a
replica's running batch is fixed, so its next steps need no scheduling decisions: with keyed draws
(:class:`~specledger.simulate.chains.Draws`) each request's next S rounds can be drawn at once at the
full gamma G, and the prefix consistency of sampling (P_g = min(P_G, g), K_g = min(K_G, P_g)) turns them
into the rounds the step path would sample one step at a time. For request i (committed o_i of T_i,
rem_i = T_i - o_i), with R_is = K*_is + 1 and c_is = R_i0 + ... + R_is:

    rem_is   = rem_i - c_i(s-1)                         tokens left before step s
    gamma_is = max(min(G, rem_is - 1), 0)               the replica's clamp
    P_is = min(P*_is, gamma_is),  K_is = min(K*_is, P_is),  committed_is = min(R_is, rem_is)
    i finishes in the first step s with c_is >= rem_i

(before its last step R_is < rem_is, so the clamp never changes what is committed). The segment is
steps 0 .. the first step in which any request finishes, cut before the first step that starts at or
after ``bound``, and before the first step whose token budget or KV reservation would bind (those
trim or preempt: the step path takes them). Each step s costs what
:class:`~specledger.simulate.pricing.StepPrices` charges the step path,

    sum_i draft_s(gamma_is, C_s) + step_s(max(R_s, B), B, C_s) x jitter_s + other_s(B)
    R_s = sum_i (P_is + 1) (+ the prompts prefilled in step 0),  C_s = sum_i context_is / B

priced by the same :meth:`StepPrices.end_of_step` (a sum over requests is numpy's pairwise sum,
:func:`~specledger.simulate.pricing.pairwise_sum`; the replica's ``verify_s`` and ``verify_base_s`` are
left-to-right sums over its speculative steps), so the counters are the step path's to the last bit (gap
entries are appended per segment, step-major).

Two ways to run a segment, both with that outcome:

* :func:`run_small_batch` -- a small batch (<= SMALL_BATCH running): scalar Python step after step
  (:class:`~specledger.simulate.scalar_steps.ScalarSteps`, the step path's phases on lists) over
  rounds drawn ahead in bulk (:class:`~specledger.simulate.rounds.RoundCache`), taking before each step
  what the simulation loop and the admission take (:meth:`Replica.admit_next`; a lone replica also takes
  its arrivals from the :class:`~specledger.simulate.dispatch.Dispatcher` and hands finishes back, so a
  closed loop's next request joins at once). A lone replica runs on through
  arrivals and finishes -- at light load one call serves the whole run; one of several stops before
  the first step that starts at or after ``bound`` (the router places the next arrival) and, in a
  closed loop, after its first finish. It hands a step to the step path only when it must (a token
  budget that trims or does not take a prompt whole, a KV reservation that preempts, a batch grown
  past SMALL_BATCH).
* :func:`specledger.simulate.segment_arrays.run_segment` -- a large batch: requests x steps arrays up to the
  first finish, only where more than one step is expected before it (else the step path is cheaper).

Applies when: gamma is one static value (or, in scalar Python, the batch-size schedule); the table is
sampled (not ``deterministic``); the batch is not empty. The array segments also need: nothing can be
admitted (the queue is empty or every slot
is taken) and nobody finished at admission; requests prefilling (chunked prefill) complete their
prompts in step 0. Anything else returns None: the caller takes one ordinary step.
"""

from __future__ import annotations

import math

from specledger.simulate.dispatch import Dispatcher
from specledger.simulate.replica import Replica
from specledger.simulate.scalar_steps import ScalarSteps
from specledger.simulate.segment_arrays import run_segment

SMALL_BATCH = 128  # up to this many running requests a segment is priced in scalar Python (measured: faster
# than the step path up to ~128 running on a roofline; at 256 the step path's arrays win; at most 2047: a sum of
# wide round codes, rounds.WIDE)
AHEAD = 64  # rounds of a request fetched from the RoundCache at once


def advance(replica: Replica, bound: float = math.inf, dispatcher: Dispatcher | None = None) -> list[int]:
    """Advance ``replica`` one step or, where event skipping applies, every step up to the next event at once:
    the steps that start before ``bound`` (the next arrival the router must place), up to and including the
    first in which a request finishes. The outcome is the one :meth:`Replica.step` called that many times
    gives. A lone replica is given the ``dispatcher`` and may take arrivals and report finishes itself.
    Returns the finished ids not yet reported to the dispatcher."""
    t, finished = replica.admit(replica.clock)
    b = replica.running
    if b and replica.plan.vectorised and not replica.table.deterministic and replica.policies is None:
        done = None
        if dispatcher is not None and b <= SMALL_BATCH:
            done = run_small_batch(replica, t, finished, dispatcher, bound)
        elif (replica.plan.static is not None and not finished  # finished at admission: they leave with a step
              and not (replica.waiting and b < replica.cfg.max_num_seqs)):
            done = run_segment(replica, t, finished, bound, int(replica.plan.static))
        if done is not None:
            return done
    return replica.step_from(t, finished)


def run_small_batch(replica: Replica, t: float, finished: list[int], dispatcher: Dispatcher,
                    bound: float = math.inf) -> list[int] | None:
    """A replica, step after step in scalar Python while its batch stays small: before each step it does what
    the simulation loop and :meth:`Replica.admit` do (take the arrivals up to its clock from ``dispatcher``,
    jump to the next one when idle, admit waiting requests with :meth:`Replica.admit_next`), then takes the
    step through the step path's phases (:class:`~specledger.simulate.scalar_steps.ScalarSteps`), and hands
    finished requests to ``dispatcher`` at the step's end (a closed loop's client sends its next request then).
    It stops -- writing the running batch back -- when nothing is left, and before a step it cannot take here:
    a prompt that does not fit the step's token budget whole, a token budget that trims proposals, a KV
    reservation that preempts, a batch grown past SMALL_BATCH; that step is then the step path's (admission
    already done). Returns None (nothing done) when the very first step is such a step, else the ids finished
    and not yet handed to ``dispatcher``.

    One of several replicas: the same, without taking arrivals (the router places them), up to the
    first step that starts at or after ``bound`` (the next arrival; in a closed loop also the earliest
    clock of the other busy replicas). Open loop: finishes are only counted, so it runs on through
    them; closed loop: a finish sends a request the router places, so it stops after the first."""
    return ScalarSteps(replica, t, finished, dispatcher, bound, SMALL_BATCH, AHEAD).run()
