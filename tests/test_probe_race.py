"""``specledger probe ... --budget``: the probe decides with ``run``'s rule over prompts drawn from every category,
races within the budget (more prompts where a decision is open, configurations dropped when out, a dropped
launched configuration never started again), resumes from what finished, prints run's answer in a few lines,
and recommends one setting for the traffic as a whole (:mod:`specledger.gates.mix`)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specledger.analysis.paired import ratio_interval, stratified_ratio
from specledger.cli import app as cli_app
from specledger.errors import SpecLedgerError
from specledger.gates.mix import mix_decisions, mix_weights, parse_mix
from specledger.probe.launch_race import RaceState, estimate_s, first_round, next_round, survivors
from specledger.probe.workload import workload_from_jsonl
from tests.fake_server import FakeServer, FakeServerConfig

ROOT = Path(__file__).resolve().parents[1]
SERVER = f"{shlex.quote(sys.executable)} -m tests.launchable_server --port {{port}} {{spec}}"
CATS = ("code", "chat", "math")


@pytest.fixture()
def workload(tmp_path: Path) -> Path:
    """3 categories x 6 chat prompts, written one category after the other (as a user's file often is)."""
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"{c}{i}", "category": c,
                                        "messages": [{"role": "user", "content": f"{c} question {i}"}]}) + "\n"
                            for c in CATS for i in range(6)))
    return path


# ----------------------------------------------------------------------------------------- drawing
def test_prompts_are_interleaved_so_any_prefix_spans_every_category(workload: Path) -> None:
    w = workload_from_jsonl(workload)
    assert [w.category_of(it.id) for it in w.items[:6]] == list(CATS) * 2  # not the file's first 6 lines (code)
    assert w.categories() == list(CATS) and w.counts() == {c: 6 for c in CATS}
    assert w.pool()["chat"] == [f"chat{i}" for i in range(6)]
    plan = first_round(w, ["off", "ngram"], 2)
    assert plan["off"] == plan["ngram"] == ["code0", "chat0", "math0", "code1", "chat1", "math1"]


def test_the_next_round_runs_only_contenders_and_drops_the_rest_for_good(workload: Path) -> None:
    w = workload_from_jsonl(workload)
    state = RaceState(rounds=[first_round(w, ["off", "a", "b"], 2)])
    name_of = {"a γ=2": "a", "b γ=4": "b"}
    decisions = [
        {"category": "code", "temperature": 0.0, "resolved": False, "decision": "off", "contenders": ["a γ=2"],
         "needs_plain": True},
        {"category": "chat", "temperature": 0.0, "resolved": False, "decision": "deploy",
         "contenders": ["a γ=2", "b γ=4"], "needs_plain": False},
        {"category": "math", "temperature": 0.0, "resolved": True, "decision": "deploy", "contenders": []},
    ]
    nxt = next_round(decisions, state, w, "off", name_of, step=2, max_per_category=48)
    assert nxt == {"off": ["code2", "code3"], "a": ["code2", "chat2", "code3", "chat3"], "b": ["chat2", "chat3"]}
    assert state.dropped["code"] == {"b"}
    state.rounds.append(nxt)
    again = [{**decisions[0], "contenders": ["a γ=2", "b γ=4"]}]  # b is back in the rule's contenders: not run
    assert next_round(again, state, w, "off", name_of, 2, 48) == {"off": ["code4", "code5"], "a": ["code4", "code5"]}
    assert next_round(again, state, w, "off", name_of, 2, 4) == {}  # the category's cap reached
    assert survivors(decisions, name_of, "off") == ["off", "a", "b"]


def test_the_round_estimate_counts_start_up_and_seconds_per_prompt() -> None:
    assert estimate_s({"off": ["p"]}, RaceState()) == 0.0  # nothing measured yet: nothing to go by


# ------------------------------------------------------------------------------------------ the mix
def test_a_mix_is_parsed_normalised_and_checked() -> None:
    assert parse_mix("code=1,agent=3") == {"code": 0.25, "agent": 0.75}
    assert parse_mix(None) is None
    for bad in ("code", "code=x", "code=-1", "code=0"):
        with pytest.raises(SpecLedgerError):
            parse_mix(bad)
    assert mix_weights(["code", "chat", "random"]) == {"code": 0.5, "chat": 0.5}
    assert mix_weights(["code", "chat"], counts={"code": 3, "chat": 1}) == {"code": 0.75, "chat": 0.25}
    with pytest.raises(SpecLedgerError, match="not measured"):
        mix_weights(["code"], given={"agent": 1.0})


def test_one_stratum_is_the_plain_ratio_estimator() -> None:
    xs = [[3.0, 4.0, 5.0], [1.0, 1.5, 2.2], [2.0, 2.0, 3.0], [1.1, 1.4, 2.0]]
    one = stratified_ratio([(1.0, xs)], (1, -1, -1, 1))
    plain = ratio_interval([(xs[0], 1), (xs[1], -1), (xs[2], -1), (xs[3], 1)])
    assert one.ratio == pytest.approx(plain.ratio) and one.lo == pytest.approx(plain.lo)
    assert one.hi == pytest.approx(plain.hi) and one.n == 3


def _scenario(cat: str, drafter: str, gamma: int, speed: float, n: int = 8) -> dict:
    """A load-1 scenario whose setting is ``speed`` times plain on every prompt (plus a little noise)."""
    prompts = [f"{cat}{i}" for i in range(n)]
    base_s = [1.0 + 0.1 * i for i in range(n)]
    secs = [b / speed * (1 + 0.01 * (-1) ** i) for i, b in enumerate(base_s)]
    gates = {g: {"status": "pass", "evidence": ""} for g in ("correctness", "quality", "latency", "capacity")}
    pp = {"prompts": prompts, "tokens": [50.0] * n, "seconds": secs, "base_tokens": [50.0] * n,
          "base_seconds": base_s, "own": {"prompts": prompts, "tokens": [50.0] * n, "seconds": secs}}
    return {"category": cat, "temperature": 0.0, "drafter": drafter, "gamma": gamma, "label": f"{drafter} γ={gamma}",
            "speedup": speed, "speedup_ci": [speed * 0.9, speed * 1.1], "paired_prompts": n, "per_prompt": pp,
            "gates": gates, "totals": {"requests": n, "tokens": 50.0 * n}, "rounds": {}}


def test_the_mix_is_weighted_by_category_share_and_decided_by_the_same_rule() -> None:
    scenarios = [_scenario("code", "ngram", 2, 2.0), _scenario("chat", "ngram", 2, 0.8),
                 _scenario("code", "suffix", 4, 1.5), _scenario("chat", "suffix", 4, 1.05)]
    (mostly_code,) = mix_decisions(scenarios, given={"code": 0.9, "chat": 0.1})
    assert mostly_code["category"] == "all traffic" and mostly_code["resolved"]
    assert mostly_code["decision"] == "deploy" and mostly_code["setting"] == "ngram γ=2"
    assert "beats every other setting, paired" in mostly_code["headline"]  # run's wording
    (mostly_chat,) = mix_decisions(scenarios, given={"code": 0.1, "chat": 0.9})
    assert mostly_chat["setting"] == "suffix γ=4" and mostly_chat["weights"] == {"chat": 0.9, "code": 0.1}
    # the mix's S is the ratio of share-weighted per-request totals, not a mean of the categories' S
    (even,) = mix_decisions(scenarios)
    ngram = next(s for s in even["settings"] if s["setting"] == "ngram γ=2")
    assert 0.8 < ngram["speedup"] < 2.0 and ngram["per_category"] == {"code": 2.0, "chat": 0.8}
    assert mix_decisions(scenarios[:1]) == []  # one category: its own decision is the mix's


# ---------------------------------------------------------------------------------- the whole race
def _race(tmp_path: Path, workload: Path, *extra: str, out: str = "run") -> tuple[object, Path]:
    args = ["probe", "--launch", SERVER, "--spec", "off=", "--spec", "spec=--draft-max 3", "--budget", "60s",
            "--workload", str(workload), "--max-tokens", "12", "--chat", "--requests", "3", "--out",
            str(tmp_path / out), "--launch-timeout", "60", *extra]
    return CliRunner().invoke(cli_app, args, catch_exceptions=True), tmp_path / out


def test_launch_races_every_category_within_the_budget_and_resumes(tmp_path: Path, workload: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    res, out = _race(tmp_path, workload, "--loads", "1,2", "--mix", "code=0.5,chat=0.5")
    assert res.exit_code == 0, (res.output, res.exception)
    summary = json.loads((out / "summary.json").read_text())
    at1 = [v for v in summary["verdicts"] if v["load"] == 1]
    assert sorted(v["category"] for v in at1) == sorted(CATS)  # every category decided, not the file's first
    race = summary["race"]
    assert race["budget_s"] == 60 and race["stopped"] and race["prompts_per_configuration"]["off"] >= 6
    (mix,) = summary["mix"]
    assert mix["weights"] == {"chat": 0.5, "code": 0.5, "math": 0.0} and mix["category"] == "all traffic"
    folder = out / "launch" / "race"
    assert (folder / "r000-off.json").is_file() and (folder / "r000-spec.json").is_file()
    assert (folder / "load2-off.json").is_file() and (folder / "load2-spec.json").is_file()
    rounds = json.loads((folder / "rounds.json").read_text())
    assert rounds[0]["off"] == rounds[0]["spec"] and len(rounds[0]["off"]) == 6
    records = [json.loads(x) for x in (out / "traces.jsonl").read_text().splitlines()]
    assert len({r["request_id"] for r in records}) == len(records)
    lines = res.output.splitlines()
    answer = next(i for i, line in enumerate(lines) if line.startswith("answer at load 1"))
    assert all(any(line.startswith(f"  {c} ") for line in lines[answer:]) for c in CATS)
    assert "one setting for all the traffic" in res.output and "specledger probe --launch" not in res.output
    assert len(lines) <= 40 and lines[-1].startswith("report: ")
    # interrupted after the race: the same command reads every part back and starts no engine
    for name in ("traces.jsonl", "run.json", "summary.json"):
        (out / name).unlink()
    logs = sorted((out / "launch" / "logs").iterdir())
    again, _ = _race(tmp_path, workload, "--loads", "1,2", "--mix", "code=0.5,chat=0.5")
    assert again.exit_code == 0, (again.output, again.exception)
    assert sorted((out / "launch" / "logs").iterdir()) == logs
    assert json.loads((out / "summary.json").read_text())["verdicts"] == summary["verdicts"]


def test_budget_needs_something_to_race_against(tmp_path: Path, workload: Path) -> None:
    res = CliRunner().invoke(cli_app, ["probe", "http://127.0.0.1:9", "--budget", "60s", "--workload",
                                       str(workload)])
    assert isinstance(res.exception, SpecLedgerError) and "--baseline" in str(res.exception)
    res = CliRunner().invoke(cli_app, ["probe", "--launch", SERVER, "--spec", "off=", "--spec", "s=--draft-max 2",
                                       "--out", str(tmp_path / "x"), "--workload", str(workload), "--mix", "nope=1"])
    assert isinstance(res.exception, SpecLedgerError) and "not measured" in str(res.exception)


def test_an_endpoint_and_its_baseline_race_the_same_way(tmp_path: Path, workload: Path) -> None:
    spec_cfg = FakeServerConfig(delays_s=(0.002,), chunk_pattern=(1, 3, 2, 4), response_tokens=12, crlf_every=0)
    base_cfg = FakeServerConfig(delays_s=(0.002,), chunk_pattern=(1,), response_tokens=12, gamma=0, crlf_every=0)
    args = ["--budget", "45s", "--workload", str(workload), "--max-tokens", "12", "--chat",
            "--out", str(tmp_path / "run")]
    with FakeServer(spec_cfg) as spec, FakeServer(base_cfg) as base:
        res = CliRunner().invoke(cli_app, ["probe", spec.url, "--baseline", base.url, *args])
        assert res.exit_code == 0, (res.output, res.exception)
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        served = len(spec.log) + len(base.log)
        for name in ("traces.jsonl", "run.json", "summary.json"):  # interrupted before the report: resumed
            (tmp_path / "run" / name).unlink()
        again = CliRunner().invoke(cli_app, ["probe", spec.url, "--baseline", base.url, *args])
        assert again.exit_code == 0, (again.output, again.exception)
        assert len(spec.log) + len(base.log) == served  # every part read back: no request sent again
    assert sorted(v["category"] for v in summary["verdicts"]) == sorted(CATS)
    assert summary["race"]["prompts_per_configuration"]["baseline"] >= 6
    assert len(res.output.splitlines()) <= 40 and "answer at load 1" in res.output
    assert {r["drafter"] for r in map(json.loads, (tmp_path / "run" / "traces.jsonl").read_text().splitlines())} \
        == {"endpoint", "none"}


def _part(name: str, load: int, seconds: float, workload) -> object:
    """A configuration's part at ``load``: every prompt 10 tokens in ``seconds``."""
    from specledger.probe.endpoint_loads import LoadPoint
    from specledger.probe.engine_command import Spec
    from specledger.probe.launch_runs import SpecRun
    from specledger.probe.loadgen import RequestResult

    results = [RequestResult(index=i, ok=True, start_s=0.0, end_s=seconds, completion_tokens=10, prompt_id=it.id)
               for i, it in enumerate(workload.items)]
    report = {"summary": {"wall_time_s": seconds}, "url": "x", "model": "m"}
    return SpecRun(Spec(name, ()), [], "", None, [LoadPoint(load, {"probe": report}, results)])


def test_located_load_points_bisect_where_s_crosses_1(workload: Path) -> None:
    """--loads 1..16 with --budget: the race gives load 1, the ends are measured, then the powers of two where S
    against 1 changes, until the change is bracketed within 2x; a saved point is read back, not run again."""
    from specledger.probe.launch_budget import _load_points
    from specledger.probe.launch_race import RaceFolder

    w = workload_from_jsonl(workload)
    ran: list[tuple[str, int]] = []

    def runner(name: str, items, loads, tag: str):
        (load,) = loads
        ran.append((name, load))
        return _part(name, load, 1.0 if name == "off" or load <= 4 else 2.0, w) if name == "off" else \
            _part(name, load, 0.5 if load <= 4 else 2.0, w)

    merged = {"off": _part("off", 1, 1.0, w), "ngram": _part("ngram", 1, 0.5, w)}
    runs = _load_points(["off", "ngram"], [1, 16], w, RaceFolder(None), runner, merged, locate=True)
    assert sorted({load for _, load in ran}) == [4, 8, 16]  # 16 (the end), then 4, then 8: bracketed in (4, 8]
    assert [p.load for p in runs["ngram"].points] == [4, 8, 16] and ran[:2] == [("off", 16), ("ngram", 16)]
    fixed = _load_points(["off", "ngram"], [1, 4], w, RaceFolder(None), runner, merged)
    assert [p.load for p in fixed["off"].points] == [4]


def test_an_endpoint_workload_spanning_context_buckets_is_decided_per_bucket(tmp_path: Path) -> None:
    """As ``run``: a category whose prompts fall in two context buckets (characters / 4 without a tokenizer) is
    decided per bucket; a category in one keeps its name."""
    doc = "The committee met on Tuesday and agreed the budget. " * 120  # 6,240 characters: about 1.5k tokens
    lines = [{"id": f"s{i}", "messages": [{"role": "user", "content": f"Summarise: {doc[:800 + 40 * i]}"}],
              "category": "docs"} for i in range(3)]
    lines += [{"id": f"l{i}", "messages": [{"role": "user", "content": f"Summarise: {doc[: 5000 + 40 * i]}"}],
               "category": "docs"} for i in range(3)]
    lines += [{"id": f"q{i}", "messages": [{"role": "user", "content": f"Say hi {i}"}], "category": "chat"}
              for i in range(3)]
    workload = tmp_path / "long.jsonl"
    workload.write_text("".join(json.dumps(x) + "\n" for x in lines))
    spec_cfg = FakeServerConfig(delays_s=(0.002,), chunk_pattern=(1, 3, 2, 4), response_tokens=12, crlf_every=0)
    base_cfg = FakeServerConfig(delays_s=(0.002,), chunk_pattern=(1,), response_tokens=12, gamma=0, crlf_every=0)
    with FakeServer(spec_cfg) as spec, FakeServer(base_cfg) as base:
        res = CliRunner().invoke(cli_app, ["probe", spec.url, "--baseline", base.url, "--workload", str(workload),
                                           "--max-tokens", "12", "--chat", "--budget", "30s",
                                           "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, (res.output, res.exception)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {v["category"] for v in summary["verdicts"] if v.get("load", 1) == 1} == {"docs@<1k", "docs@1-2k", "chat"}
    assert {v.get("context_bucket") for v in summary["verdicts"]} == {"<1k", "1-2k", None}
