"""The per-request ledger of `specledger generate` (analysis), and the layering it keeps: the engine
library never imports analysis."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specledger.analysis.request_ledger import request_ledger
from specledger.records import RequestRecord, RoundRecord


def _record(rounds: list[tuple[int, int, int]], total_time: float, tokens: list[int]) -> RequestRecord:
    """rounds: (proposed, accepted, committed), each 10 ms of verify."""
    rds = [RoundRecord("ngram", p, p, k, c, False, 0.001, 0.010, 0.001, 10 + i) for i, (p, k, c) in enumerate(rounds)]
    return RequestRecord("r", "ngram", 2, 0.0, 1.0, 0, 0, 10, len(tokens), "", tokens, "length", 0.01, 0.02,
                         total_time, [total_time] * len(tokens), [len(tokens)], rds)


def test_request_ledger_measures_the_speedup_against_plain():
    spec = _record([(2, 2, 3), (2, 0, 1), (2, 1, 2)], total_time=0.05, tokens=list(range(7)))
    plain = _record([(0, 0, 1)] * 6, total_time=0.10, tokens=list(range(7)))
    led = request_ledger(spec, plain)
    assert led["E[L]"] == pytest.approx(2.0)  # (3 + 1 + 2) / 3 full rounds
    assert led["k_histogram"][:3] == [1, 1, 1]
    assert led["speedup"] == pytest.approx((7 / 0.05) / (7 / 0.10))
    assert led["t_round_ms"] == pytest.approx(12.0) and led["T0_ms"] == pytest.approx(12.0)
    assert led["predicted_speedup"] == pytest.approx(2.0)
    assert led["identical_to_plain"] is True
    assert "speedup" not in request_ledger(spec)


def test_the_engine_does_not_import_analysis():
    code = ("import sys, specledger.engine.decode, specledger.engine.batch, specledger.engine.request; "
            "print(sorted(m for m in sys.modules if m.startswith('specledger.analysis')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
