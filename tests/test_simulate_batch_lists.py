"""The scalar fast path's list form of a batch (simulate/batch_lists.py) and wide round codes (simulate/rounds.py)."""

from __future__ import annotations

import numpy as np

from specledger.simulate.batch_lists import clamp_gamma, clamped, exact_blocks, read_batch, write_batch
from specledger.simulate.rounds import WIDE, WIDE_MASK
from specledger.simulate.state import RunningBatch


def test_clamped_is_the_prefix_outcome():
    for p in range(9):
        for k in range(p + 1):
            w = p << WIDE | (k + 1)
            for g in range(9):
                c = clamped(w, g)
                assert (c >> WIDE, (c & WIDE_MASK) - 1) == (min(p, g), min(k, p, g))
    assert [clamp_gamma(4, r) for r in (0, 1, 2, 5, 6, 9)] == [0, 0, 1, 4, 4, 4]


def test_a_sum_of_wide_codes_keeps_both_sums():
    rng = np.random.default_rng(0)
    p = rng.integers(0, 32, 2047)
    k = np.minimum(rng.integers(0, 32, 2047), p)
    total = sum(int(a) << WIDE | int(b) + 1 for a, b in zip(p, k))
    assert (total >> WIDE, total & WIDE_MASK) == (int(p.sum()), int(k.sum()) + 2047)


def _batch():
    ints = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    return RunningBatch(request=ints(3, 8, 9), context=ints(40, 17, 100), out=ints(5, 0, 2), target=ints(9, 6, 30),
                        chain=ints(0, 1, 2), last_emit=np.array([1.0, 2.0, 3.0]), prefill_left=ints(0, 17, 0),
                        draw_key=ints(3, 8, 9), rounds_done=ints(4, 0, 1))


def test_lists_read_and_write_back_the_batch():
    b = _batch()
    request, target, rem, cbase, last_emit, prefill_left, roff = read_batch(b)
    assert rem == [4, 6, 28] and [c - r for c, r in zip(cbase, rem)] == [40, 17, 100]
    assert roff == [4, -1, 1]  # one prefilling: no round in its next step
    chain = np.arange(10) * 10
    back = _batch()
    write_batch(back, chain, np.arange(10), request, target, rem, cbase, last_emit, prefill_left, roff, 0)
    for f in ("request", "context", "out", "target", "prefill_left", "rounds_done", "last_emit"):
        assert (getattr(back, f) == getattr(b, f)).all(), f
    assert back.chain.tolist() == [30, 80, 90]


def test_exact_blocks_is_the_step_paths_sum():
    b = _batch()
    _, _, rem, cbase, _, prefill_left, _ = read_batch(b)
    nxt = [3 << WIDE | 2, 0, 1 << WIDE | 1]  # P = 3 and 1 for the decoding ones
    for bs in (1, 16):
        def ceil(x, bs=bs):
            return -(-x // bs)

        assert exact_blocks(rem, cbase, prefill_left, nxt, 4, False, bs) == ceil(43) + ceil(17) + ceil(101)
        assert exact_blocks(rem, cbase, prefill_left, nxt, 4, True, bs) == ceil(40 + 3) + ceil(17) + ceil(104)
