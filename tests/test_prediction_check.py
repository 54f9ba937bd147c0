"""The in-run check's noise floor: how far the measured side moves between runs of the same prompts."""

from __future__ import annotations

import math

import pytest

from specledger.predict.check import reproducibility


def _check(values: dict[tuple[str, str, int], float]) -> dict:
    return {"rows": [{"category": c, "drafter": d, "gamma": g, "measured_speedup": s}
                     for (c, d, g), s in values.items()]}


def test_reproducibility_pairs_settings_measured_in_both_runs():
    a = _check({("code", "ngram", 2): 1.5, ("code", "ngram", 4): 1.2, ("chat", "ngram", 2): 1.1})
    b = _check({("code", "ngram", 2): 1.2, ("code", "ngram", 4): 1.2, ("math", "ngram", 2): 1.0})
    res = reproducibility([a, b])
    assert res["pairs"] == 2 and res["runs"] == 2  # chat and math were measured once: not paired
    assert res["median_run_to_run"] == pytest.approx((0.25 + 0.0) / 2)
    assert res["median_single_run"] == pytest.approx(res["median_run_to_run"] / math.sqrt(2))
    assert reproducibility([a]) is None and reproducibility([a, _check({})]) is None
