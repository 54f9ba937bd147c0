"""The crossover located (issue 44, item 3): the load planner bisects in powers of two wherever the answer changes
between adjacent measured loads, until each change is bracketed within 2×; ``--loads A..B`` parses as a range."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.errors import SpecLedgerError
from specledger.load_bisect import brackets, is_located, locate, next_load, point_cost, power_between, range_loads
from specledger.load_points import is_load_range, parse_loads


def _run(lo: int, hi: int, decide, afford=None) -> tuple[list[int], dict[int, object]]:
    """The planner's loop against a pure ``decide(load)``: the loads measured, in order, and what each decided."""
    keys: dict[int, object] = {}
    order = locate(range_loads(lo, hi), lambda x: keys.__setitem__(x, decide(x)), lambda: dict(keys), afford)
    return order, keys


def test_power_between_takes_the_log_midpoint():
    assert power_between(1, 16) == 4
    assert power_between(4, 16) == 8 and power_between(1, 4) == 2
    assert power_between(1, 8) == 2  # 2 and 4 are equally far from √8: the smaller
    assert power_between(3, 20) == 8 and power_between(9, 19) == 16
    assert power_between(4, 8) is None and power_between(2, 3) is None


def test_one_change_in_1_to_16_is_bisected_as_the_issue_says():
    order, keys = _run(1, 16, lambda x: "on" if x <= 5 else "off")
    assert order == [1, 16, 4, 8]  # both ends; they differ: 4 (on); 4..16 still differs: 8 (off)
    assert brackets(keys) == [(4, 8)] and is_located(4, 8)
    order, _ = _run(1, 16, lambda x: "on" if x < 2 else "off")
    assert order == [1, 16, 4, 2]


def test_no_change_measures_the_ends_only():
    assert _run(1, 16, lambda x: "on")[0] == [1, 16]
    assert next_load({1: "a"}) is None and next_load({}) is None


def test_a_decision_that_changes_twice_gets_both_changes_located():
    # γ=4 up to 2, γ=2 from 3 to 24, off from 25: two changes in 1..64
    def decide(x: int) -> str:
        return "ngram γ=4" if x <= 2 else "ngram γ=2" if x <= 24 else "off"

    order, keys = _run(1, 64, decide)
    assert order[:2] == [1, 64]
    assert brackets(keys) == [(2, 4), (16, 32)]  # each change between adjacent loads at most 2× apart
    assert all(is_located(a, b) for a, b in brackets(keys))
    assert set(order) == {1, 2, 4, 8, 16, 32, 64}


def test_the_afford_hook_stops_the_bisection():
    order, keys = _run(1, 16, lambda x: x < 3, afford=lambda load: load != 8)
    assert order == [1, 16, 4, 2]  # 8 was not asked for
    order, keys = _run(1, 16, lambda x: x < 6, afford=lambda load: False)
    assert order == [1, 16] and brackets(keys) == [(1, 16)]


@settings(max_examples=200, deadline=None)
@given(lo=st.integers(1, 40), span=st.integers(1, 300), cuts=st.lists(st.integers(1, 400), max_size=4))
def test_every_change_ends_bracketed_within_2x_and_every_load_is_inside(lo, span, cuts):
    hi = lo + span
    def decide(x: int) -> int:
        return sum(x > c for c in cuts)

    order, keys = _run(lo, hi, decide)
    assert order[:2] == [lo, hi] and len(order) == len(set(order))
    assert all(lo <= x <= hi for x in order)
    assert all(b <= 2 * a for a, b in brackets(keys))  # located
    assert all(x & (x - 1) == 0 for x in order[2:])  # bisection points are powers of two
    assert next_load(keys) is None
    # every true change inside the range sits in a reported bracket
    for c in cuts:
        if lo <= c < hi:
            assert any(a <= c < b for a, b in brackets(keys))


def test_point_cost_interpolates_in_log_scale():
    assert point_cost(4, {}) is None
    assert point_cost(4, {1: 100.0, 16: 25.0}) == pytest.approx(50.0)  # geometric midpoint
    assert point_cost(4, {16: 30.0}) == pytest.approx(60.0)  # below every measured load: √(16/4)× dearer
    assert point_cost(32, {16: 30.0}) == 30.0 and point_cost(16, {16: 30.0}) == 30.0


def test_loads_parse_as_a_list_or_a_range():
    assert parse_loads("1,4") == [1, 4] and not is_load_range("1,4")
    assert parse_loads("1..16", allow_range=True) == [1, 16] and is_load_range("1..16")
    for bad in ("16..1", "1..", "1..2..4", "0..4", "a..b"):
        with pytest.raises(SpecLedgerError, match="range to bisect"):
            parse_loads(bad, allow_range=True)
    with pytest.raises(SpecLedgerError):
        parse_loads("1..16")  # a range only where the caller bisects
    assert range_loads(1, 16, [4, 32]) == [1, 4, 16]


# ------------------------------------------------------------------------------- the main job bisects
@pytest.fixture()
def workload(tmp_path):
    import json

    path = tmp_path / "w.jsonl"
    lines = [{"id": "a", "prompt": "abcabcabcabc def", "category": "copy"},
             {"id": "b", "prompt": "hello hello hello", "category": "chat"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def _loads_in(out) -> list[int]:
    from specledger.records import load_records
    from specledger.rundir import read_records

    return sorted({int(r.extra["load"]) for r in load_records(read_records(out / "traces.jsonl"))})


def test_run_bisects_a_load_range_where_the_decision_changes(tmp_path, target, workload, monkeypatch):
    from specledger.mainjob import measured_loads
    from specledger.mainjob.job import RunPlan, run
    from tests.conftest import char_engine

    # the decisions (stand-in): speculation pays up to 2, not from 3: 1..8 measures 1, 8, then 2, then 4
    monkeypatch.setattr(measured_loads, "measured_keys",
                        lambda rd, slo=None: {1: "on", **{x: x <= 2 for x in _loads_in(rd.path)}})
    plan = RunPlan(drafters=["ngram"], gammas=[2], max_tokens=6, workload_file=str(workload), loads=[1, 8],
                   locate_loads=True)
    out = tmp_path / "run"
    run(out, plan, char_engine(target))
    assert _loads_in(out) == [2, 4, 8]
    # resumed: nothing measured again, the same loads
    size = (out / "traces.jsonl").stat().st_size
    run(out, plan, char_engine(target), resume=True)
    assert (out / "traces.jsonl").stat().st_size == size and _loads_in(out) == [2, 4, 8]


def test_run_bisects_no_further_than_the_budget_allows(tmp_path, target, workload, monkeypatch):
    from specledger.mainjob import measured_loads
    from specledger.mainjob.job import RunPlan, run
    from tests.conftest import char_engine

    monkeypatch.setattr(measured_loads, "measured_keys",
                        lambda rd, slo=None: {1: "on", **{x: x <= 2 for x in _loads_in(rd.path)}})
    monkeypatch.setattr("specledger.load_bisect.point_cost", lambda load, costs: 1e6)  # every extra point too dear
    plan = RunPlan(drafters=["ngram"], gammas=[2], max_tokens=6, workload_file=str(workload), loads=[1, 8],
                   locate_loads=True, budget_s=1e5)
    run(tmp_path / "run", plan, char_engine(target))
    assert _loads_in(tmp_path / "run") == [8]  # the ends only


def test_run_decides_at_every_load_of_a_range_on_a_tiny_model(tmp_path, target, workload):
    from specledger.mainjob.job import RunPlan, run
    from specledger.mainjob.measured_loads import measured_keys
    from specledger.rundir import RunDir
    from tests.conftest import char_engine

    plan = RunPlan(drafters=["ngram"], gammas=[2], max_tokens=6, workload_file=str(workload), loads=[1, 4],
                   locate_loads=True)
    run(tmp_path / "run", plan, char_engine(target))
    keys = measured_keys(RunDir(tmp_path / "run"))
    assert set(keys) == {1, *_loads_in(tmp_path / "run")} and 4 in keys
    assert next_load(keys) is None  # whatever it decided, every change is bracketed within 2×


# ------------------------------------------------------------------------------------ the probe bisects
def test_probe_bisects_where_s_crosses_1_per_category(monkeypatch):
    from specledger.probe import endpoint_loads
    from specledger.probe.loadgen import LoadConfig, PromptItem, RequestResult

    items = [PromptItem(prompt="a", id="a"), PromptItem(prompt="b", id="b")]
    calls: list[tuple[int, str]] = []

    def fake(url, config, items_, metrics=True, tokenizer=None):
        load = config.concurrency
        calls.append((load, url))
        # the probed endpoint: 10 tok/s at loads <= 4 for category x, <= 1 for y; plain always 8 tok/s
        results = []
        for i, it in enumerate(items_):
            fast = load <= (4 if it.id == "a" else 1)
            rate = (10.0 if fast else 6.0) if url == "probe" else 8.0
            results.append(RequestResult(index=i, ok=True, start_s=0.0, end_s=10.0 / rate, completion_tokens=10,
                                         prompt_id=it.id))
        return {"summary": {}, "url": url}, results

    monkeypatch.setattr(endpoint_loads, "probe_endpoint_results", fake)
    monkeypatch.setattr(endpoint_loads, "speedup", lambda a, b: {})
    cfg = LoadConfig(base_url="", model="", concurrency=1, num_requests=2)
    points = endpoint_loads.run_probe_loads("probe", cfg, items, [1, 32], baseline="plain", locate=True,
                                            categories={"a": "x", "b": "y"})
    measured = [p.load for p in points]
    assert measured == sorted(measured) and measured[0] == 1 and measured[-1] == 32
    keys = endpoint_loads.speedup_keys(points, {"a": "x", "b": "y"})
    assert brackets(keys) == [(1, 2), (4, 8)]  # y stops paying above 1, x above 4: both located within 2×
    assert [load for load, url in calls if url == "probe"] == [1, 32, 4, 8, 2]  # the widest bracket first
    assert endpoint_loads.category_speedups(points[0], {"a": "x", "b": "y"}) == {"x": 1.25, "y": 1.25}
    # a comma list measures what it names, nothing more
    calls.clear()
    points = endpoint_loads.run_probe_loads("probe", cfg, items, [1, 32], baseline="plain")
    assert [p.load for p in points] == [1, 32] and len(calls) == 4


def test_the_report_marks_each_crossover_on_s_vs_load():
    from specledger.report.category_plots import crossover_marks
    from specledger.report.summary_model import Summary

    def v(load, decision):
        return {"category": "code", "temperature": 0.0, "load": load, "decision": decision, "drafter": "ngram",
                "gamma": 2}

    summary = {"verdicts": [v(1, "deploy"), v(2, "deploy"), v(4, "deploy"), v(8, "off"), v(16, "off")]}
    shapes, notes = crossover_marks(Summary.read(summary), ("code", 0.0))
    band, line = shapes
    assert (band["type"], band["x0"], band["x1"]) == ("rect", 4, 8) and line["x0"] == 5  # configs switch at 5
    assert [n["text"] for n in notes] == ["crossover 4–8"]
    summary = {"verdicts": [v(1, "deploy"), v(16, "off")]}
    assert crossover_marks(Summary.read(summary), ("code", 0.0))[1][0]["text"] == \
        "crossover 1–16 (not located within 2×)"
    assert crossover_marks(Summary.read({"verdicts": [v(1, "off"), v(16, "off")]}), ("code", 0.0)) == ([], [])


def test_decision_keys_change_with_the_decision_or_s_against_1():
    from specledger.gates.load_verdicts import decision_keys

    def v(load, decision, s, category="code", **kw):
        return {"category": category, "temperature": 0.0, "load": load, "decision": decision, "drafter": "ngram",
                "gamma": 2, "speedup": s, "simulated": False, **kw}

    keys = decision_keys([v(1, "deploy", 1.3), v(2, "deploy", 1.2), v(4, "open", 1.1), v(8, "open", 0.9),
                          v(16, "off", 0.8), v(16, "control", 1.5, category="random"),
                          v(64, "off", 0.5, simulated=True)])
    assert sorted(keys) == [1, 2, 4, 8, 16]  # simulated loads are not bisected
    assert keys[1] == keys[2] and keys[2] != keys[4] and keys[4] != keys[8] and keys[8] != keys[16]
    assert brackets(keys) == [(2, 4), (4, 8), (8, 16)]


def test_probe_cli_takes_a_load_range(tmp_path):
    import json

    from typer.testing import CliRunner

    from specledger.cli import app as cli_app
    from tests.fake_server import FakeServer, FakeServerConfig

    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p, "category": "chat"}) + "\n"
                          for i, p in enumerate(["a b c", "d e f"])))
    with FakeServer(FakeServerConfig(delays_s=(0.001,))) as spec:
        res = CliRunner().invoke(cli_app, ["probe", spec.url, "--workload", str(wl), "--requests", "2",
                                           "--max-tokens", "6", "--loads", "1..8", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [p["load"] for p in doc["loads"]] == [1, 8]  # no baseline: S unknown everywhere, nothing to bisect
    bad = CliRunner().invoke(cli_app, ["probe", "http://127.0.0.1:9", "--loads", "8..1"])
    assert "range to bisect" in str(bad.exception)
