"""Per-rows levels (specledger.cost.levels): the run's own rounds correct the surface where they measured it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specledger.cost.levels import PSEUDO_ROUNDS, fit_row_levels, levelled


def _sigma(rows: int, context: float) -> float:
    return 0.030 + 0.004 * (rows - 1) + 1e-6 * context


def test_levels_are_the_shrunk_ratio_of_measured_to_surface():
    # rows 3 measured 20 % above the surface over 300 rounds, rows 1 on it, rows 2 barely seen
    rounds = [(1, _sigma(1, 100), _sigma(1, 100))] * 300 + [(3, 1.2 * _sigma(3, 100), _sigma(3, 100))] * 300
    rounds += [(2, 2.0 * _sigma(2, 100), _sigma(2, 100))]
    lv = fit_row_levels(rounds, level=1.0)
    assert lv[1] == pytest.approx(1.0)
    assert lv[3] == pytest.approx((300 * 1.2 + PSEUDO_ROUNDS) / (300 + PSEUDO_ROUNDS))
    assert lv[2] == pytest.approx((2.0 + PSEUDO_ROUNDS) / (1 + PSEUDO_ROUNDS))  # one round moves it little
    assert 4 not in lv  # never verified: the surface's shape at the global level
    assert fit_row_levels(rounds, level=0.0) == {}


@given(st.dictionaries(st.integers(1, 12), st.floats(0.3, 3.0), max_size=8), st.floats(0, 4000))
def test_the_levelled_surface_never_falls_with_rows(levels, context):
    values = [levelled(_sigma, levels, r, context) for r in range(1, 20)]
    assert all(b >= a for a, b in zip(values, values[1:]))


def test_a_cost_model_prices_with_its_levels_and_keeps_them(tmp_path):
    from specledger.cost.costmodel import CostModel, Part
    from specledger.cost.surface import CostSurface, SurfacePoint

    surface = CostSurface([SurfacePoint(1, r, c, _sigma(r, c), 3) for r in (1, 2, 3, 5, 9) for c in (64, 512)], "t")
    cost = CostModel("t", Part(["surface"], [1.0]), Part(["1", "P", "P2"], [0.0, 0.0, 0.0]), surface=surface,
                     row_levels={3: 1.5})
    assert cost.round_s(3, 64) == pytest.approx(1.5 * surface.round_s(3, 64))
    # one measured rows value: one level for every rows (nothing says how memory and arithmetic split)
    assert cost.round_s(4, 64) == pytest.approx(1.5 * surface.round_s(4, 64))
    assert cost.round_s(2, 64) == pytest.approx(1.5 * surface.round_s(2, 64))
    cost.save(tmp_path / "c.json")
    assert CostModel.load(tmp_path / "c.json").row_levels == {3: 1.5}


def test_unmeasured_rows_lie_on_the_line_through_the_measured_levels():
    """One-row steps measured below the surface and 5-row rounds above it (the machine's memory fast, its arithmetic
    slow): rows between are on the line through the two in the surface's coordinate, rows beyond carry the
    extra-rows level on, instead of falling back to the surface's own level (what underpriced deep verification)."""
    lv, c = {1: 0.9, 5: 1.2}, 300.0
    l1, l5 = 0.9 * _sigma(1, c), 1.2 * _sigma(5, c)

    def line(r):
        return l1 + (l5 - l1) * (_sigma(r, c) - _sigma(1, c)) / (_sigma(5, c) - _sigma(1, c))

    assert levelled(_sigma, lv, 3, c) == pytest.approx(line(3))
    assert levelled(_sigma, lv, 9, c) == pytest.approx(line(9))
    assert levelled(_sigma, lv, 9, c) > 1.2 * _sigma(9, c) > _sigma(9, c)  # beyond: the extra rows cost more
