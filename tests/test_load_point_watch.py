"""The load points (``specledger run --loads``) are watched too: each batched point is a window judged by the CPU
signals, a disturbed point measured once more (its first records kept under experiment 'disturbed', out of the load
records), at most once per point and not while the disturbance lasts; summary.json's ``disturbance`` keeps the
prompts' finding and says the load points' own under ``load_points`` (and in its line when some were disturbed)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest

from specledger.mainjob import disturbance as dist
from specledger.mainjob.disturbance import LoadWatch, Window, finding_line, run_finding
from specledger.provenance import PACKAGE_DIR
from specledger.records import load_records
from tests.test_disturbance import FakeMachine

LOUD, CALM = Window(2.0, 1.0, 0.0).to_dict(), Window(2.0, 0.02, 0.0).to_dict()


def _prompt(pid: str, entry: dict, window: int, again: int = 0, experiment: str = "") -> SimpleNamespace:
    extra = {"disturbance": {**entry, "window": window, "remeasure": again},
             **({"experiment": experiment} if experiment else {})}
    return SimpleNamespace(prompt_id=pid, temperature=0.0, extra=extra)


def _point(load: int, setting: str, entry: dict, window: int, again: int = 0, experiment: str = "load"):
    extra = {"experiment": experiment, "load": load, "setting": setting,
             "disturbance": {**entry, "window": window, "remeasure": again, "load_point": load}}
    return [SimpleNamespace(prompt_id=pid, temperature=0.0, extra=extra) for pid in ("a", "b")]  # one point: 2 requests


def _schema_errors(finding: dict) -> list[str]:
    full = json.loads((PACKAGE_DIR / "schemas" / "summary.schema.json").read_text())
    schema = {**full["properties"]["disturbance"], "$defs": full.get("$defs", {})}  # its $refs resolve there
    return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(finding)]


def test_the_prompt_finding_is_kept_and_the_load_points_get_their_own() -> None:
    prompts = [_prompt("a", CALM, 1), _prompt("b", LOUD, 2)]
    points = (_point(2, "plain", LOUD, 1, experiment="disturbed") + _point(2, "plain", CALM, 2, again=1)
              + _point(2, "ngram γ=2", CALM, 3) + _point(4, "plain", LOUD, 4) + _point(4, "ngram γ=2", CALM, 5))
    alone = run_finding(prompts)
    f = run_finding(prompts + points)
    assert {k: v for k, v in f.items() if k not in ("line", "load_points")} == {
        k: v for k, v in alone.items() if k != "line"}  # the prompts' finding as it was
    lp = f["load_points"]
    assert (lp["unit"], lp["windows"], lp["judged"], lp["disturbed"], lp["remeasured"], lp["remeasured_quiet"]) == (
        "load point", 4, 4, 2, 1, 1)
    assert lp["step_drift"] is None and lp["handling"] == dist.LOAD_REMEASURE_RULE
    assert f["line"] == alone["line"] + "; load points: 2 of 4 disturbed, 1 re-measured (1 quiet the second time)"
    assert f["line"] == finding_line(f) and not _schema_errors(f)
    quiet = run_finding(prompts + _point(2, "plain", CALM, 1))
    assert quiet["load_points"]["disturbed"] == 0 and quiet["line"] == alone["line"]  # no clause when quiet


def test_a_run_whose_load_points_alone_were_watched_still_says_so() -> None:
    f = run_finding(_point(2, "plain", LOUD, 1) + _point(2, "ngram γ=2", CALM, 2))
    assert (f["unit"], f["windows"], f["disturbed"]) == ("load point", 2, 1) and "load_points" not in f
    assert f["line"].startswith("machine DISTURBED during 1 of 2 load points (50 %)")
    assert "0 re-measured (0 quiet the second time), 1 kept measured while disturbed: load > 1 decisions" in f["line"]
    assert not _schema_errors(f)
    assert run_finding([SimpleNamespace(prompt_id="x", temperature=0.0, extra={})]) is None


def test_the_load_watch_remeasures_once_and_not_while_the_disturbance_lasts() -> None:
    watch = LoadWatch(cpus=2, reader=FakeMachine(disturbed_at={2, 4, 6}), on=True)
    recs = [SimpleNamespace(extra={"load": 4})]
    first = watch.judge(watch.start(), recs)  # calls 1-2: disturbed
    assert first["disturbed"] and first["load_point"] == 4 and first["step_drift"] is None and watch.remeasure(first)
    again = watch.judge(watch.start(), recs, second=True)  # calls 3-4: disturbed again: lasting
    assert again["remeasure"] == 1 and again["window"] == 2 and not watch.remeasure(again)
    assert not watch.remeasure(watch.judge(watch.start(), recs))  # calls 5-6: disturbed, lasting: kept, marked
    assert watch.judge(watch.start(), recs)["disturbed"] is False and not watch.lasting  # quiet: it ends
    assert LoadWatch(on=False).judge(LoadWatch(on=False).start(), recs) is None


@pytest.fixture()
def setup(tmp_path, target):
    from specledger.mainjob.job import RunPlan
    from specledger.rundir import RunDir
    from specledger.workloads.item import WorkloadItem
    from tests.conftest import CharTokenizer, char_engine

    items = {"a": WorkloadItem("a", "copy", None, "abcabcabcabc def"), "b": WorkloadItem("b", "chat", None, "hello")}
    encoded = {pid: CharTokenizer().encode(it.prompt) for pid, it in items.items()}
    plan = RunPlan(drafters=["ngram"], gammas=[2], temperatures=[0.0], max_tokens=6, loads=[1, 2])
    return RunDir(tmp_path / "run"), plan, char_engine(target), items, encoded


def _measure(setup, watch: LoadWatch | None = None) -> list:
    from specledger.mainjob.measured_loads import run_load_points

    rd, plan, engine, items, encoded = setup
    rd.path.mkdir(parents=True, exist_ok=True)
    assert run_load_points(rd, plan, engine, items, encoded, watch=watch) == [1, 2]
    return rd.records_so_far()


def test_a_disturbed_load_point_is_measured_once_more(setup) -> None:
    # plain first at load 2: calls 1-2 disturbed, its re-measure (3-4) quiet; ngram γ=2 (5-6) quiet
    records = _measure(setup, LoadWatch(cpus=2, reader=FakeMachine(disturbed_at={2}), on=True))
    first = [r for r in records if r.extra.get("experiment") == "disturbed"]
    kept = load_records(records)
    assert len(first) == 2 and {r.extra["setting"] for r in first} == {"plain"} and len(kept) == 4
    assert all(r.extra["disturbance"]["disturbed"] and r.extra["disturbance"]["load_point"] == 2 for r in first)
    assert not any(r.extra["disturbance"]["disturbed"] for r in kept)
    assert sorted(r.extra["disturbance"]["window"] for r in kept) == [2, 2, 3, 3]
    plain = {r.prompt_id: r.token_ids for r in kept if r.drafter == "none"}
    assert all(r.token_ids == plain[r.prompt_id] for r in first + kept)  # the same outputs, measured again
    lp = run_finding(records)
    assert (lp["unit"], lp["windows"], lp["disturbed"], lp["remeasured"], lp["remeasured_quiet"]) == (
        "load point", 2, 1, 1, 1)


def test_a_lasting_disturbance_is_not_remeasured_and_the_default_watch_reads_proc(setup, monkeypatch) -> None:
    # the run's own path: no watch passed, the watch turned on, /proc's reading replaced
    monkeypatch.delenv(dist.SWITCH, raising=False)
    monkeypatch.setattr(dist, "read", FakeMachine(disturbed_at={2, 4, 6}))
    records = _measure(setup)
    first = [r for r in records if r.extra.get("experiment") == "disturbed"]
    kept = load_records(records)
    assert len(first) == 2 and len(kept) == 4 and all(r.extra["disturbance"]["disturbed"] for r in kept)
    assert sorted(r.extra["disturbance"]["remeasure"] for r in kept) == [0, 0, 1, 1]  # the second point kept as is
    lp = run_finding(records)
    assert (lp["windows"], lp["disturbed"], lp["remeasured"], lp["remeasured_quiet"]) == (2, 2, 1, 0)


def test_the_watch_off_leaves_the_load_points_as_they_were(setup) -> None:
    records = _measure(setup)  # the suite turns the watch off (tests/conftest.py)
    assert len(records) == len(load_records(records)) == 4
    assert not any("disturbance" in r.extra for r in records) and run_finding(records) is None
