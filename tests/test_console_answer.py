"""The console answer: one line per category, the schedule, the self-check; short; untrusted text printed as is."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from specledger.report.console import answer_lines, print_answer

GOLDEN = Path(__file__).parent / "data" / "golden_run_summary.json"


def _verdict(cat: str, load: int, decision: str = "deploy", **kw) -> dict:
    return {"category": cat, "temperature": 0.0, "load": load, "simulated": load > 16, "decision": decision,
            "setting": "ngram γ=4" if decision == "deploy" else None, "speedup": 1.5, "speedup_ci": [1.3, 1.7],
            "mean_committed": 2.4, "resolved": True, "resolution": "winner",
            "headline": "ngram γ=4 beats every other setting, paired", "reason": "long reason " * 30, **kw}


def test_default_shaped_run_answers_in_at_most_40_lines_one_per_category():
    cats = ["code", "code-edit", "extraction", "agent", "dialogue", "summary", "math", "random"]
    verdicts = [_verdict(c, load, "control" if c == "random" else "deploy") for c in cats for load in (1, 16, 64)]
    summary = {"meta": {"model": "m", "race": {"budget_s": 330, "rounds": [{}], "dropped": [], "stopped": "x"}},
               "verdicts": verdicts, "loads": [1, 16], "simulated_loads": [64], "slo": {},
               "schedules": [{"vllm": {"speculative_config": {}}}],
               "prediction_check": {"n": 12, "median_abs_error": 0.02, "p90_abs_error": 0.05}}
    lines = answer_lines(summary)
    assert len(lines) <= 40
    rows = [ln for ln in lines if ln.startswith("  ") and "S 1.50 [1.30–1.70]" in ln]
    assert len(rows) == 8 and all("long reason" not in ln for ln in lines)  # the one reason, not the paragraph
    assert any(ln.startswith("schedule") for ln in lines) and any("forecast self-check" in ln for ln in lines)
    assert "7 of 7 decisions resolved" in lines[1]


def test_the_answer_names_open_no_decision_and_an_slo_out_of_reach():
    summary = {"meta": {}, "loads": [1], "slo": {}, "verdicts": [
        _verdict("a", 1, resolved=False, resolution="open", headline="ngram γ=4 vs suffix γ=4: paired ratio 1.01"),
        _verdict("b", 1, "no-decision", resolved=False, resolution="no-data", headline="too few rounds"),
        _verdict("c", 1, "off", resolution="off", headline="S < 1: the fastest setting ...",
                 slo_out_of_reach="SLO out of reach at load 1 even without speculation (plain TTFT P99 2348.0>2000 ms)"
                 "; speculation is judged on what it changes")]}
    a, b, c = answer_lines(summary)[2:5]
    assert "deploy ngram γ=4" in a and "open: ngram γ=4 vs suffix γ=4" in a
    assert "no decision" in b and "too few rounds" in b and "resolved" not in b
    assert "off" in c and "resolved (off): S < 1" in c and "SLO out of reach at load 1" in c


def test_markup_in_file_supplied_text_is_printed_literally():
    summary = {"meta": {"model": "[/bold]evil\x1b[31m"}, "loads": [1], "slo": {},
               "verdicts": [_verdict("[red]x[/red]", 1)]}
    console = Console(record=True, width=300, force_terminal=False)
    print_answer(summary, console)
    text = console.export_text()
    assert "[red]x[/red]" in text and "[/bold]evil" in text and "\x1b" not in text


def test_the_golden_run_reads_in_a_few_lines():
    summary = json.loads(GOLDEN.read_text())
    lines = answer_lines(summary)
    assert 3 <= len(lines) <= 40 and sum(ln.startswith("  chat") or ln.startswith("  copy") for ln in lines) >= 2
