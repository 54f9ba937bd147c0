"""The main job on a tiny model: plan, traces flushed per request, resume after Ctrl-C, report."""

from __future__ import annotations

import json

import pytest

from specledger.errors import SpecLedgerError
from specledger.mainjob.job import RunPlan, plan_jobs, run
from specledger.report.build import build_report
from specledger.rundir import read_records
from tests.conftest import char_engine, tiny_model


@pytest.fixture()
def engine(target):
    return char_engine(target)


@pytest.fixture()
def workload(tmp_path):
    path = tmp_path / "w.jsonl"
    lines = [
        {"id": "a", "prompt": "abcabcabcabc def", "category": "copy"},
        {"id": "b", "messages": [{"role": "user", "content": "hello hello hello"}], "category": "chat"},
        {"id": "c", "prompt": "xyz", "category": "copy", "colour": "red"},  # an unknown field: a warning
    ]
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def _plan(workload) -> RunPlan:
    return RunPlan(drafters=["ngram", "suffix"], gammas=[2, 4], temperatures=[0.0], max_tokens=12,
                   workload_file=str(workload))


def test_run_resume_and_report(tmp_path, engine, workload):
    out = tmp_path / "run"
    plan = _plan(workload)
    calls = []

    def interrupt_after_one_prompt(done, total, label):  # a prompt's 5 settings run side by side
        calls.append(done)
        if done == 5 and label != "done":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(out, plan, engine, progress=interrupt_after_one_prompt)
    assert len(list(read_records(out / "traces.jsonl"))) == 5  # every finished prompt's requests kept
    meta = json.loads((out / "run.json").read_text())
    assert meta["workload_warnings"] and "line 3" in meta["workload_warnings"][0]
    assert "colour" in meta["workload_warnings"][0]

    with pytest.raises(SpecLedgerError, match="--resume"):
        run(out, plan, engine)
    engine.dtype, kept = "gguf:q4_1", engine.dtype  # other weights: resuming would mix two targets' records
    with pytest.raises(SpecLedgerError, match="--dtype it started with"):
        run(out, plan, engine, resume=True)
    engine.dtype = kept
    run(out, plan, engine, resume=True)
    records = list(read_records(out / "traces.jsonl"))
    jobs = plan_jobs(["a", "b", "c"], plan)
    assert len(records) == len(jobs) == 15
    assert len({r.request_id for r in records}) == 15
    plain = {r.prompt_id: r.token_ids for r in records if r.drafter == "none"}
    for r in records:  # greedy: every setting reproduces plain decoding
        assert r.token_ids == plain[r.prompt_id]
        assert r.category in ("copy", "chat")

    summary, html = build_report(out, n_resamples=50)
    assert html.exists() and (out / "summary.json").exists()
    assert {s["gates"]["correctness"]["status"] for s in summary["scenarios"]} == {"pass"}
    assert summary["verdicts"]
    (mix,) = summary["mix"]  # no --mix: the workload's own shares of requests, 2 copy lines and 1 chat
    assert mix["weights"] == pytest.approx({"chat": 1 / 3, "copy": 2 / 3}) and mix["category"] == "all traffic"


def test_run_rejects_bad_plans(tmp_path, engine, workload):
    with pytest.raises(SpecLedgerError, match="unknown drafter"):
        run(tmp_path / "x", RunPlan(drafters=["nope"], workload_file=str(workload)), engine)
    with pytest.raises(SpecLedgerError, match="gammas"):
        run(tmp_path / "x", RunPlan(gammas=[0], workload_file=str(workload)), engine)


def test_resume_repairs_a_torn_last_record(tmp_path, engine, workload):
    """An interruption mid-write leaves an unterminated line: resume removes it (and says so), re-runs
    that request, and the directory stays readable through any number of resumes."""
    import warnings

    from specledger.errors import SpecLedgerWarning

    out = tmp_path / "run"
    plan = _plan(workload)

    def interrupt_after_one_prompt(done, total, label):
        if done == 5 and label != "done":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(out, plan, engine, progress=interrupt_after_one_prompt)
    trace = out / "traces.jsonl"
    complete = trace.read_bytes()
    fifth = complete.splitlines(keepends=True)[-1]
    trace.write_bytes(complete + fifth[: len(fifth) // 2])  # a sixth request's write, cut
    with pytest.warns(SpecLedgerWarning, match=r"removed the torn last line \(\d+ bytes\)"):
        run(out, plan, engine, resume=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn line left
        records = list(read_records(trace))
        assert len(records) == len({r.request_id for r in records}) == 15
        run(out, plan, engine, resume=True)  # nothing left to do, nothing to repair
        assert len(list(read_records(trace))) == 15
    build_report(out, n_resamples=20)


def test_per_category_budgets_replay_and_report(tmp_path, engine, workload):
    """A category with its own output budget (code and math get room for an answer): every request records its
    budget, the forecast replays each prompt at its own budget, and the report builds (make run crashed here)."""
    out = tmp_path / "budgets"
    plan = _plan(workload)
    plan.category_max_tokens = {"chat": 20}
    plan.mix = {"copy": 0.25, "chat": 0.75}  # --mix: the one recommendation weighs the traffic the user gives
    run(out, plan, engine)
    meta = json.loads((out / "run.json").read_text())
    assert meta["traffic_mix"] == plan.mix and meta["traffic_counts"] == {"copy": 2, "chat": 1}
    records = list(read_records(out / "traces.jsonl"))
    assert {r.extra["max_tokens"] for r in records if r.category == "chat"} == {20}
    assert {r.extra["max_tokens"] for r in records if r.category == "copy"} == {12}
    summary, _ = build_report(out, n_resamples=20)
    assert summary["optimal_gamma"] and summary["prediction_check"]
    assert [m["weights"] for m in summary["mix"]] == [{"chat": 0.75, "copy": 0.25}]


def test_resume_of_a_run_stopped_before_its_plan_says_start_again_with_out(tmp_path, capsys):
    """A kill before run.json exists leaves a folder --resume cannot continue: the one-line error says to start
    again with --out (the hint printed at start-up would otherwise send the user in a circle)."""
    from tests.conftest import run_cli

    stopped = tmp_path / "stopped"
    stopped.mkdir()
    code, out, err = run_cli(["run", "--resume", str(stopped)], capsys)
    assert code == 2 and "Traceback" not in out + err
    assert f"start it again with --out {stopped}" in " ".join((out + err).split())


def test_a_category_spanning_context_buckets_is_decided_per_bucket(tmp_path):
    """Prompts under 1k and over 1k tokens (one character a token) of one category: two decisions, each with its
    context_bucket; a category in one bucket keeps its name; greedy outputs still equal plain."""
    engine = char_engine(tiny_model(2, max_seq_len=2048), max_context=2048)
    path = tmp_path / "long.jsonl"
    doc = "the cat sat on the mat. " * 60  # 1,440 characters
    lines = [{"id": f"s{i}", "prompt": doc[: 200 + 40 * i] + f" q{i}", "category": "doc"} for i in range(2)]
    lines += [{"id": f"l{i}", "prompt": doc[: 1200 + 40 * i] + f" q{i}", "category": "doc"} for i in range(2)]
    lines += [{"id": "c", "prompt": "hello hello", "category": "chat"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "run"
    plan = RunPlan(drafters=["ngram"], gammas=[2], temperatures=[0.0], max_tokens=8, workload_file=str(path))
    run(out, plan, engine)
    records = list(read_records(out / "traces.jsonl"))
    assert {r.category for r in records} == {"doc@<1k", "doc@1-2k", "chat"}
    plain = {r.prompt_id: r.token_ids for r in records if r.drafter == "none"}
    assert all(r.token_ids == plain[r.prompt_id] for r in records)
    summary, _ = build_report(out, n_resamples=50)
    buckets = {v["category"]: v.get("context_bucket") for v in summary["verdicts"]}
    assert buckets == {"doc@<1k": "<1k", "doc@1-2k": "1-2k", "chat": None}
    (mix,) = summary["mix"]  # the workload's 4 doc lines shared between its two buckets
    assert mix["weights"] == pytest.approx({"chat": 1 / 5, "doc@<1k": 2 / 5, "doc@1-2k": 2 / 5})
    (context,) = summary["context_schedules"]
    assert context["category"] == "doc" and [b["bucket"] for b in context["buckets"]] == ["<1k", "1-2k"]
    # each bucket forecast without any of its own records, from the other bucket and the run's cost surface
    from specledger.predict.context_forecast import leave_one_bucket_out

    check = leave_one_bucket_out(records, json.loads((out / "run.json").read_text()))
    assert {r["category"] for r in check["rows"]} == {"doc@<1k", "doc@1-2k"}
    assert check["n"] == 2 and all(r["predicted_speedup"] > 0 and r["measured_speedup"] > 0 for r in check["rows"])


def test_context_schedule_names_where_speculation_stops_paying():
    from specledger.gates.context_schedule import context_line, context_schedules

    def v(bucket, decision, resolved=True, s=1.2):
        return {"category": f"long@{bucket}", "temperature": 0.0, "load": 1, "decision": decision,
                "setting": "suffix γ=4" if decision == "deploy" else None, "speedup": s, "mean_committed": 2.0,
                "resolved": resolved}

    (entry,) = context_schedules([v("2-4k", "off", s=0.9), v("<1k", "deploy"), v("1-2k", "deploy"),
                                  v("4-8k", "off", s=0.8), {"category": "code", "temperature": 0.0, "load": 1}])
    assert [b["bucket"] for b in entry["buckets"]] == ["<1k", "1-2k", "2-4k", "4-8k"]
    assert entry["stops_at_tokens"] == 2048 and entry["starts_at_tokens"] is None
    assert "2,048+ tokens to a replica without speculation" in entry["engine_note"]
    assert context_line(entry).endswith("stops paying from 2,048 tokens")
    # an open decision on either side of the edge locates nothing
    (entry,) = context_schedules([v("<1k", "deploy"), v("1-2k", "off", resolved=False)])
    assert entry["stops_at_tokens"] is None and entry["engine_note"] is None


def test_initial_seconds_prices_prefill_once_and_every_setting_at_its_context():
    from specledger.mainjob.plan import initial_seconds

    surface = {"points": [{"batch": 1, "rows": r, "context": c, "seconds": s * (1 + 0.5 * (r - 1))}
                          for c, s in ((256, 0.01), (4096, 0.04)) for r in (1, 2, 3)]}
    plan = RunPlan(drafters=["ngram"], gammas=[2, 4], temperatures=[0.0], max_tokens=10)
    # one prompt of 1000 tokens: prefill 1000 x 0.005 s (the marginal row at the shortest context), then plain and
    # two settings, 10 tokens each, at the one-row step nearest its context (256: 0.01 s)
    assert initial_seconds(plan, surface, [("c", 1000)]) == pytest.approx(1000 * 0.005 + 3 * 10 * 0.01)
    assert initial_seconds(plan, surface, [("c", 4000)]) == pytest.approx(4000 * 0.005 + 3 * 10 * 0.04)


def test_a_setting_the_race_dropped_is_neither_chosen_nor_a_rival_unless_every_one_was():
    from specledger.gates.decision import RaceDrop, Verdict
    from specledger.report.summary import race_drops, still_racing, story

    meta = {"race": {"dropped": [{"category": "code", "temperature": 0.0, "label": "ngram γ=2", "after_prompts": 6,
                                  "why": "more than the margin slower than suffix γ=4"},
                                 {"category": "chat", "temperature": 0.0, "label": "ngram γ=2", "after_prompts": 4,
                                  "why": "slower than plain"}]}}
    scenarios = [{"category": c, "temperature": 0.0, "drafter": d, "gamma": g}
                 for c, d, g in (("code", "ngram", 2), ("code", "suffix", 4), ("chat", "ngram", 2))]
    drops = race_drops(meta)
    kept = still_racing(scenarios, drops)
    assert [(s["category"], s["drafter"]) for s in kept] == [("code", "suffix"), ("chat", "ngram")]
    assert story(Verdict("code", 0.0), drops) == [
        RaceDrop("ngram γ=2", 6, "more than the margin slower than suffix γ=4")]
    assert story(Verdict("math", 0.0), drops) is None
