"""``specledger probe URL --baseline URL2 --loads``: both endpoints at each load, the run's records per
load, and the same per-load gates, verdicts and schedule as ``specledger run --loads`` (loopback only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specledger.cli import app as cli_app
from specledger.errors import SpecLedgerError
from specledger.gates import PASS
from specledger.probe.endpoint_loads import at_load, side_order
from specledger.probe.loadgen import LoadConfig
from specledger.rundir import read_records
from tests.fake_server import FakeServer, FakeServerConfig

GATES = {"correctness", "quality", "latency", "capacity"}


def test_each_load_is_a_closed_loop_and_the_first_side_alternates() -> None:
    cfg = LoadConfig(base_url="", model="", concurrency=None, rate=3.0, num_requests=5)
    assert (at_load(cfg, 2).concurrency, at_load(cfg, 2).rate, at_load(cfg, 2).num_requests) == (2, None, 5)
    assert at_load(cfg, 16).num_requests == 16  # a closed loop of 16 needs 16 requests
    assert [side_order(k, True)[0] for k in range(4)] == ["probe", "baseline", "probe", "baseline"]
    assert side_order(1, False) == ("probe",)


@pytest.mark.parametrize("args, match", [
    (["--loads", "0,4"], "--loads '0,4': give whole numbers"),
    (["--loads", "1,x"], "e.g. --loads 1,4,16"),
    (["--loads", "1,4", "--concurrency", "2"], "either --loads"),
])
def test_bad_loads_are_one_line_errors(args: list[str], match: str) -> None:
    res = CliRunner().invoke(cli_app, ["probe", "http://127.0.0.1:9", *args])
    assert isinstance(res.exception, SpecLedgerError) and match in str(res.exception)
    assert "\n" not in str(res.exception)


def _workload(tmp_path: Path, prompts: list[str]) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p, "category": "chat"}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


def _args(url: str, out: Path, workload: Path, *extra: str) -> list[str]:
    return ["probe", url, "--out", str(out), "--workload", str(workload), "--requests", "3", "--max-tokens", "8",
            *extra]


def test_probe_loads_with_baseline_gives_verdicts_per_load_and_a_schedule(tmp_path: Path) -> None:
    out = tmp_path / "run"
    slo = tmp_path / "slo.json"
    slo.write_text(json.dumps({"target_load": 2}))
    wl = _workload(tmp_path, ["story one", "story two", "story three"])
    config = FakeServerConfig(delays_s=(0.001,))
    with FakeServer(config) as spec, FakeServer(config) as base:
        res = CliRunner().invoke(cli_app, _args(spec.url, out, wl, "--baseline", base.url, "--loads", "2,1",
                                                "--label", "eagle3", "--slo", str(slo)))
    assert res.exit_code == 0, res.output
    assert "probe at loads" not in res.output and "schedule (load → setting" in res.output  # tables: --verbose
    assert "answer at load 2" in res.output and len(res.output.splitlines()) <= 40
    records = list(read_records(out / "traces.jsonl"))
    solo = [r for r in records if not r.extra.get("experiment")]
    at2 = [r for r in records if r.extra.get("experiment") == "load"]
    assert {(r.drafter, r.extra["load"]) for r in solo} == {("eagle3", 1), ("none", 1)} and len(solo) == 6
    assert {(r.drafter, r.extra["load"]) for r in at2} == {("eagle3", 2), ("none", 2)} and len(at2) == 6
    assert all(r.extra["point_wall_s"] > 0 and r.extra["point_tokens"] > 0 and "point_cpu_s" not in r.extra
               for r in at2)
    assert len({r.request_id for r in records}) == len(records)
    assert {r.gamma for r in records if r.drafter == "eagle3"} == {3}  # one γ label for every load
    summary = json.loads((out / "summary.json").read_text())
    assert summary["loads"] == [1, 2]
    assert {(v["load"], v["simulated"]) for v in summary["verdicts"]} == {(1, False), (2, False)}
    (s2,) = summary["load_scenarios"]
    assert s2["load"] == 2 and set(s2["gates"]) == GATES and "goodput" in s2["gates"]["capacity"]["evidence"]
    assert s2["gates"]["correctness"]["status"] == PASS
    (sched,) = summary["schedules"]
    assert sched["at_target"]["load"] == 2 and "at" in sched["text"]
    doc = json.loads((out / "probe.json").read_text())
    assert [p["load"] for p in doc["loads"]] == [1, 2] and doc["loads"][1]["order"] == ["baseline", "probe"]
    assert summary["experiments"]["probe"]["loads"][1]["load"] == 2
    assert 'id="endpoint-load-2"' in (out / "report.html").read_text()


def test_probe_loads_without_baseline_gives_figures_not_verdicts(tmp_path: Path) -> None:
    wl = _workload(tmp_path, ["a b c", "d e f"])
    with FakeServer(FakeServerConfig(delays_s=(0.001,))) as spec:
        res = CliRunner().invoke(cli_app, ["probe", spec.url, "--workload", str(wl), "--requests", "2",
                                           "--max-tokens", "6", "--loads", "1,3", "--json"])
        bad = CliRunner().invoke(cli_app, ["probe", spec.url, "--loads", "1,3", "--slo", str(tmp_path / "no.json")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [p["load"] for p in doc["loads"]] == [1, 3] and doc["loads"][1]["probe"]["summary"]["requests_ok"] == 3
    assert all(v["decision"] == "no-decision" for v in doc["verdicts"])  # nothing to compare with: never "deploy"
    assert isinstance(bad.exception, SpecLedgerError) and "SLO file not found" in str(bad.exception)


def test_probe_loads_of_specledger_serve_tiny_model_endpoints(tmp_path: Path) -> None:
    """Our own server with a tiny model, ngram speculation vs plain decoding, at loads 1 and 2."""
    import torch

    from specledger.serve.runner import ServerThread
    from tests.test_serve import PROMPTS, tiny_app

    wl = _workload(tmp_path, PROMPTS[:3])
    out = tmp_path / "run"
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ServerThread(tiny_app(drafter="ngram", gamma=4)) as spec, ServerThread(tiny_app(drafter="none")) as base:
            res = CliRunner().invoke(cli_app, _args(spec.url, out, wl, "--baseline", base.url, "--loads", "1,2"))
    finally:
        torch.set_num_threads(previous)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert {v["load"] for v in summary["verdicts"]} == {1, 2}
    assert all(v["simulated"] is False and v["decision"] in ("deploy", "off") for v in summary["verdicts"])
    (sched,) = summary["schedules"]
    assert sched["text"].count("at") >= 1 and sched["category"] == "chat"
    (s2,) = summary["load_scenarios"]
    assert s2["gates"]["correctness"]["status"] == PASS  # greedy under batching: token-identical to plain
