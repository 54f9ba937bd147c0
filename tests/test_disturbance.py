"""Issue 47, "a machine that was disturbed says so": the signals from synthetic /proc samples, the rule, the
re-measure rule, and a run whose first prompt was disturbed: re-measured, its first records kept out of the
figures, and the finding in summary.json, the console answer and the report's first screen."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest

from specledger.mainjob import disturbance as dist
from specledger.mainjob.disturbance import (
    CpuTimes,
    Reading,
    RunWatch,
    Window,
    cpu_window,
    descendants,
    finding_line,
    parse_pid_stat,
    parse_proc_stat,
    plain_step_ratio,
    reasons,
    run_finding,
    step_drift,
    window_finding,
)
from specledger.provenance import PACKAGE_DIR
from specledger.records import RoundRecord

PROC_STAT = """cpu  1000 50 200 5000 30 0 10 5 0 0
cpu0 500 25 100 2500 15 0 5 3 0 0
cpu1 500 25 100 2500 15 0 5 2 0 0
intr 12345
"""


def _reading(wall: float, total: int, busy: int, steal: int = 0, own: dict[int, int] | None = None) -> Reading:
    return Reading(wall, CpuTimes(total, busy, steal), own if own is not None else {1: 0})


def test_proc_stat_and_pid_stat_are_parsed() -> None:
    # user nice system idle iowait irq softirq steal: busy = user + nice + system + irq + softirq
    assert parse_proc_stat(PROC_STAT) == CpuTimes(total=6295, busy=1260, steal=5)
    line = "4242 (python -c (x) y) R 17 4242 1 0 -1 4194304 99 0 0 0 250 30 7 3 20 0 3 0 1069 3133440 372"
    assert parse_pid_stat(line) == (17, 280)  # parent, utime + stime (children's times not counted)
    with pytest.raises(ValueError):
        parse_proc_stat("intr 1\n")


def test_other_cores_are_the_machine_busy_time_less_ours() -> None:
    a = _reading(0.0, 10_000, 4_000, 10, {7: 100})
    b = _reading(1.0, 10_200, 4_150, 12, {7: 150, 8: 20})  # pid 8 started inside the window: counts from 0
    w = cpu_window(a, b, cpus=2)
    assert w.seconds == 1.0
    assert w.other_cores == pytest.approx((150 - 50 - 20) / 200 * 2)  # 0.8 of a core
    assert w.steal_cores == pytest.approx(2 / 200 * 2)
    quiet = cpu_window(a, _reading(1.0, 10_200, 4_060, 10, {7: 170}), cpus=2)  # ours exceed busy: never < 0
    assert quiet.other_cores == 0.0


def test_the_rule() -> None:
    assert reasons(Window(1.0, 0.05, 0.0)) == []
    assert reasons(Window(1.0, 0.08, 0.03)) == ["other processes 0.08 cores + steal 0.03"]  # 0.11 > 0.1
    assert reasons(Window(1.0, 0.0, 0.0, step_drift=1.6)) == ["plain steps 1.60x the run's own"]
    assert reasons(Window(1.0, 0.0, 0.0, step_drift=1.4)) == []
    assert reasons(Window(0.3, 1.0, 0.0, step_drift=3.0)) == []  # too short to judge (10 ms ticks)
    entry = Window(2.0, 0.9, 0.0, 2.0).to_dict()
    assert entry["disturbed"] and len(entry["reasons"]) == 2 and entry["window_s"] == 2.0


def _round(t_verify: float, context: int, truncated: bool = False) -> RoundRecord:
    return RoundRecord("none", 0, 0, 0, 1, truncated, 0.0, t_verify, 0.0, context)


def test_plain_step_drift_is_scaled_by_context_and_judged_against_the_run() -> None:
    def price(context: int) -> float:  # a step costs more at a longer context
        return 0.008 + 1e-5 * context

    rounds = [_round(2 * price(c), c) for c in (100, 101, 102, 103)] + [_round(9.0, 104, truncated=True)]
    assert plain_step_ratio(rounds, price) == pytest.approx(2.0)
    assert plain_step_ratio(rounds[:3], price) is None  # fewer than MIN_DRIFT_STEPS full steps
    assert step_drift(2.0, [1.0] * 4) is None  # fewer than MIN_DRIFT_PROMPTS earlier prompts
    assert step_drift(2.0, [1.0, 0.9, 1.1, 1.0, 1.2]) == pytest.approx(2.0)


def test_descendants_follow_the_process_tree() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 11, 20: 1, 21: 20}
    assert descendants({10}, parents) == {10, 11, 12}
    assert descendants({10, 21}, parents) == {10, 11, 12, 21}


class FakeMachine:
    """Readings of a 2-CPU machine: each call one more second; ``busy`` other cores during the windows that end
    at the calls listed in ``disturbed_at`` (1-based), none otherwise."""

    def __init__(self, disturbed_at: set[int], busy: float = 1.0) -> None:
        self.calls, self.disturbed_at, self.busy = 0, disturbed_at, busy
        self.total = self.other = 0

    def __call__(self) -> Reading:
        self.calls += 1
        if self.calls > 1:
            self.total += 200
            self.other += int(100 * self.busy) if self.calls in self.disturbed_at else 0
        return _reading(float(self.calls), self.total, self.other)


def _group(watch: RunWatch, second: bool = False) -> dict:
    return watch.judge(watch.start(), [], second=second)


def test_a_disturbed_prompt_is_remeasured_unless_the_disturbance_lasts() -> None:
    machine = FakeMachine(disturbed_at={2, 4, 6, 8, 10})
    watch = RunWatch(cpus=2, reader=machine, on=True)
    first = _group(watch)  # calls 1-2: disturbed
    assert first["disturbed"] and first["other_cores"] == pytest.approx(1.0) and watch.remeasure(first)
    again = _group(watch, second=True)  # calls 3-4: disturbed again: a lasting disturbance
    assert again["disturbed"] and again["remeasure"] == 1
    assert not watch.remeasure(_group(watch))  # calls 5-6: kept, marked
    quiet = RunWatch(cpus=2, reader=FakeMachine(disturbed_at=set()), on=True)
    assert not quiet.remeasure(_group(quiet))
    assert not RunWatch(on=False).start()  # off: nothing read, nothing judged


def test_remeasures_are_capped_at_a_share_of_the_prompts() -> None:
    disturbed_first = {2 + 4 * k for k in range(20)}  # every prompt's first window, never its re-measure
    watch = RunWatch(cpus=2, reader=FakeMachine(disturbed_first), on=True)
    allowed = []
    for _ in range(10):
        allowed.append(watch.remeasure(_group(watch)))
        if allowed[-1]:
            assert not _group(watch, second=True)["disturbed"]
        else:
            watch.start(), watch.start()  # keep the fake machine's calls aligned
    assert sum(allowed) == 2 and allowed[0]  # 20 % of 10 prompts (the first one always)


def _rec(prompt_id: str, entry: dict, experiment: str = "") -> SimpleNamespace:
    extra = {"disturbance": entry, **({"experiment": experiment} if experiment else {})}
    return SimpleNamespace(prompt_id=prompt_id, temperature=0.0, extra=extra)


def test_the_run_finding_counts_prompts_as_first_measured() -> None:
    loud, calm = Window(2.0, 1.0, 0.0).to_dict(), Window(2.0, 0.02, 0.0, 1.05).to_dict()
    records = [_rec("a", {**loud, "window": 1, "remeasure": 0}, "disturbed"),
               _rec("a", {**loud, "window": 1, "remeasure": 0}, "disturbed"),  # one group: one window
               _rec("a", {**calm, "window": 2, "remeasure": 1}), _rec("b", {**calm, "window": 3, "remeasure": 0}),
               _rec("c", {**loud, "window": 4, "remeasure": 0}),
               SimpleNamespace(prompt_id="d", temperature=0.0, extra={})]
    f = run_finding(records)
    assert (f["windows"], f["judged"], f["disturbed"], f["remeasured"], f["remeasured_quiet"]) == (3, 3, 2, 1, 1)
    assert f["fraction"] == pytest.approx(2 / 3, abs=1e-4) and f["other_cores"]["max"] == 1.0
    assert f["thresholds"]["other_cores"] == dist.OTHER_CORES_LIMIT and "steal" in f["rule"]
    assert f["line"].startswith("machine DISTURBED during 2 of 3 prompts (67 %)")
    assert "1 re-measured (1 quiet the second time), 1 kept measured while disturbed" in f["line"]
    assert run_finding([SimpleNamespace(prompt_id="x", temperature=0.0, extra={})]) is None


def test_finding_lines() -> None:
    quiet = window_finding([Window(1.0, 0.01, 0.0).to_dict()] * 3, "second", dist.PROBE_RULE)
    assert finding_line(quiet).startswith("machine: quiet while measuring (other processes up to 0.01 cores")
    short = window_finding([Window(0.1, 1.0, 0.0).to_dict()], "prompt", dist.REMEASURE_RULE)
    assert short["judged"] == 0 and short["line"].startswith("machine: not judged")
    loud = window_finding([Window(1.0, 1.0, 0.2).to_dict(), Window(1.0, 0.0, 0.0).to_dict()], "second", "")
    assert loud["line"].startswith("machine DISTURBED during 1 of 2 seconds (50 %)") and "steal up to 0.20" in loud[
        "line"]


def test_suffix_rewinds_its_cross_request_state() -> None:
    from specledger.engine.drafters.suffix import SuffixDrafter

    d = SuffixDrafter(global_window=2)
    d.end([1], [5, 6, 7, 8])
    d.end([1], [6, 7, 9, 9])
    saved, seen = d.checkpoint(), d.global_sequences()
    d.end([1], [1, 2, 3, 4])  # a window of 2: the oldest entry is evicted
    assert d.global_sequences() != seen
    d.rewind(saved)
    assert d.global_sequences() == seen
    fresh = SuffixDrafter(global_window=2)
    for out in seen:
        fresh.end([1], out)
    assert repr(_trie(d.global_trie)) == repr(_trie(fresh.global_trie))


def _trie(node) -> dict:
    best = node.best.token if node.best is not None else None
    return {tok: (child.count, child.continued, best, _trie(child)) for tok, child in sorted((node.children or
                                                                                              {}).items())}


def test_a_disturbed_prompt_of_a_run_is_remeasured_and_said(tmp_path, target) -> None:
    """The fast run of tests/test_run.py with a machine disturbed while the first prompt ran: it runs once more,
    its first records stay in the trace under experiment 'disturbed', and the finding reaches summary.json,
    the console answer's first lines and the report's first screen."""
    from specledger.mainjob.job import RunPlan, run
    from specledger.report.build import build_report
    from specledger.report.console import answer_lines
    from specledger.rundir import read_records
    from tests.conftest import char_engine

    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": pid, "prompt": text, "category": "copy"}) + "\n"
                                for pid, text in (("a", "abcabcabcabc def"), ("b", "hello hello hello"))))
    plan = RunPlan(drafters=["ngram", "suffix"], gammas=[2], temperatures=[0.0], max_tokens=12,
                   workload_file=str(workload))
    out = tmp_path / "run"
    run(out, plan, char_engine(target), watch=RunWatch(cpus=2, reader=FakeMachine(disturbed_at={2}), on=True))
    records = list(read_records(out / "traces.jsonl"))
    first = [r for r in records if r.extra.get("experiment") == "disturbed"]
    kept = [r for r in records if not r.extra.get("experiment")]
    assert len(first) == 3 and {r.prompt_id for r in first} == {"a"} and len(kept) == 6
    assert all(r.extra["disturbance"]["disturbed"] for r in first)
    assert not any(r.extra["disturbance"]["disturbed"] for r in kept)
    plain = {r.prompt_id: r.token_ids for r in kept if r.drafter == "none"}
    assert all(r.token_ids == plain[r.prompt_id] for r in first + kept)  # the same outputs, measured again

    summary, html = build_report(out, n_resamples=20)
    found = summary["disturbance"]
    assert (found["unit"], found["windows"], found["disturbed"], found["remeasured"], found["remeasured_quiet"]) == (
        "prompt", 2, 1, 1, 1)
    assert summary["requests"] == 6 and summary["experiment_requests"] == 3  # kept out of every figure
    written = json.loads((out / "summary.json").read_text())
    assert written["disturbance"]["line"] == found["line"]
    schema = json.loads((PACKAGE_DIR / "schemas" / "summary.schema.json").read_text())
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(written)]
    lines = answer_lines(summary)
    assert lines[1] == found["line"] and lines[1].startswith("machine DISTURBED during 1 of 2 prompts")
    assert 'id="disturbance"' in html.read_text() and "machine DISTURBED" in html.read_text()


def test_probe_reads_the_machine_while_it_loads_and_says_what_it_found(tmp_path, monkeypatch) -> None:
    """``probe --baseline --loads --out``: the seconds read while it ran go into run.json, summary.json, the
    answer's first lines and the report (readings every 50 ms here, each judged)."""
    from typer.testing import CliRunner

    from specledger.cli import app as cli_app
    from tests.fake_server import FakeServer, FakeServerConfig

    monkeypatch.delenv(dist.SWITCH, raising=False)
    monkeypatch.setattr(dist, "PROBE_INTERVAL_S", 0.05)
    monkeypatch.setattr(dist, "MIN_WINDOW_S", 0.0)
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"story {i}", "category": "chat"}) + "\n"
                                for i in range(3)))
    out = tmp_path / "probe"
    with FakeServer(FakeServerConfig(delays_s=(0.01,))) as spec, FakeServer(FakeServerConfig(delays_s=(0.01,))) as base:
        res = CliRunner().invoke(cli_app, ["probe", spec.url, "--baseline", base.url, "--loads", "1", "--out", str(out),
                                           "--workload", str(workload), "--requests", "3", "--max-tokens", "8"])
    assert res.exit_code == 0, res.output
    found = json.loads((out / "summary.json").read_text())["disturbance"]
    assert found["unit"] == "second" and found["judged"] >= 1 and found["handling"] == dist.PROBE_RULE
    assert json.loads((out / "run.json").read_text())["disturbance"]["line"] == found["line"]
    assert found["line"] in res.output.splitlines()[:3]
    assert 'id="disturbance"' in (out / "report.html").read_text()
