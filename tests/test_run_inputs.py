"""Issue 44 item 7: ``run``'s inputs are checked before anything is measured or written -- a missing or
malformed workload and a budget below what one prompt needs are one ``error:`` line (exit 2), with no run
folder left behind and no model loaded -- and ``run`` and ``probe`` read a workload with one rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specledger.cli import main
from specledger.errors import SpecLedgerError
from specledger.mainjob.options import budget_floor_s, check_inputs
from specledger.mainjob.plan import preset
from specledger.probe.workload import workload_from_jsonl
from specledger.workloads import load_jsonl


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a target fails the test: every check here must come before it."""
    import specledger.engine.build as engine_build

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(engine_build, "build_engine", refuse)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *args])
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out, captured.err


def test_a_missing_workload_is_refused_before_a_folder_exists(tmp_path, capsys, no_model) -> None:
    out = tmp_path / "run"
    code, stdout, stderr = _run(capsys, "--workload", str(tmp_path / "nope.jsonl"), "--out", str(out))
    assert code == 2 and stderr.startswith("error: ") and "does not exist" in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not out.exists() and "--resume" not in stdout


def test_a_malformed_workload_line_is_refused_by_number(tmp_path, capsys, no_model) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "a"}) + "\n{not json\n" + json.dumps({"category": "x"}) + "\n")
    out = tmp_path / "run"
    code, _, stderr = _run(capsys, "--workload", str(workload), "--out", str(out))
    assert code == 2 and f"{workload}:2: invalid JSON" in stderr and "1 more malformed line(s): 3" in stderr
    assert not out.exists()


def test_a_budget_below_one_prompt_is_refused_before_measuring(tmp_path, capsys, no_model) -> None:
    out = tmp_path / "run"
    code, stdout, stderr = _run(capsys, "--budget", "60s", "--out", str(out))
    need, _ = budget_floor_s(preset("default"))
    assert code == 2 and "--budget 60s is below what one prompt needs" in stderr
    assert f"at least {int(need) + 1}s" in stderr and not out.exists() and "--resume" not in stdout


def test_the_budget_floor_is_a_lower_bound_that_grows_with_the_work() -> None:
    plan = preset("default")
    need, how = budget_floor_s(plan)
    plan.max_tokens *= 4
    assert budget_floor_s(plan)[0] > need and "settings" in how
    plan = preset("default")
    plan.budget_s = need + 1
    assert check_inputs(plan) == []  # a budget above the floor passes (the run's own check follows)


def test_run_and_probe_read_a_workload_with_one_rule(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a", "id": "x"}) + "\n" + json.dumps({"prompt": "b", "id": "x"}) + "\n")
    errors = []
    for read in (load_jsonl, workload_from_jsonl):
        with pytest.raises(SpecLedgerError) as err:
            read(bad)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and f"{bad}:2: id 'x' appears twice (first on line 1)" in errors[0]
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"prompt": f"p{i}", "category": "c", "mood": "x"}) + "\n" for i in range(9)))
    items, warnings = load_jsonl(good)
    probe = workload_from_jsonl(good)
    assert [it.id for it in items] == [it.id for it in probe.items] and probe.warnings == warnings
    assert warnings == ["unknown field 'mood' ignored on 9 lines: 1, 2, 3, 4, 5, ..."]


def test_probe_keeps_a_lines_max_tokens(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"prompt": "p", "max_tokens": 7}) + "\n" + json.dumps({"prompt": "q"}) + "\n")
    assert [it.max_tokens for it in workload_from_jsonl(path).items] == [7, None]


def test_run_mix_is_checked_before_a_folder_exists(tmp_path, capsys, no_model) -> None:
    out = tmp_path / "run"
    code, stdout, stderr = _run(capsys, "--mix", "code=x", "--out", str(out))
    assert code == 2 and stderr.startswith("error: --mix 'code=x': give CATEGORY=SHARE pairs")
    assert not out.exists() and "--resume" not in stdout
    code, _, stderr = _run(capsys, "--categories", "code,math", "--mix", "code=0.5,agent=0.5", "--out", str(out))
    assert code == 2 and "--mix names agent, not measured here" in stderr and "code, math" in stderr
    assert len(stderr.strip().splitlines()) == 1 and not out.exists()


def test_run_mix_goes_into_the_plan_and_the_workload_gives_the_default_shares(tmp_path) -> None:
    from specledger.mainjob.options import RunOptions, plan_from_options
    from specledger.mainjob.prompts import traffic_counts

    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"p{i}", "category": "qa" if i < 3 else "chat"}) + "\n"
                                for i in range(4)))
    plan, _ = plan_from_options(RunOptions(workload=workload, mix="qa=1,chat=3", out=tmp_path / "r"), None)
    assert plan.mix == {"qa": 0.25, "chat": 0.75} and check_inputs(plan) == []
    assert traffic_counts(plan) == {"qa": 3, "chat": 1}  # without --mix, the shares of the workload's requests
    plan.mix = {"math": 1.0}
    with pytest.raises(SpecLedgerError, match="--mix names math, not measured here"):
        check_inputs(plan)
    built_in, _ = plan_from_options(RunOptions(categories="code,math", n=3), None)
    assert built_in.mix is None and traffic_counts(built_in) == {"code": 3, "math": 3}


def test_probe_prints_the_workload_warnings_folded_once(tmp_path) -> None:
    """A workload with an unknown field on 32 lines: one folded warning line, as ``run`` prints it."""
    from typer.testing import CliRunner

    from specledger.cli import app as cli_app
    from tests.fake_server import FakeServer, FakeServerConfig

    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"p{i}", "mood": "x"}) + "\n" for i in range(32)))
    with FakeServer(FakeServerConfig(delays_s=(0.001,))) as server:
        res = CliRunner().invoke(cli_app, ["probe", server.url, "--workload", str(workload), "--requests", "2",
                                           "--max-tokens", "4"])
    assert res.exit_code == 0, res.output
    folded = f"warning: workload {workload}: unknown field 'mood' ignored on 32 lines: 1, 2, 3, 4, 5, ..."
    assert [line for line in res.output.splitlines() if "mood" in line] == [folded]
