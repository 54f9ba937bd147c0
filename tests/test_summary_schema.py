"""summary.json as an interface: its JSON Schema (specledger/schemas/summary.schema.json) is generated from the
summary's types (specledger.report.summary_model, scripts/gen_summary_schema.py), holds for a real run's file and
the golden one, rejects broken ones, documents every top-level key; the file carries its provenance, keeps the
prompts' token ids in run.json only, and is written one row per line (compact, same value)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import jsonschema
import pytest

from specledger.analysis.metrics import quantile_sketch
from specledger.gates.decision import Comparison, LegacyDrop, Verdict
from specledger.mainjob.job import RunPlan, run
from specledger.provenance import PACKAGE_DIR, git_state, provenance
from specledger.report.build import build_report
from specledger.report.summary_model import Summary, summary_schema_text
from specledger.rundir import SUMMARY_NAME, dumps_json, summary_meta
from tests.conftest import char_engine
from tests.test_summary_golden import WORKLOAD

SCHEMA_PATH = PACKAGE_DIR / "schemas" / "summary.schema.json"
GOLDEN = Path(__file__).parent / "data" / "golden_run_summary.json"


@pytest.fixture(scope="module")
def schema() -> dict:
    loaded = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(loaded)  # a valid draft 2020-12 schema
    return loaded


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, target) -> Path:
    """The golden test's workload and plan on the tiny model, plus a measured load 2 and a simulated load 4."""
    tmp = tmp_path_factory.mktemp("schema_run")
    workload = tmp / "w.jsonl"
    workload.write_text("".join(json.dumps(x) + "\n" for x in WORKLOAD))
    plan = RunPlan(drafters=["ngram", "suffix"], gammas=[2, 4], temperatures=[0.0, 0.8], max_tokens=12,
                   workload_file=str(workload), loads=[1, 2], simulate_loads=[4])
    out = tmp / "run"
    run(out, plan, char_engine(target))
    build_report(out, n_resamples=100)
    return out


@pytest.fixture(scope="module")
def summary(real_run) -> dict:
    return json.loads((real_run / SUMMARY_NAME).read_text(encoding="utf-8"))


def _errors(schema: dict, doc: dict) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]


def test_the_schema_file_is_the_one_the_types_generate():
    assert SCHEMA_PATH.read_text(encoding="utf-8") == summary_schema_text(), \
        "summary.schema.json is generated: run `.venv/bin/python scripts/gen_summary_schema.py`"


def test_a_real_summary_validates(schema, summary):
    assert summary["verdicts"] and summary["scenarios"] and summary["load_scenarios"]  # every section is exercised
    assert {v["load"] for v in summary["verdicts"]} == {1, 2, 4}
    assert _errors(schema, summary) == []
    typed = Summary.read(summary)  # the report's reading of it
    assert [v.decision for v in typed.verdicts] == [v["decision"] for v in summary["verdicts"]]


def test_the_golden_summary_validates(schema):
    """The golden run's summary (tests/test_summary_golden.py), with the two keys that test leaves out of it (not a
    function of the run) put back."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert _errors(schema, {**golden, "generated": "2025-01-01T00:00:00+00:00", "provenance": provenance()}) == []


def test_the_files_verdict_is_the_gates_verdict(schema, summary):
    """summary.json's verdict is the gates' own Verdict (specledger.gates.decision), read by the report with pydantic
    and its schema generated from it: the schema's verdict has its fields, and every verdict (and the mix's) of a
    real and the golden summary reads back whole, writing the same dict again."""
    verdict_def = schema["properties"]["verdicts"]["items"]["$ref"].removeprefix("#/$defs/")
    assert list(schema["$defs"][verdict_def]["properties"]) == [f.name for f in fields(Verdict)]
    for doc in (summary, json.loads(GOLDEN.read_text(encoding="utf-8"))):
        typed = Summary.read(doc)
        assert typed.mix and all(type(v) is Verdict for v in typed.verdicts + typed.mix)
        assert [v.to_dict() for v in typed.verdicts] == doc["verdicts"]
        assert [v.to_dict() for v in typed.mix] == doc["mix"]
    assert all(type(s.at_target) is Verdict for s in Summary.read(summary).schedules if s.at_target is not None)


def test_an_old_summarys_verdict_reads_as_the_report_always_read_it(summary):
    """What a summary written before a key existed lacks reads as the report has always read it, not as the rule's
    default: no resolution or resolved (None: the page says "resolved"), no decision ("off"), a comparison without
    n (None: "n/a"); a ratio written as null stays None; the legacy ``dropped`` reads typed."""
    old = copy.deepcopy(summary)
    v = old["verdicts"][0]
    for key in ("resolution", "resolved", "decision"):
        del v[key]
    v["comparisons"] = [{"a": "ngram γ=4", "b": "suffix γ=4", "ratio": None, "ci": [1.02, None], "verdict": "open"}]
    v["dropped"] = [{"label": "draft γ=2", "after_prompts": 2, "why": "paired upper bound 0.71 < leader"}]
    read = Summary.read(old).verdicts[0]
    assert (read.resolution, read.resolved, read.decision) == (None, None, "off")
    assert read.comparisons == [Comparison("ngram γ=4", "suffix γ=4", None, (1.02, None), None, "open")]
    assert read.dropped == [LegacyDrop("draft γ=2", 2, "paired upper bound 0.71 < leader")]
    assert read.to_dict()["dropped"] == v["dropped"]


def test_every_top_level_key_and_verdict_key_is_documented(schema, summary):
    props = schema["properties"]
    assert set(summary) <= set(props), f"undocumented top-level keys: {sorted(set(summary) - set(props))}"
    assert all(p.get("description") or "$ref" in p for p in props.values())
    verdict_def = props["verdicts"]["items"]["$ref"].removeprefix("#/$defs/")
    verdict_props = schema["$defs"][verdict_def]["properties"]
    seen = {k for v in summary["verdicts"] for k in v}
    assert seen <= set(verdict_props), f"undocumented verdict keys: {sorted(seen - set(verdict_props))}"
    assert all(p.get("description") or "$ref" in p for p in verdict_props.values())


@pytest.mark.parametrize("breakage", [
    "no verdicts", "verdicts not a list", "decision unknown", "speedup_ci of three", "no provenance",
    "resolved a string", "gate status unknown", "token ids in meta",
])
def test_a_broken_summary_fails(schema, summary, breakage):
    doc = copy.deepcopy(summary)
    if breakage == "no verdicts":
        del doc["verdicts"]
    elif breakage == "verdicts not a list":
        doc["verdicts"] = {"code": "deploy"}
    elif breakage == "decision unknown":
        doc["verdicts"][0]["decision"] = "maybe"
    elif breakage == "speedup_ci of three":
        doc["verdicts"][0]["speedup_ci"] = [1.0, 1.1, 1.2]
    elif breakage == "no provenance":
        del doc["provenance"]
    elif breakage == "resolved a string":
        doc["verdicts"][0]["resolved"] = "yes"
    elif breakage == "gate status unknown":
        doc["scenarios"][0]["gates"]["latency"]["status"] = "ok"
    elif breakage == "token ids in meta":
        next(iter(doc["meta"]["prompts"].values()))["token_ids"] = [1, 2, 3]
    assert _errors(schema, doc), f"{breakage}: still valid"


def test_summary_carries_provenance(summary):
    prov = summary["provenance"]
    assert prov == {**provenance(), **{k: prov[k] for k in ("git_dirty",)}}  # dirty may change while tests run
    assert prov["torch"] == metadata.version("torch")
    commit, _ = git_state()
    assert prov["git_commit"] == commit


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_state_of_a_checkout_and_of_a_plain_folder(tmp_path):
    pkg = tmp_path / "repo" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    assert git_state(pkg) == (None, None)  # not a checkout
    git = ["git", "-C", str(tmp_path / "repo"), "-c", "user.name=t", "-c", "user.email=t@t", "-c",
           "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert git_state(pkg) == (head, False)
    (pkg / "__init__.py").write_text("x = 2\n")
    assert git_state(pkg) == (head, True)
    nested = pkg / "sub"  # a folder deeper in the checkout is not the package's own checkout root
    nested.mkdir()
    assert git_state(nested) == (None, None)


def test_token_ids_stay_in_run_json_only(real_run, summary):
    run_meta = json.loads((real_run / "run.json").read_text(encoding="utf-8"))
    assert all(p.get("token_ids") for p in run_meta["prompts"].values())  # the forecasts read them there
    assert summary["meta"]["prompts"] == {pid: {k: v for k, v in p.items() if k != "token_ids"}
                                          for pid, p in run_meta["prompts"].items()}
    assert summary_meta({"prompts": {"a": {"token_ids": [1], "prompt_tokens": 1}}, "x": 1}) == \
        {"prompts": {"a": {"prompt_tokens": 1}}, "x": 1}


def test_summary_json_is_one_row_per_line_and_the_same_value(real_run, summary):
    text = (real_run / SUMMARY_NAME).read_text(encoding="utf-8")
    lines = text.splitlines()
    rows = summary["verdicts"] + summary["scenarios"] + summary["load_scenarios"] + summary["baselines"]
    assert len(lines) < len(rows) + 150  # a row is one line, not hundreds
    first = json.dumps(summary["verdicts"][0], ensure_ascii=False, separators=(",", ":"))
    assert f"    {first}," in lines or f"    {first}" in lines
    value = {"a": [1, 2.5, None, "x"], "b": [{"c": [[1, 2], [3]]}], "d": {}, "e": [], "f": {"g": {"h": 1}}}
    for depth in (None, 0, 1, 2, 5):
        assert json.loads(dumps_json(value, one_line_below=depth)) == value
    assert '"a": [1, 2.5, null, "x"]' in dumps_json(value)  # arrays of scalars on one line, even indented


def test_quantile_sketch_keeps_small_samples_exactly_and_caps_large_ones():
    assert quantile_sketch([0.003, 0.001, 0.002], scale=1e3) == [1.0, 2.0, 3.0]  # the sorted sample itself
    big = quantile_sketch([i / 7 for i in range(1000)])
    assert len(big) == 101 and big[0] == 0.0 and big[-1] == pytest.approx(999 / 7, rel=1e-3)
    assert quantile_sketch([1.23456789]) == [1.235] and quantile_sketch([]) == []
