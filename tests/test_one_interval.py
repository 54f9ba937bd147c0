"""One interval and one forecast per figure (issue 47): every S, paired ratio and interval of a run's ``summary.json``
verdicts appears with the same value, level and n of prompts in the console answer, the verbose console tables, the
report page and the plot data embedded in it; a deploy whose own interval does not clear ``min_ci_low`` says in words
how it was shown faster than plain; the S-vs-γ curve, the tables' pred S and the self-check are one forecast model.

The run is the main job on the tiny test model (two categories of 8 prompts, so every interval is bounded), walked
figure by figure; the formats are written out here, not borrowed from the code under test."""

from __future__ import annotations

import copy
import json
import math
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from specledger.gates import SLO
from specledger.gates.decision import Verdict
from specledger.gates.verdicts import setting_name, verdicts
from specledger.mainjob.job import RunPlan, run
from specledger.report.build import build_report, render_html
from specledger.report.console import answer_lines, category_line, print_summary
from specledger.report.summary_model import Summary
from specledger.report.view import slug, verdict_row
from tests.conftest import char_engine

PROMPTS = 8  # per category: the confidence sequence is unbounded below 4


@pytest.fixture(scope="module")
def built(tmp_path_factory, target) -> tuple[dict[str, Any], str]:
    """(summary, report.html) of a main-job run on the tiny model: copy and chat, ngram and suffix at γ 2 and 4."""
    tmp = tmp_path_factory.mktemp("one_interval")
    lines = []
    for i in range(PROMPTS):
        lines.append({"id": f"c{i}", "prompt": "abc" * (3 + i % 3) + f" d{i}ef abcabc", "category": "copy"})
        lines.append({"id": f"h{i}", "prompt": "xyzuvw yxz"[: 4 + i % 6] + " hello hello", "category": "chat"})
    workload = tmp / "w.jsonl"
    workload.write_text("".join(json.dumps(x) + "\n" for x in lines))
    plan = RunPlan(drafters=["ngram", "suffix"], gammas=[2, 4], temperatures=[0.0], max_tokens=24,
                   workload_file=str(workload), n_per_category=PROMPTS)
    out = tmp / "run"
    run(out, plan, char_engine(target))
    summary, html = build_report(out, n_resamples=50)
    return summary, Path(html).read_text(encoding="utf-8")


def _decided(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdicts at load 1 that carry an S (controls and no-decisions aside), the mix's too."""
    return [v for v in summary["verdicts"] + summary.get("mix", [])
            if v.get("speedup") is not None and v["decision"] in ("deploy", "off")]


def _ci(lo: float | None, hi: float | None) -> str:
    return f"[{lo:.2f}–{hi:.2f}]" if lo is not None and hi is not None else "[no interval]"


class _Rows(HTMLParser):
    """The text of every row of the table with ``table_id``, one string per row (cells joined by " | ")."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id, self.inside, self.rows, self.cells = table_id, 0, [], []

    def handle_starttag(self, tag, attrs):
        if tag == "table" and (self.inside or dict(attrs).get("id") == self.table_id):
            self.inside += 1
        elif self.inside and tag == "tr":
            self.cells = []
        elif self.inside and tag in ("td", "th"):
            self.cells.append("")

    def handle_endtag(self, tag):
        if tag == "table" and self.inside:
            self.inside -= 1
        elif self.inside and tag == "tr":
            self.rows.append(" | ".join(c.strip() for c in self.cells))

    def handle_data(self, data):
        if self.inside and self.cells:
            self.cells[-1] += data


def _rows(html: str, table_id: str) -> list[str]:
    parser = _Rows(table_id)
    parser.feed(html)
    assert parser.rows, f"no table {table_id}"
    return parser.rows


def _comparison_tables(html: str, section_id: str) -> list[str]:
    """The rows of the comparisons tables inside one category's section."""
    start = html.index(f'<section class="cat" id="cat-{section_id}">')
    part = html[start:html.index("</section>", start)]
    return [r for chunk in part.split('<table class="comparisons">')[1:]
            for r in _rows('<table id="c">' + chunk[:chunk.index("</table>") + 8], "c")]


def _plot(html: str, div_id: str) -> dict[str, Any]:
    """The plot data and layout the report page draws into ``div_id`` (its inline JSON)."""
    marker = f'Plotly.newPlot("{div_id}", '
    start = html.index(marker) + len(marker)
    decoder = json.JSONDecoder()
    data, end = decoder.raw_decode(html, start)
    layout, _ = decoder.raw_decode(html, end + 2)
    return {"data": data, "layout": layout}


def test_each_verdicts_S_is_its_settings_figure_at_the_decisions_level(built):
    summary, _ = built
    level = 1 - summary["slo"]["decision_alpha"]
    assert summary["intervals"]["level"] == pytest.approx(level) and "confidence sequence" in summary["intervals"][
        "method"]
    scenarios = {(s["category"], setting_name(s)): s for s in summary["scenarios"]}
    checked = 0
    for v in [v for v in _decided(summary) if v["category"] != "all traffic"]:
        s = scenarios[(v["category"], v["setting"])]
        assert (s["speedup"], s["speedup_ci"], s["paired_prompts"]) == (v["speedup"], v["speedup_ci"], v["prompts"])
        assert v["prompts"] == PROMPTS and None not in v["speedup_ci"]
        checked += 1
    assert checked == 2


def test_the_console_answer_shows_each_S_with_its_level_and_n(built):
    summary, _ = built
    lines = answer_lines(summary)
    level = round(100 * (1 - summary["slo"]["decision_alpha"]))
    assert any(f"[{level} % CI (confidence sequence over prompts)] n=prompts" in line for line in lines)
    for v in _decided(summary):
        line = next(x for x in lines if x.startswith(f"  {v['category']} "))
        assert f"S {v['speedup']:.2f} {_ci(*v['speedup_ci'])} n={v['prompts']} " in line, line
    assert any(x.startswith("forecast self-check (end-to-end forecast model, each γ held out") for x in lines)


def test_the_console_tables_show_every_S_and_every_paired_ratio(built):
    summary, _ = built
    console = Console(record=True, width=400)
    print_summary(summary, console)
    text = console.export_text()
    for s in summary["scenarios"]:
        lo, hi = s["speedup_ci"]
        row = next(x for x in text.splitlines() if f" {s['label']} " in x)
        assert f"{s['speedup']:.3f} [{lo:.2f}, {hi:.2f}] │ {s['paired_prompts']} │" in row, row
    for v in _decided(summary):
        for c in v["comparisons"]:
            assert (f"paired {c['a']} / {c['b']} {c['ratio']:.3f} {_ci(*c['ci'])} n={c['n']} ({c['verdict']})"
                    in text)


def test_the_report_shows_the_same_figures(built):
    summary, html = built
    level = round(100 * (1 - summary["slo"]["decision_alpha"]))
    answer = _rows(html, "answer-table")
    assert f"S [{level}% CI]" in answer[0]
    for v in [v for v in _decided(summary) if v["category"] != "all traffic"]:
        figure = f"{v['speedup']:.2f} {_ci(*v['speedup_ci'])}n = {v['prompts']} prompts"
        row = next(r for r in answer if r.startswith(f"{v['category']} |"))
        assert figure in row, row
        key = slug((v["category"], float(v["temperature"])))
        section = _rows(html, f"verdicts-{key}")
        assert f"S [{level}% CI]" in section[0] and any(figure in r for r in section[1:])
        comparisons = _comparison_tables(html, key)
        assert f"{level}% CI" in comparisons[0] and "n prompts" in comparisons[0]
        for c in v["comparisons"]:
            cells = f"{c['a']} | {c['b']} | {c['ratio']:.3f} | {_ci(*c['ci'])} | {c['n']} | {c['verdict']}"
            assert cells in comparisons, (cells, comparisons)
    (mix,) = summary["mix"]
    row = next(r for r in _rows(html, "mix-table") if r.startswith("chat 50 %"))
    assert f"{mix['speedup']:.2f} {_ci(*mix['speedup_ci'])}n = {mix['prompts']} prompts" in row
    gates = _rows(html, "gates-table")
    assert f"speed-up [{level}% CI]" in gates[0] and "n prompts" in gates[0]
    for s in summary["scenarios"]:
        cells = f"{s['label']} | {s['speedup']:.3f} {_ci(*s['speedup_ci'])} | {s['paired_prompts']} |"
        assert any(r.startswith(cells) for r in gates), cells


def test_the_plots_draw_the_same_intervals(built):
    summary, html = built
    level = round(100 * (1 - summary["slo"]["decision_alpha"]))
    for category in ("copy", "chat"):
        fig = _plot(html, f"plot-{category}-T0-speedup")
        assert f"{level} % CI over n prompts" in fig["layout"]["title"]["text"]
        measured = [t for t in fig["data"] if not t["name"].endswith(")")]
        assert {t["name"] for t in measured} == {"ngram", "suffix"}
        for t in measured:
            for g, y, up, down, hover in zip(t["x"], t["y"], t["error_y"]["array"], t["error_y"]["arrayminus"],
                                             t["customdata"]):
                s = next(s for s in summary["scenarios"] if s["category"] == category and s["drafter"] == t["name"]
                         and s["gamma"] == g)
                lo, hi = s["speedup_ci"]
                assert (y, y - down, y + up) == pytest.approx((s["speedup"], lo, hi), rel=1e-9)
                assert hover == f"[{lo:.2f}–{hi:.2f}], n = {s['paired_prompts']} prompts"


def test_one_forecast_model_behind_the_curve_the_tables_and_the_self_check(built):
    summary, html = built
    check = summary["prediction_check"]
    assert check["n"] == 8  # each of the 8 settings held out of the same model once
    by_setting = {(s["category"], s["drafter"], s["gamma"]): s for s in summary["scenarios"]}
    for r in check["rows"]:
        s = by_setting[(r["category"], r["drafter"], r["gamma"])]
        assert (s["predicted_speedup_e2e"], s["prediction_kind"]) == (r["predicted_speedup"], "held out")
        assert r["prompts"] == s["paired_prompts"]  # the held-out figure is priced on the measured S's prompts
    for o in summary["optimal_gamma"]:  # the curve: the same model in sample, on the prompts measured with plain
        assert o["prompts"] == PROMPTS
        measured = {m["gamma"] for m in o["measured"]}
        held_out = {r["gamma"]: r["predicted_speedup"] for r in check["rows"]
                    if (r["category"], r["drafter"]) == (o["category"], o["drafter"])}
        assert set(held_out) == measured
        curve = {p["gamma"]: p["speedup"] for p in o["curve"]}
        for g in measured:  # in sample vs held out: the same model, so near (tiny-model rounds are noisy)
            assert math.isclose(curve[g], held_out[g], rel_tol=0.25), (o["category"], o["drafter"], g)
    fig = _plot(html, "plot-copy-T0-speedup")
    assert {t["name"] for t in fig["data"] if t["name"].endswith(")")} == {
        f"{d} forecast (in sample, {PROMPTS} prompts)" for d in ("ngram", "suffix")}
    text = " ".join(line for s in summary["scenarios"] for line in s["reconciliation_text"])
    assert "Ledger predicts" not in text and "not a forecast" in text  # the round ledger is a decomposition


def _through_scenarios() -> list[dict[str, Any]]:
    """ngram γ=2 (cheaper: the rule's first pick) measured against plain on 4 prompts only, its own S interval
    wide; suffix γ=4 clearly faster than plain on 12; the two paired on 12 prompts, within 1 % of each other."""
    ids = [f"p{i}" for i in range(12)]
    plain = [1.0, 1.3, 0.8, 1.1, 0.95, 1.05, 1.2, 0.9, 1.0, 1.1, 0.85, 1.15]
    noise = [1.0, 0.85, 1.15, 0.9, 1.1, 1.0, 0.9, 1.1, 0.95, 1.05, 1.0, 0.92]  # S against plain moves by prompt
    suffix = [p / (1.5 * w) for p, w in zip(plain, noise)]
    ngram = [t * (1.01 + 0.003 * (i % 2)) for i, t in enumerate(suffix)]  # 1 % slower than suffix on every prompt

    def scenario(drafter: str, gamma: int, seconds: list[float], with_plain: int) -> dict[str, Any]:
        tokens = [100.0] * len(ids)
        per_prompt = {"prompts": ids[:with_plain], "tokens": tokens[:with_plain], "seconds": seconds[:with_plain],
                      "base_tokens": tokens[:with_plain], "base_seconds": plain[:with_plain],
                      "own": {"prompts": ids, "tokens": tokens, "seconds": seconds}}
        speedup = (sum(plain[:with_plain]) / sum(seconds[:with_plain]))
        return {"category": "dialogue", "temperature": 0.0, "drafter": drafter, "gamma": gamma, "tree_budget": 0,
                "label": f"dialogue T=0 {drafter} γ={gamma}", "speedup": speedup, "speedup_ci": [None, None],
                "paired_prompts": with_plain, "per_prompt": per_prompt, "gates": {}}

    return [scenario("ngram", 2, ngram, 4), scenario("suffix", 4, suffix, 12)]


def test_no_deploy_shows_an_interval_under_min_ci_low_without_saying_why(built):
    summary, _ = built
    lines = answer_lines(summary)
    for v in [v for v in _decided(summary) if v["decision"] == "deploy"]:
        lo = v["speedup_ci"][0]
        line = next(x for x in lines if x.startswith(f"  {v['category']} "))
        assert (lo is not None and lo > summary["slo"]["min_ci_low"]) or v["shown_through"]["text"] in line
        assert "Off until resolved" not in v["reason"]  # a provisional deploy says what it deploys, and why


def test_a_deploy_shown_faster_through_another_setting_says_why_in_words(built):
    slo = SLO()
    (v,) = verdicts(_through_scenarios(), slo)
    assert (v["decision"], v["setting"], v["resolved"]) == ("deploy", "ngram γ=2", True)
    lo, hi = v["speedup_ci"]
    assert lo is not None and lo <= slo.min_ci_low < hi  # its own interval does not clear min_ci_low
    through = v["shown_through"]
    assert through["setting"] == "suffix γ=4" and through["bound"] > slo.min_ci_low and through["level"] == 0.9
    assert through["text"].startswith(f"its own interval [{lo:.2f}–{hi:.2f}] is not above 1; faster than plain "
                                      "shown through suffix γ=4: S ≥ ")
    line = category_line(Verdict.from_dict({**v, "load": 1}), 10)
    assert f"S {v['speedup']:.2f} [{lo:.2f}–{hi:.2f}] n=4 " in line and through["text"] in line
    summary, _ = built  # the report's answer row says it beside the interval, not only in the (cut) reason
    shown = copy.deepcopy(summary)
    shown["verdicts"] = [{**v, "load": 1, "simulated": False}]
    typed = Summary.read(shown)
    assert verdict_row(typed.verdicts[0], typed, 1)["ci_note"] == through["text"]
    (row,) = [r for r in _rows(render_html(shown), "answer-table") if r.startswith("dialogue |")]
    assert f"{v['speedup']:.2f} [{lo:.2f}–{hi:.2f}]n = 4 prompts{through['text']}" in row
