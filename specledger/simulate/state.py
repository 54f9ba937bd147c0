"""The simulator's state: a server's knobs, one replica's running batch, and the per-request outcomes.

:class:`RunningBatch` is the one state type every way of taking steps reads and writes: the step path
(:meth:`specledger.simulate.replica.Replica.step_from`), the scalar fast path
(:func:`specledger.simulate.fastpath.run_small_batch`, which holds it as Python lists while it runs) and the
array segments (:func:`specledger.simulate.segment_arrays.run_segment`). :class:`SimCounters` holds what the
simulation reports: one slot per simulated request, and the totals of every step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from specledger.simulate.chains import ChainTable

if TYPE_CHECKING:
    from specledger.simulate.rounds import RoundCache


@dataclass(frozen=True)
class ServerConfig:
    """The scheduler's knobs (vLLM names where they exist)."""

    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None  # rows per step: gamma + 1 per decoding request (+ prefill)
    kv_budget_tokens: int | None = None  # None: unlimited
    block_size: int = 1  # KV is reserved in blocks of this many tokens (vLLM: 16)
    chunked_prefill: bool = False
    reserve_gamma: bool = False  # reserve KV for the gamma asked (vLLM's lookahead slots), not what was proposed

    def budget(self) -> int | None:
        """Rows a step may carry (None: no cap); chunked prefill without a cap gets vLLM's 2048."""
        if self.max_num_batched_tokens is None and self.chunked_prefill:
            return 2048
        return self.max_num_batched_tokens

    def kv_blocks_budget(self) -> int | None:
        """KV blocks a replica may reserve (None: unlimited)."""
        return None if self.kv_budget_tokens is None else max(1, self.kv_budget_tokens // self.block_size)

    def blocks(self, tokens: np.ndarray | int) -> np.ndarray | int:
        """KV blocks that hold ``tokens`` tokens (per element for an array)."""
        b = self.block_size
        return tokens if b == 1 else -(-tokens // b)


def _ints(n: int = 0) -> np.ndarray:
    return np.zeros(n, dtype=np.int64)


@dataclass
class RunningBatch:
    """The requests a replica is running, in admission order: every field has shape ``[batch]`` and row i of
    each is the same request. Admission appends rows, a finish or a preemption drops them."""

    request: np.ndarray  # [batch] int64: the request id (its slot in SimCounters' arrays)
    context: np.ndarray  # [batch] int64: tokens in its KV cache: prompt + committed output (+1 once prefilled)
    out: np.ndarray  # [batch] int64: output tokens committed so far
    target: np.ndarray  # [batch] int64: output tokens it will have when done (the measured request's)
    chain: np.ndarray  # [batch] int64: its measured request, the row of the ChainTable it accepts by
    last_emit: np.ndarray  # [batch] float64: when its latest tokens left (the start of its next gap)
    prefill_left: np.ndarray  # [batch] int64: prompt tokens still to prefill (chunked prefill; else 0)
    draw_key: np.ndarray  # [batch] int64: what its acceptance draws are keyed on (SimCounters.draw_key)
    rounds_done: np.ndarray  # [batch] int64: its speculation rounds so far (the draws' round index)

    @classmethod
    def empty(cls) -> RunningBatch:
        return cls(_ints(), _ints(), _ints(), _ints(), _ints(), np.zeros(0), _ints(), _ints(), _ints())

    @property
    def size(self) -> int:
        return int(self.request.shape[0])

    def columns(self) -> list[np.ndarray]:
        return [getattr(self, f.name) for f in fields(self)]

    def extend(self, other: RunningBatch) -> None:
        """Admitted requests join at the end."""
        for f in fields(self):
            setattr(self, f.name, np.concatenate([getattr(self, f.name), getattr(other, f.name)]))

    def select(self, rows: np.ndarray | slice) -> None:
        """Keep only ``rows`` (a boolean mask or a slice), in order."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name)[rows])

    @classmethod
    def joining(cls, counters: SimCounters, ids: np.ndarray, context: np.ndarray,
                prefill_left: np.ndarray) -> RunningBatch:
        """Rows for requests ``ids`` admitted now, their progress read back from ``counters``."""
        c = counters
        return cls(ids, context, c.out[ids], c.target[ids], c.chain[ids], c.t_last[ids], prefill_left,
                   c.draw_key[ids], c.rounds_done[ids])


class SimCounters:
    """What a simulation reports: per-request outcome arrays shared by its replicas (index = request id), and
    the totals of every step taken (by any path)."""

    def __init__(self, table: ChainTable, order: np.ndarray, per: str = "request") -> None:
        n = order.shape[0]
        self.n = n
        self.chain = order.astype(np.int64)
        # what a request's acceptance draws are keyed on (chains.Draws): itself, or the measured prompt it replays
        self.draw_key = self.chain.copy() if per == "prompt" else np.arange(n, dtype=np.int64)
        self.rounds_done = _ints(n)  # rounds decoded so far (kept across a preemption)
        self.prompt = table.prompt_tokens[self.chain]
        self.target = table.output_tokens[self.chain]
        self.arrival = np.full(n, np.nan)
        self.t_first = np.full(n, np.nan)
        self.t_last = np.full(n, np.nan)
        self.out = _ints(n)
        self.chunks = _ints(n)
        self.max_gap = np.zeros(n)
        self.preemptions = _ints(n)
        self.recompute_s = np.zeros(n)
        self.frac = np.zeros(n)  # a deterministic table's fractional accepted tokens carried to the next round
        self.replica = np.full(n, -1, dtype=np.int64)
        self.gaps: list[np.ndarray] = []  # chunk gaps (float32), appended step-major on every path
        self.steps = 0
        self.batch_sum = 0
        self.rows_sum = 0
        self.proposed_sum = 0
        self.accepted_sum = 0
        self.rounds = 0
        self.peak_kv_tokens = 0
        # speculative steps (some request verifies candidates): their forward seconds, and what the same
        # steps' forwards cost without the candidate rows (the break-even verify premium's V and V_1);
        # each replica sums its own (its steps come in one order on every path), these are their totals
        self.verify_s = 0.0
        self.verify_base_s = 0.0
        self.fast_steps = 0  # steps taken by the event-skipping fast path, of ``steps``
        self.fast_segments = 0
        self.round_cache: RoundCache | None = None  # requests' acceptance draws, drawn ahead in bulk (fast path)

    @property
    def nround(self) -> np.ndarray:
        """``rounds_done`` under its older name (the fast-path tests compare it)."""
        return self.rounds_done
