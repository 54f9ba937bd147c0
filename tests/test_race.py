"""Racing: prompts go where decisions are open, settings out of contention stop running, the budget holds."""

from __future__ import annotations

import pytest

from specledger.errors import SpecLedgerError
from specledger.mainjob.race import RaceLog, Setting, race

SETTINGS = [Setting("ngram", 2), Setting("ngram", 4), Setting("suffix", 4), Setting("layerskip", 2)]


class FakeJob:
    """Decisions that resolve once a category has ``needs[cat]`` prompts; a fake clock that advances 1 s per
    prompt run."""

    def __init__(self, needs: dict[str, int], pool: int = 10) -> None:
        self.needs, self.count = needs, dict.fromkeys(needs, 2)
        self.pool = {c: pool for c in needs}
        self.now = 0.0
        self.ran: list[tuple[str, list[str]]] = []

    def clock(self) -> float:
        return self.now

    def decide(self) -> list[dict]:
        out = []
        for cat, need in self.needs.items():
            done = self.count[cat] >= need
            out.append({"category": cat, "temperature": 0.0, "decision": "deploy", "resolved": done,
                        "setting": "ngram γ=4", "headline": f"{cat} open",
                        "contenders": [] if done else ["ngram γ=4", "suffix γ=4"],
                        "comparisons": [{"a": "ngram γ=4", "b": b, "ratio": r, "ci": ci, "n": self.count[cat],
                                         "verdict": verdict} for b, r, ci, verdict in (
                                            ("ngram γ=2", 1.2, [1.1, 1.3], "a faster"),
                                            ("layerskip γ=2", 2.0, [1.8, 2.2], "a faster"),
                                            ("suffix γ=4", 1.01, [0.95, 1.07], "open"))]})
        return out

    def more(self, cat: str, k: int) -> list[str]:
        k = min(k, self.pool[cat])
        self.pool[cat] -= k
        return [f"{cat}{self.count[cat] + i}" for i in range(k)]

    def run(self, cat: str, temp: float, ids: list[str], keep: list[Setting], with_plain: bool = True) -> None:
        self.ran.append((cat, [s.name for s in keep]))
        self.count[cat] += len(ids)
        self.now += len(ids)

    def so_far(self, cat: str) -> int:
        return self.count[cat]


def test_the_race_adds_prompts_only_to_open_categories_and_runs_only_contenders():
    job = FakeJob({"code": 2, "math": 6})
    log = race(RaceLog(budget_s=100), 100.0, job.decide, job.more, job.run, SETTINGS, job.so_far, clock=job.clock)
    assert log.stopped == "every decision resolved"
    assert {c for c, _ in job.ran} == {"math"} and job.count == {"code": 2, "math": 6}
    assert all(names == ["ngram γ=4", "suffix γ=4"] for _, names in job.ran)
    dropped = {(d["category"], d["label"]) for d in log.dropped}
    assert dropped == {("math", "ngram γ=2"), ("math", "layerskip γ=2")}
    assert all("cannot be more than the margin faster" in d["why"] for d in log.dropped)


def test_the_race_stops_at_its_deadline_and_when_the_pool_runs_dry():
    job = FakeJob({"math": 100})
    log = race(RaceLog(budget_s=7), 7.0, job.decide, job.more, job.run, SETTINGS, job.so_far, clock=job.clock)
    assert log.stopped == "budget spent" and job.now <= 7.0 + 2  # a round is only started when it fits
    job = FakeJob({"math": 100}, pool=3)
    log = race(RaceLog(budget_s=1e9), 1e9, job.decide, job.more, job.run, SETTINGS, job.so_far, clock=job.clock)
    assert log.stopped == "no more prompts in the open categories" and job.count["math"] == 5


def test_budget_parsing_and_a_budget_below_one_prompt_are_one_line_errors():
    from specledger.mainjob.job import RunPlan, check_budget
    from specledger.mainjob.options import parse_budget

    assert parse_budget("330") == 330 and parse_budget("90s") == 90 and parse_budget("6m") == 360
    assert parse_budget("none") is False and parse_budget(None) is None
    for bad in ("soon", "-5", "inf", "0.0m"):
        with pytest.raises(SpecLedgerError, match="is not a time"):
            parse_budget(bad)
    surface = {"points": [{"rows": 1, "seconds": 0.02, "batch": 1, "context": 64}]}
    plan = RunPlan(drafters=["ngram"], gammas=[2, 4], max_tokens=40, budget_s=20.0)
    with pytest.raises(SpecLedgerError, match=r"--budget 20s is below what one prompt needs.*raise --budget to"):
        check_budget(plan, surface, spent_s=5.0, categories=["chat"])
    check_budget(RunPlan(drafters=["ngram"], gammas=[2, 4], max_tokens=40, budget_s=60.0), surface, 5.0, ["chat"])
    with pytest.raises(SpecLedgerError, match="--budget must be a positive time"):
        RunPlan(budget_s=-1.0).validate()


def test_replies_that_end_at_their_first_token_get_no_decision_through_the_whole_summary():
    """The raw-text case of issue 33: an instruct model answered every prompt with EOS at once (1 output token,
    0 speculative rounds); the prefill noise of 8 prompts read 'deploy ngram γ=2: S = 1.06, resolved'. The
    summary now gives no decision and says what to change."""
    from specledger.records import RoundRecord
    from specledger.report.summary import summarize
    from tests.synthetic import request_from_rounds

    records = []
    for i in range(8):
        for drafter, gamma, prefill in (("none", 0, 0.050), ("ngram", 2, 0.047 + 0.001 * (i % 3))):
            one = [RoundRecord(drafter, gamma, 0, 0, 1, True, 0.0, 0.0, 0.0, 10)]
            r = request_from_rounds(f"{drafter}{i}", f"p{i}", one, category="sql-edit", t_prefill=prefill)
            r.drafter, r.gamma, r.rounds = drafter, gamma, []
            records.append(r)
    summary = summarize(records, {}, n_resamples=50)
    (v,) = [v for v in summary["verdicts"] if v["category"] == "sql-edit"]
    assert v["decision"] == "no-decision" and v["resolved"] is False
    assert "messages" in v["reason"] and "max-tokens" in v["reason"]
