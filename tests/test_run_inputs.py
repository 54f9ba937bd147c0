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
