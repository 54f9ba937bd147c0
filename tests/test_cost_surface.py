"""The measured cost surface (specledger.cost): monotone prices, honest labels, files, the import format, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.cost.surface import CostSurface, SurfacePoint, isotonic
from specledger.errors import SpecLedgerError

DATA = Path(__file__).parent / "data" / "h200_llama3_8b_surface.jsonl"  # a subset of a real H200 measurement


def grid(batches=(1, 4), rows=(1, 2, 4, 8), contexts=(0, 1024), f=None) -> CostSurface:
    f = f or (lambda b, r, c: 0.01 + 1e-4 * b * r + 1e-6 * b * c)
    return CostSurface([SurfacePoint(b, r, c, f(b, r, c)) for b in batches for r in rows for c in contexts], "test")


# ---------------------------------------------------------------------------------- rules
def test_isotonic_pools_instead_of_ratcheting():
    # the H200 batch-1 line: q=8 24.276 ms then q=16 23.193 ms pools to their mean, not to 24.276
    y = isotonic([19.237, 23.09, 23.561, 24.276, 23.193])
    assert list(y[:3]) == [19.237, 23.09, 23.561]
    assert y[3] == y[4] == pytest.approx((24.276 + 23.193) / 2)
    assert isotonic([3.0, 1.0], [3, 1])[0] == pytest.approx(2.5)  # weights = repeats


def test_measured_points_keep_raw_and_fitted_values():
    s = CostSurface.from_jsonl(DATA)
    look = s.lookup(16, 1, 512)
    assert look.source == "measured" and look.seconds == pytest.approx((24.276 + 23.193) / 2e3)
    assert look.rel_sd == pytest.approx(abs(23.193e-3 - look.seconds) / look.seconds)
    assert s.lookup(1, 1, 512) == type(look)(pytest.approx(19.237e-3), "measured", 0.0)
    raw = {(p.batch, p.rows, p.context): p.seconds for p in s.points}
    assert raw[(1, 16, 512)] == pytest.approx(23.193e-3)


def test_labels_measured_interpolated_extrapolated():
    s = grid()
    assert s.lookup(2, 4, 1024).source == "measured"
    assert s.lookup(3, 4, 1024).source == "interpolated"  # between rows
    assert s.lookup(2, 2, 1024).source == "interpolated"  # between batches
    assert s.lookup(2, 4, 500).source == "interpolated"  # between contexts
    assert s.lookup(3, 3, 700).source == "interpolated"  # all three
    assert s.lookup(2.0, 4.0, 1024.0).source == "measured"  # floats at a measured point
    for args in [(16, 4, 1024), (2, 8, 1024), (2, 4, 2048), (16, 8, 4096)]:
        assert s.lookup(*args).source == "extrapolated", args
    single = grid(contexts=(512,))
    assert single.lookup(2, 1, 512).source == "measured"
    assert single.lookup(2, 1, 4096).source == "extrapolated"
    assert single.forward_s(2, 1, 4096) == single.forward_s(2, 1, 512)  # one context: no slope


def test_interpolation_is_linear_on_each_axis():
    s = grid(f=lambda b, r, c: 0.01 + 1e-3 * r + 1e-3 * b + 1e-6 * c)  # linear: read back exactly
    for args in [(3, 1, 0), (3, 2.5, 512), (1.5, 4, 100), (8, 4, 1024)]:
        r, b, c = args
        assert s.forward_s(*args) == pytest.approx(0.01 + 1e-3 * r + 1e-3 * b + 1e-6 * c), args


def test_incomplete_grid_interpolates_batch_within_each_context():
    s = CostSurface.from_jsonl(DATA)  # context 4096 has batches 1 and 64 only
    assert s.batches == (1, 16, 64) and s.contexts == (512, 4096) and s.rows_axis == (1, 2, 4, 8, 16)
    at = {(p.batch, p.rows, p.context): p.seconds for p in s.monotone_points}
    got = s.lookup(4, 16, 4096)
    assert got.source == "interpolated"
    t = (16 - 1) / (64 - 1)
    assert got.seconds == pytest.approx((1 - t) * at[(1, 4, 4096)] + t * at[(64, 4, 4096)])
    mid = s.lookup(4, 16, 2304)  # halfway in context: the mean of the two contexts' batch-16 prices
    assert mid.seconds == pytest.approx((at[(16, 4, 512)] + got.seconds) / 2)


def test_extrapolation_is_monotone_and_less_sure_with_distance():
    s = CostSurface.from_jsonl(DATA)
    for axis in range(3):
        prev = None
        for k in range(0, 6):
            args = [16, 64, 4096]
            args[axis] = args[axis] * 2 ** k
            look = s.lookup(*args)
            if k:
                assert look.source == "extrapolated"
                assert look.seconds >= prev.seconds and look.rel_sd > prev.rel_sd
            prev = look
    # below the smallest measured value: clamped, never cheaper than it
    assert s.forward_s(1, 1, 0) == s.forward_s(1, 1, 512)
    assert s.lookup(1, 1, 0).source == "extrapolated"
    assert s.lookup(1, 1, 256).rel_sd < s.lookup(1, 1, 0).rel_sd


def test_step_and_round_prices():
    s = grid()
    assert s.step_s(8, 4, 1024) == s.forward_s(2, 4, 1024)
    assert s.round_s(3, 100) == s.forward_s(3, 1, 100)


points = st.lists(
    st.tuples(st.sampled_from([1, 2, 4, 16, 64]), st.sampled_from([1, 2, 3, 5, 8, 16]),
              st.sampled_from([0, 128, 512, 4096]), st.floats(1e-4, 1.0)),
    min_size=1, max_size=40, unique_by=lambda p: p[:3])


@settings(max_examples=60, deadline=None)
@given(points, st.floats(1, 128), st.floats(0, 10_000))
def test_monotone_in_rows_anywhere(pts, batch, context):
    s = CostSurface([SurfacePoint(b, r, c, t) for b, r, c, t in pts], "random")
    rows = np.concatenate([np.linspace(1, 40, 157), [2, 3, 5, 8, 16, 32]])
    rows.sort()
    prices = [s.forward_s(r, batch, context) for r in rows]
    assert all(math.isfinite(p) and p > 0 for p in prices)
    assert all(b >= a - 1e-15 for a, b in zip(prices, prices[1:]))


# ---------------------------------------------------------------------------------- files
def test_round_trips(tmp_path):
    s = CostSurface.from_jsonl(DATA)
    assert s.meta["extra"][0]["note"].startswith("subset") and s.meta["extra"][0]["ms_min"] == 18.584
    again = CostSurface.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again.points == s.points and again.source == s.source and again.meta == s.meta
    s.save(tmp_path / "surface.json")
    loaded = CostSurface.load(tmp_path / "surface.json")
    assert loaded.points == s.points and json.loads((tmp_path / "surface.json").read_text())["kind"] == "cost-surface"
    (tmp_path / "again.jsonl").write_text(s.to_jsonl())
    back = CostSurface.load(tmp_path / "again.jsonl")
    assert [(p.batch, p.rows, p.context) for p in back.points] == [(p.batch, p.rows, p.context) for p in s.points]
    assert [p.seconds for p in back.points] == pytest.approx([p.seconds for p in s.points], rel=1e-12)
    s3 = CostSurface([SurfacePoint(1, 1, 0, 0.01, repeats=5)], "x")
    assert '"repeats": 5' in s3.to_jsonl() and CostSurface.from_dict(s3.to_dict()).points[0].repeats == 5


GOOD = '{"batch": 1, "q": 1, "ctx": 512, "ms": 19.2}\n'


@pytest.mark.parametrize("line, needle", [
    ('{"batch": 1, "q": 2, "ctx": 512}', "missing ms"),
    ('{"batch": 1, "ctx": 512, "ms": 3}', "missing q"),
    ('{"batch": 1, "q": "two", "ctx": 512, "ms": 3}', "integer"),
    ('{"batch": 1, "q": 2, "ctx": 512, "ms": "fast"}', "number"),
    ('{"batch": 1, "q": 2, "ctx": 512, "ms": -1}', "> 0"),
    ('{"batch": 1, "q": 2, "ctx": 512, "ms": 0}', "> 0"),
    ('{"batch": 1, "q": 2, "ctx": 512, "ms": NaN}', "finite"),
    ('{"batch": 1, "q": 2, "ctx": 512, "ms": Infinity}', "finite"),
    ('{"batch": 0, "q": 2, "ctx": 512, "ms": 3}', ">= 1"),
    ('{"batch": 1, "q": 0, "ctx": 512, "ms": 3}', ">= 1"),
    ('{"batch": 1, "q": 2.5, "ctx": 512, "ms": 3}', "integer"),
    ('{"batch": 1, "q": 2, "ctx": -1, "ms": 3}', "context must be >= 0"),
    ('{"batch": 1, "q": 1, "ctx": 512, "ms": 20}', "duplicate"),
    ('{"batch": 1, "q": 2, "ctx": 512, "ms": 3', "not valid JSON"),
    ('[1, 2, 512, 3]', "JSON object"),
])
def test_bad_import_lines_are_one_line_errors_naming_the_line(tmp_path, line, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + "\n" + line + "\n")
    with pytest.raises(SpecLedgerError) as exc:
        CostSurface.from_jsonl(path)
    msg = str(exc.value)
    assert "\n" not in msg and f"{path}:3:" in msg and needle in msg, msg


def test_empty_and_missing_import_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n \n")
    with pytest.raises(SpecLedgerError, match="no points"):
        CostSurface.from_jsonl(tmp_path / "empty.jsonl")
    with pytest.raises(SpecLedgerError, match="not found"):
        CostSurface.load(tmp_path / "nope.json")
    (tmp_path / "other.json").write_text('{"kind": "roofline"}')
    with pytest.raises(SpecLedgerError, match="not a cost surface"):
        CostSurface.load(tmp_path / "other.json")
