"""The measured cost surface (specledger.cost): monotone prices, honest labels, files, the import format, CLI."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.cost.surface import BATCH_POWER, CostSurface, SurfacePoint, isotonic
from specledger.errors import SpecLedgerError

DATA = Path(__file__).parent / "data" / "h200_llama3_8b_surface.jsonl"  # a subset of a real H200 measurement
# the two whole H200 files of ../shared/gpu, copied (the note on each first line says from where)
FULL_LLAMA = Path(__file__).parent / "data" / "h200_llama3_8b_full.jsonl"
FULL_SMOLLM = Path(__file__).parent / "data" / "h200_smollm2_135m_full.jsonl"


def grid(batches=(1, 4), rows=(1, 2, 4, 8), contexts=(0, 1024), f=None, **kw) -> CostSurface:
    f = f or (lambda b, r, c: 0.01 + 1e-4 * b * r + 1e-6 * b * c)
    return CostSurface([SurfacePoint(b, r, c, f(b, r, c)) for b in batches for r in rows for c in contexts], "test",
                       **kw)


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


def test_interpolation_is_linear_in_rows_and_context_and_in_squares_along_batch():
    s = grid(f=lambda b, r, c: 0.01 + 1e-3 * r + 1e-3 * b + 1e-6 * c, batch_power=1)  # straight: read back exactly
    for args in [(3, 1, 0), (3, 2.5, 512), (1.5, 4, 100), (8, 4, 1024)]:
        r, b, c = args
        assert s.forward_s(*args) == pytest.approx(0.01 + 1e-3 * r + 1e-3 * b + 1e-6 * c), args
    # the default: T^2 = F^2 + (G b)^2 (a floor and work proportional to the batch) is read back exactly
    s = grid(f=lambda b, r, c: math.sqrt((0.01 + 1e-3 * r) ** 2 + (1e-3 * b) ** 2), batches=(1, 64), contexts=(0,))
    for r, b in [(1, 4), (4, 16), (8, 40), (2, 128)]:  # measured rows (rows stay straight between them)
        assert s.forward_s(r, b, 0) == pytest.approx(math.sqrt((0.01 + 1e-3 * r) ** 2 + (1e-3 * b) ** 2)), (r, b)


def test_incomplete_grid_interpolates_batch_within_each_context():
    s = CostSurface.from_jsonl(DATA)  # context 4096 has batches 1 and 64 only
    assert s.batches == (1, 16, 64) and s.contexts == (512, 4096) and s.rows_axis == (1, 2, 4, 8, 16)
    at = {(p.batch, p.rows, p.context): p.seconds for p in s.monotone_points}
    got = s.lookup(4, 16, 4096)
    assert got.source == "interpolated"
    u = (16 ** 2 - 1) / (64 ** 2 - 1)  # rule 2: T^2 linear in batch^2 between the batches measured there
    assert got.seconds == pytest.approx(math.sqrt((1 - u) * at[(1, 4, 4096)] ** 2 + u * at[(64, 4, 4096)] ** 2))
    mid = s.lookup(4, 16, 2304)  # halfway in context: the mean of the two contexts' batch-16 prices
    assert mid.seconds == pytest.approx((at[(16, 4, 512)] + got.seconds) / 2)


def held_out_errors(path: Path, held, batch_power: float = BATCH_POWER) -> list[float]:
    """|predicted / measured - 1| of every point of ``path`` that ``held`` selects, each priced by one surface
    built from the file's other points (all read between measured points: labelled interpolated)."""
    full = CostSurface.from_jsonl(path)
    reduced = CostSurface([p for p in full.points if not held(p)], "held out", batch_power=batch_power)
    errors = []
    for p in (p for p in full.points if held(p)):
        look = reduced.lookup(p.rows, p.batch, p.context)
        assert look.source == "interpolated", p
        errors.append(abs(look.seconds / p.seconds - 1))
    return errors


def test_held_out_batches_4_and_16_priced_from_batches_1_and_64():
    """Issue 48's check on the points the H200 file has: at context 4096 only batches 1 and 64 were measured, so
    the measured batches 4 and 16 at context 512 stand in for its held-back ones -- all ten (q 1..16) held out,
    priced from batch 1 and 64 at 512 (and context 4096, which cannot reach them). Nothing was fitted on them:
    rule 2 has no free parameter (p = 2 is the quadrature join of a floor and batch-proportional work).
    Straight in batch: 11.8 % median, 49.4 % worst, 8 of 10 too high; rule 2: 6.3 %, 26.9 %. The three
    above 20 % are batch 16 at q = 4 (median 35.2 ms, its fastest repeat 23.2 ms: a disturbed median) and at
    q = 8, 16 (21.5, 23.6 ms, +27 % and +23 %: no slower than batch 1's 23.7 ms there -- at context 512 and
    many rows the knee is sharper than the join)."""
    held = lambda p: p.context == 512 and p.batch in (4, 16)  # noqa: E731
    before = held_out_errors(FULL_LLAMA, held, batch_power=1)
    after = held_out_errors(FULL_LLAMA, held)
    assert len(after) == 10
    assert statistics.median(before) == pytest.approx(0.118, abs=1e-3) and max(before) == pytest.approx(0.494, abs=1e-3)
    assert statistics.median(after) <= 0.10 and max(after) <= 0.30
    assert statistics.median(after) < statistics.median(before) and max(after) < max(before)
    assert sorted(after)[6] <= 0.10  # 7 of 10 within 10 %


def monotone_floor(line: dict[int, float]) -> float:
    """The smallest worst |error| any price non-decreasing in rows can reach on one measured line
    ({rows: seconds}): for every pair q < q' measured slower-then-faster (T_q > T_q'), one value p must serve
    both, best at the harmonic mean 2 / (1/T_q + 1/T_q'), off by (T_q - T_q') / (T_q + T_q') each way."""
    qs = sorted(line)
    return max([0.0] + [(line[a] - line[b]) / (line[a] + line[b]) for i, a in enumerate(qs) for b in qs[i + 1:]])


def test_held_out_knee_against_its_own_lines():
    """The same ten held-out points judged two ways. Against their raw medians no price that grows with rows can
    be within 20 % at worst: batch 16 measured 35.2 ms at q = 4 and 21.5 ms at q = 8, so one of the two is at
    least 24.2 % off whatever is predicted (:func:`monotone_floor`). Against the held-out lines' own isotonic
    fit (rule 1 applied to the measured batch 4 and 16 lines, the reduced surface never sees them) rule 2 is
    1.8 % at the median and 8.5 % at worst: within issue 48's 10 % / 20 %."""
    held = lambda p: p.context == 512 and p.batch in (4, 16)  # noqa: E731
    full = CostSurface.from_jsonl(FULL_LLAMA)
    line16 = {p.rows: p.seconds for p in full.points if p.context == 512 and p.batch == 16}
    assert monotone_floor(line16) == pytest.approx(0.242, abs=1e-3) and monotone_floor(line16) > 0.20
    reduced = CostSurface([p for p in full.points if not held(p)], "held out")
    fitted = {(p.batch, p.rows): p.seconds for p in full.monotone_points if held(p)}
    errors = [abs(reduced.forward_s(r, b, 512) / s - 1) for (b, r), s in fitted.items()]
    assert len(errors) == 10
    assert statistics.median(errors) <= 0.10 and max(errors) <= 0.20


@pytest.mark.parametrize("path, batch, median, worst", [
    (FULL_LLAMA, 4, 0.06, 0.08),  # from batches 1 and 16 (straight: 3.2 %, 9.6 %)
    (FULL_LLAMA, 16, 0.21, 0.27),  # from batches 4 and 64 (straight: 17.1 %, 41.7 %)
    (FULL_SMOLLM, 16, 0.16, 0.28),  # from batches 4 and 64 (straight: 13.3 %, 27.0 %)
])
def test_held_out_single_batches(path, batch, median, worst):
    """One measured batch held out at context 512, priced from its neighbours. Near a launch floor (these
    lines vary by less than their noise up to batch 16) rule 2 and a straight line do about equally. The
    SmolLM2 file's batches 4 and 16 are not checked from batch 1: its batch 1 is slower than its batch 64 at
    every q (32.6 vs 22.5 ms at q = 1, a warm-up artefact), so nothing monotone between them can be."""
    errors = held_out_errors(path, lambda p: p.context == 512 and p.batch == batch)
    assert len(errors) == 5 and statistics.median(errors) <= median and max(errors) <= worst


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


@settings(max_examples=150, deadline=None)
@given(points, st.floats(1, 128), st.floats(0, 10_000))
def test_monotone_in_rows_anywhere(pts, batch, context):
    s = CostSurface([SurfacePoint(b, r, c, t) for b, r, c, t in pts], "random")
    rows = np.concatenate([np.linspace(1, 40, 157), [2, 3, 5, 8, 16, 32]])
    rows.sort()
    prices = [s.forward_s(r, batch, context) for r in rows]
    assert all(math.isfinite(p) and p > 0 for p in prices)
    assert all(b >= a * (1 - 1e-12) for a, b in zip(prices, prices[1:]))  # up to float rounding


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


# ---------------------------------------------------------------------------------- CLI and calibrate
def _invoke(argv):
    from typer.testing import CliRunner

    from specledger.cli import app

    return CliRunner().invoke(app, argv, env={"COLUMNS": "200"})


def test_cost_verb_json(tmp_path):
    res = _invoke(["cost", str(DATA), "--batch", "1,16", "--rows", "1,3,32", "--context", "512,8192", "--json"])
    assert res.exit_code == 0, res.output
    table = json.loads(res.output)
    assert len(table) == 2 * 3 * 2
    assert {"batch", "rows", "context", "ms", "source"} <= set(table[0])
    by = {(p["batch"], p["rows"], p["context"]): p for p in table}
    assert by[(1, 1, 512)]["source"] == "measured" and by[(1, 1, 512)]["ms"] == pytest.approx(19.237)
    assert by[(16, 3, 512)]["source"] == "interpolated"
    assert by[(16, 32, 512)]["source"] == "extrapolated" and by[(1, 1, 8192)]["source"] == "extrapolated"
    bad = _invoke(["cost", str(DATA), "--rows", "0"])
    assert bad.exit_code != 0


def test_calibrate_import_writes_a_profile_the_cost_verb_reads(tmp_path):
    out = tmp_path / "h200.json"
    res = _invoke(["calibrate", "--import", str(DATA), "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["kind"] == "cost-surface" and len(doc["points"]) == 25
    assert CostSurface.load(out).forward_s(3, 16, 1000) == CostSurface.from_jsonl(DATA).forward_s(3, 16, 1000)
    res = _invoke(["cost", str(out), "--batch", "64", "--rows", "2", "--context", "4096", "--json"])
    assert json.loads(res.output)[0]["ms"] == pytest.approx(296.556)


def test_calibrate_import_bad_file_is_one_line_error(tmp_path, capsys):
    from specledger.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD + '{"batch": 1, "q": 2, "ctx": 512, "ms": -3}\n')
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--import", str(bad), "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and f"{bad}:2:" in err
    assert not (tmp_path / "x.json").exists()


def test_calibrate_writes_the_surface_beside_the_model_or_as_jsonl(tmp_path, target):
    from specledger.engine.calibrate import calibrate, surface_path, write_calibration

    cost = calibrate(device="cpu", contexts=[16, 64], repeats=1, model=target)
    surface = write_calibration(cost, tmp_path / "cm.json")
    assert (tmp_path / "cm.json").is_file() and surface_path(tmp_path / "cm.json") == tmp_path / "cm.surface.json"
    again = CostSurface.load(tmp_path / "cm.surface.json")
    assert again.points == surface.points and again.batches == (1, 2, 4, 8) and again.contexts == (16, 64)
    assert surface.lookup(3, 4, 64).source == "measured"  # a batched point: 12 rows over 4 requests
    write_calibration(cost, tmp_path / "gpu.jsonl")  # what `calibrate --device cuda --out gpu.jsonl` writes
    assert [(p.batch, p.rows, p.context) for p in CostSurface.from_jsonl(tmp_path / "gpu.jsonl").points] == \
        [(p.batch, p.rows, p.context) for p in surface.points]


@pytest.mark.parametrize("interleaved", [True, False])
def test_measure_rows_axis(target, interleaved):
    from specledger.engine.calibrate import measure_rows_axis

    s = measure_rows_axis(target, [8, 64], rows=(1, 2, 5, 9), repeats=2, interleaved=interleaved)
    assert s.rows_axis == (1, 2, 5, 9) and s.batches == (1,) and s.contexts == (8, 64)
    assert all(p.repeats == 2 and p.seconds > 0 for p in s.points)
    assert s.lookup(5, 1, 64).source == "measured" and s.lookup(33, 1, 64).source == "extrapolated"
    assert ("interleaved" in s.source) == interleaved
    far = measure_rows_axis(target, [10_000], rows=(1, 2), repeats=1)  # no context fits: a quarter of max_seq_len
    assert far.contexts == (target.config.max_seq_len // 4,)


def test_simulate_prices_with_a_surface_profile(tmp_path, capsys):
    from specledger.cost.loader import load_pricer as load_cost
    from specledger.cost.serving import SurfaceCost
    from tests.test_simulate import _cli, _record

    run = tmp_path / "run"
    run.mkdir()
    recs = []
    for i in range(4):
        recs.append(_record(f"p{i}", "none", 0, [(0, 0)] * 20))
        recs.append(_record(f"p{i}", "ngram", 4, [(4, (i + j) % 5) for j in range(10)]))
    (run / "traces.jsonl").write_text("".join(r.to_json() + "\n" for r in recs), encoding="utf-8")
    CostSurface.from_jsonl(DATA).save(tmp_path / "surface.json")
    cost = load_cost(tmp_path / "surface.json")
    assert isinstance(cost, SurfaceCost) and isinstance(load_cost(DATA), SurfaceCost)
    assert cost.step_s(64, 16, 512) == CostSurface.from_jsonl(DATA).forward_s(4, 16, 512)
    assert cost.prefill_s(120) >= cost.step_s(1, 1, 0) and cost.draft_s("ngram", 4) == 0 == cost.other_s(8)
    code, out, err = _cli(["simulate", "--from", str(run), "--concurrency", "1,4", "--gamma", "2,4", "--requests",
                           "20", "--profile", str(tmp_path / "surface.json"), "--json", "--out", str(run)], capsys)
    assert code == 0, err
    points = json.loads(out)
    assert len(points) == 2 * 3 and all(p["throughput_tok_s"] > 0 for p in points)
    doc = json.loads((run / "simulate.json").read_text())
    assert "surface" in doc["cost_source"] and "drafting 0" in doc["cost_source"]
