"""The report leads with the answer (issue 33 §5): the first screen holds every category's decision, S and
reason; one section per category with its own small figures (a handful of series each, the S-vs-load
crossover with simulated points marked); every detail table collapsed; old summaries without the new
verdict keys still render. The layout is measured in headless Chromium at 1280x800."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from synthetic import plain_rounds, request_from_rounds, spec_rounds

from specledger.records import RequestRecord
from specledger.report.build import build_report, render_html
from specledger.report.category_plots import category_figures, figure_html
from specledger.report.summary_model import Summary
from specledger.report.view import answer_rows, first_sentence, shorten
from specledger.rundir import append_records, write_json_atomic

#: category -> tokens each speculative round accepts (0: the drafter never helps); random is the control
CATEGORIES = {"code": 3, "dialogue": 1, "agent": 2, "math": 1, "summary": 0, "qa": 1, "email": 2, "random": 0}
#: (drafter, γ, draft seconds per round): ``make run``'s shape, 5 settings per category (40 in all)
SETTINGS = [("ngram", 2, 0.0005), ("ngram", 4, 0.0005), ("suffix", 2, 0.0008), ("suffix", 4, 0.0008),
            ("draft", 2, 0.012)]
NEW_KEYS = ("resolution", "headline", "mean_committed", "slo_out_of_reach", "comparisons", "equivalent_to",
            "dropped", "setting", "prompts")


def solo_records(n_prompts: int = 3) -> list[RequestRecord]:
    out = []
    for cat, k in CATEGORIES.items():
        for i in range(n_prompts):
            pid, scale = f"{cat}{i}", 1 + 0.03 * i
            out.append(request_from_rounds(f"{pid}|none", pid, plain_rounds(24, 0.02 * scale), category=cat,
                                           t_prefill=0.01))
            for drafter, gamma, t_draft in SETTINGS:
                acc = min(k, gamma)
                rounds = spec_rounds(drafter, gamma, [acc] * max(1, 24 // (acc + 1)), t_draft,
                                     0.021 * scale * (1 + 0.02 * gamma))
                out.append(request_from_rounds(f"{pid}|{drafter}{gamma}", pid, rounds, category=cat, t_prefill=0.01))
    return out


def load_point(solo: list[RequestRecord], load: int, slow: float) -> list[RequestRecord]:
    """The solo requests re-timed as a batched load point (speculation slowed more, by 10 % per γ)."""
    out = []
    for r in solo:
        setting = "plain" if r.drafter == "none" else f"{r.drafter} γ={r.gamma}"
        f = slow * (1 if r.drafter == "none" else 1 + 0.1 * r.gamma)
        same = [x for x in solo if x.drafter == r.drafter and x.gamma == r.gamma]
        out.append(dataclasses.replace(
            r, request_id=f"load{load}|{r.request_id}", ttft=r.ttft * f, total_time=r.total_time * f,
            token_times=[t * f for t in r.token_times],
            extra={"experiment": "load", "kind": "concurrency", "load": load, "setting": setting,
                   "point_wall_s": sum(x.total_time * f for x in same) / load, "point_cpu_s": 1.0,
                   "point_tokens": 24 * len(same), "point_requests": len(same)}))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[dict[str, Any], Path]:
    """A ``make run``-shaped run: 8 categories x 5 settings, load 16 measured, load 64 simulated."""
    run = tmp_path_factory.mktemp("layout") / "run"
    run.mkdir()
    solo = solo_records(6)  # an equivalence needs 6 paired prompts (gates.verdicts.MIN_EQUIVALENCE_PROMPTS)
    append_records(run / "traces.jsonl", solo + load_point(solo, 16, 1.3))
    write_json_atomic(run / "run.json", {"name": "layout-check", "model": "synthetic-135M", "dtype": "fp32",
                                         "machine": "ci", "config": {"simulate_loads": [64]},
                                         "kv_bytes_per_token": 1024, "memory_total_bytes": 2**30})
    summary, html = build_report(run, n_resamples=100)
    return summary, html


def _with_new_keys(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with the verdict keys of issue 33 set by hand on ``code`` at load 1 and a race block,
    whatever the verdict code wrote there."""
    s = copy.deepcopy(summary)
    for v in s["verdicts"]:
        if v["category"] == "code" and v["load"] == 1:
            v.update(resolution="winner", headline="ngram γ=4 beats suffix γ=4 by 4 % (paired 90 % CI 2–6 %)",
                     mean_committed=3.5, slo_out_of_reach="SLO out of reach at load 1 even without speculation "
                     "(plain TTFT P99 2348 ms > 2000 ms)",
                     comparisons=[{"a": "ngram γ=4", "b": "suffix γ=4", "ratio": 1.04, "ci": [1.02, 1.06],
                                   "verdict": "a faster"}],
                     dropped=[{"label": "draft γ=2", "after_prompts": 2, "why": "paired upper bound 0.71 < leader"}])
        if v["category"] == "qa" and v["load"] == 1:
            v.update(decision="no-decision", resolution="no-data", speedup=None, speedup_ci=[None, None],
                     setting=None, mean_committed=None, headline="too few speculative rounds to measure anything: "
                     "give the prompts as chat `messages` or raise --max-tokens")
    s["race"] = {"budget_s": 300, "spent_s": 212.4, "dropped": [{"label": "code T=0 draft γ=2", "after_prompts": 2,
                                                                 "why": "paired upper bound 0.71 < leader"}],
                 "rounds": [{"after_s": 95.0, "category": "dialogue", "added_prompts": 4,
                             "open_before": ["dialogue", "qa"]}]}
    return s


def _old(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary as a run from before issue 33 wrote it: none of the new verdict or SLO keys."""
    s = copy.deepcopy(summary)
    for v in s["verdicts"]:
        for k in NEW_KEYS:
            v.pop(k, None)
        if v["decision"] == "no-decision":
            v["decision"] = "off"
    for k in ("decision_alpha", "equivalence_margin"):
        s["slo"].pop(k, None)
    s.pop("race", None)
    return s


# ----------------------------------------------------------------------------- what the answer shows


def test_answer_has_one_row_per_category_at_load_1_or_the_target_load(built):
    summary, _ = built
    rows = answer_rows(Summary.read(summary))
    assert [r["category"] for r in rows] == list(dict.fromkeys(v["category"] for v in summary["verdicts"]))
    assert len(rows) == len(CATEGORIES) and {r["load"] for r in rows} == {1}
    by = {r["category"]: r for r in rows}
    assert by["code"]["decision"].startswith("deploy ") and by["code"]["speedup"] > 2
    assert by["random"]["decision"] == "control"
    off = by["summary"]  # nothing the drafters propose is accepted: off, with the fastest setting's S named
    assert off["decision"] == "off" and off["speedup"] < 1 and off["speedup_of"]
    for r in rows:
        assert r["headline"] and r["status"] and r["el"] is not None
    targeted = copy.deepcopy(summary)
    targeted["slo"]["target_load"] = 64
    rows = answer_rows(Summary.read(targeted))
    assert {r["load"] for r in rows} == {64} and all(r["simulated"] for r in rows)


def test_new_verdict_keys_render_in_the_answer_and_the_section(built):
    summary, _ = built
    html = render_html(_with_new_keys(summary))
    answer = html[html.index('id="answer-table"'):html.index("</table>", html.index('id="answer-table"'))]
    code = answer[answer.index('data-category="code"'):]
    code = code[:code.index("</tr>")]
    assert "resolved: winner" in code and "beats suffix γ=4 by 4 %" in code and ">3.50<" in code
    assert "SLO out of reach at load 1 even without speculation" in code
    assert 'id="race"' in html and "212 s of a 300 s budget" in html and "dropped after 2 prompts" in html
    assert "paired ratio S_a / S_b" in html and "[1.02–1.06]" in html
    assert "S [95% CI]" in answer  # the verdicts' 1 − α confidence sequences, α = 0.05 (analysis.sequential)
    qa = answer[answer.index('data-category="qa"'):]
    qa = qa[:qa.index("</tr>")]
    assert "no decision" in qa and "no data" in qa and "chat `messages`" in qa
    assert "fastest: " not in qa and ">n/a<" in qa  # nothing measured: no S borrowed from prefill noise


def _mix_table(html: str) -> str:
    start = html.index('id="mix-table"')
    return html[start:html.index("</table>", start)]


def test_the_one_setting_for_all_the_traffic_sits_with_the_answers_with_its_evidence(built):
    summary, _ = built
    (mix,) = summary["mix"]  # 7 categories besides the random control, each its share of the requests
    assert mix["category"] == "all traffic" and set(mix["weights"]) == set(CATEGORIES) - {"random"}
    html = render_html(summary)
    assert html.index('id="answer-table"') < html.index('id="mix-table"') < html.index('id="schedule-table"')
    table = _mix_table(html)
    setting = mix["setting"] if mix["decision"] == "deploy" else "off"
    lo, hi = mix["speedup_ci"]
    assert "decision at load 1" in table and setting in table and "as given by --mix" not in table
    assert f"<b>{mix['speedup']:.2f}</b> [{lo:.2f}–{hi:.2f}]" in table and "code 14 %" in table
    assert mix["headline"][:60] in table
    evidence = html[html.index('id="mix-evidence"'):html.index("</details>", html.index('id="mix-evidence"'))]
    assert evidence.count("<tr><td>") == len(mix["settings"]) + len(mix["comparisons"])
    ngram4 = next(s for s in mix["settings"] if s["setting"] == "ngram γ=4")
    assert f"{ngram4['per_category']['code']:.2f}" in evidence and "<th>S code (14 %)</th>" in evidence
    # a probe's summary with the user's --mix: the same block, saying whose shares they are
    probe = copy.deepcopy(summary)
    probe["meta"].update(kind="probe", traffic_mix={"code": 0.75, "dialogue": 0.25})
    probe["mix"][0]["weights"] = {"code": 0.75, "dialogue": 0.25}
    table = _mix_table(render_html(probe))
    assert "as given by --mix" in table and "code 75 %, dialogue 25 %" in table
    assert 'id="mix-table"' not in render_html({**summary, "mix": []})  # one category: nothing to add


def test_two_temperatures_get_a_column_and_a_section_each(built):
    summary, _ = built
    s = copy.deepcopy(summary)
    s["verdicts"] += [{**v, "temperature": 0.7} for v in summary["verdicts"] if v["category"] == "code"]
    html = render_html(s)
    assert "<th>T</th>" in html and 'id="cat-code-T0"' in html and 'id="cat-code-T0.7"' in html
    assert len(answer_rows(Summary.read(s))) == len(CATEGORIES) + 1


def test_a_summary_from_before_the_new_keys_still_renders(built):
    summary, _ = built
    old = _old(summary)
    rows = {r["category"]: r for r in answer_rows(Summary.read(old))}
    code = next(v for v in old["verdicts"] if v["category"] == "code" and v["load"] == 1)
    assert rows["code"]["headline"] == first_sentence(code["reason"])
    assert rows["code"]["status"] == "resolved" and rows["code"]["el"] is not None  # E[L] from the solo scenario
    html = render_html(old)
    assert "S [95% CI]" in html and 'id="answer-table"' in html and "deploy ngram" in html


def test_reason_shortening_and_first_sentence():
    assert first_sentence("Off: S = 1.16 (95% CI 0.94–1.38), not above 1. Not yet resolved: more.") == \
        "Off: S = 1.16 (95% CI 0.94–1.38), not above 1."
    long = "the fastest setting, ngram γ=2 (S 0.74 [0.20–1.28]), fails the latency gate (" + "x" * 200 + ")"
    cut = shorten(long)
    assert len(cut) <= 152 and cut.endswith(" …") and cut.startswith("the fastest setting")
    assert shorten("short") == "short"


# ----------------------------------------------------------------------------- the page's structure


class _Tables(HTMLParser):
    """Each table's id (or its class) -> whether it sits inside a <details>; and the order of ids seen."""

    def __init__(self) -> None:
        super().__init__()
        self.depth, self.tables, self.order = 0, {}, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "details":
            self.depth += 1
        if tag == "table":
            self.tables[a.get("id") or a.get("class") or f"table{len(self.tables)}"] = self.depth > 0
        if a.get("id"):
            self.order.append(a["id"])

    def handle_endtag(self, tag):
        if tag == "details":
            self.depth -= 1


def test_page_leads_with_the_answer_and_collapses_every_detail_table(built):
    summary, html_path = built
    html = html_path.read_text(encoding="utf-8")
    p = _Tables()
    p.feed(html)
    assert p.depth == 0  # every <details> closed
    visible = {t for t, inside in p.tables.items() if not inside}
    assert visible == {"answer-table", "mix-table", "schedule-table"} | {f"verdicts-{c}-T0" for c in CATEGORIES}, \
        visible
    for t in ("mix-settings-1", "gates-table", "load-gates-table", "ledger-table", "simulation-validation",
              "prediction-table", "cost-table"):
        assert p.tables[t] is True, t
    order = p.order
    first_plot = next(i for i, x in enumerate(order) if x.startswith("plot-"))
    assert order.index("answer-table") < order.index("mix-table") < order.index("schedule-table") \
        < order.index("configs") < first_plot
    for cat in CATEGORIES:  # one section per category, in the answer's order, each with its own figures
        assert f'id="cat-{cat}-T0"' in html and f'href="#cat-{cat}-T0"' in html
    assert 'id="plot-code-T0-speedup"' in html and 'id="plot-code-T0-crossover"' in html
    assert "plot-speedup-vs-gamma" not in html  # no run-wide chart of every series at once
    assert html.count("<script>") >= 2 and len(html) > 1_000_000  # plotly.js inlined once, in <head>
    assert html.count("Plotly.newPlot") == html.count('class="plotly-graph-div')


def test_category_figures_hold_a_handful_of_series_and_mark_simulated_loads(built):
    summary, _ = built
    figs = category_figures(Summary.read(summary))
    assert {k.rsplit("-", 1)[1] for k in figs} == {"speedup", "crossover", "el", "rounds", "acceptance"}
    for div_id, fig in figs.items():
        shown = [t for t in fig["data"] if t.get("showlegend", True)]
        assert 1 <= len(shown) <= 8, (div_id, len(shown))
    speed = figs["plot-code-T0-speedup"]
    assert {t["name"] for t in speed["data"] if t.get("showlegend", True)} == {"ngram", "suffix", "draft"}
    cross = figs["plot-code-T0-crossover"]
    solid = [t for t in cross["data"] if t["line"]["dash"] == "solid"]
    dashed = [t for t in cross["data"] if t["line"]["dash"] == "dash"]
    assert len(solid) == len(dashed) == len(SETTINGS)
    assert all(64 not in t["x"] for t in solid) and all(t["x"][-1] == 64 for t in dashed)
    assert all(t["x"][0] == 16 and t["marker"]["symbol"][-1].endswith("-open") for t in dashed)
    assert any(sh["y0"] == sh["y1"] == 1 for sh in cross["layout"]["shapes"])  # the S = 1 line
    assert any(a["text"] == "simulated →" for a in cross["layout"]["annotations"])
    rounds = figs["plot-code-T0-rounds"]
    assert [t["name"] for t in rounds["data"]] == ["draft", "verify", "other", "T0·E[L]"]
    assert rounds["data"][0]["x"][0] == "plain" and len(rounds["data"][0]["x"]) == 1 + len(SETTINGS)


def test_figure_script_cannot_be_closed_by_a_category_name():
    fig = {"data": [{"type": "scatter", "x": [1], "y": [1], "name": "</script><img src=x onerror=alert(1)>"}],
           "layout": {"height": 300}}
    out = figure_html("plot-x", fig)
    assert out.count("</script>") == 1 and "<\\/script>" in out


def test_rendering_is_fast(built):
    import time

    summary, _ = built
    t = time.perf_counter()
    render_html(summary)
    assert time.perf_counter() - t < 10  # ~1.5 s on 2 busy cores; the figures are plain JSON


# ----------------------------------------------------------------------------- in the browser

PROBE = """<script>
window.addEventListener('load', function () {
  var out = {}, ys = window.scrollY;
  var t = document.getElementById('answer-table');
  out.answer_bottom = t ? t.getBoundingClientRect().bottom + ys : null;
  out.rows = Array.prototype.map.call(document.querySelectorAll('#answer-table tr[data-category]'), function (tr) {
    var d = tr.querySelector('td.dec'), s = tr.querySelector('td.s');
    return {category: tr.getAttribute('data-category'), decision: d.textContent.trim(),
            decision_bottom: d.getBoundingClientRect().bottom + ys, s: s.textContent.trim(),
            s_bottom: s.getBoundingClientRect().bottom + ys};
  });
  var plots = Array.prototype.slice.call(document.querySelectorAll('.js-plotly-plot'));
  out.first_plot_top = plots.length ? plots[0].getBoundingClientRect().top + ys : null;
  out.plots = document.querySelectorAll('.plotly-graph-div').length;
  out.drawn = plots.filter(function (p) { return p.querySelector('svg.main-svg'); }).length;
  out.page_height = document.documentElement.scrollHeight;
  document.querySelectorAll('details').forEach(function (d) { d.open = true; });
  setTimeout(function () {
    out.detail_plot_widths = Array.prototype.map.call(document.querySelectorAll('details .js-plotly-plot'),
      function (p) { return Math.round(p.getBoundingClientRect().width); });
    var pre = document.createElement('pre'); pre.id = 'layout-probe';
    pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
  }, 500);
});
</script>"""


def _chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return path


def _chromium_args(profile: Path) -> list[str]:
    return [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--window-size=1280,800",
            "--virtual-time-budget=8000"]


def measure_layout(html_path: Path, workdir: Path) -> dict[str, Any]:
    """Load ``html_path`` with :data:`PROBE` added in headless Chromium at 1280x800 and return what the
    probe measured (page coordinates in CSS px), plus ``console_errors``."""
    probe = workdir / "probe.html"
    probe.write_text(html_path.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    proc = subprocess.run([*_chromium_args(workdir / "profile"), "--dump-dom", probe.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="layout-probe">(.*?)</pre>', proc.stdout, re.S)
    assert m, proc.stderr[-2000:]
    out = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                     .replace("&gt;", ">"))
    out["console_errors"] = [ln for ln in proc.stderr.splitlines()
                             if "Uncaught" in ln or ("CONSOLE" in ln and "rror" in ln)]
    return out


@pytest.mark.browser
def test_first_screen_holds_every_decision_and_speed_up(built, tmp_path):
    summary, html_path = built
    page = _with_new_keys(summary)  # the longest answer: a reason and an SLO-out-of-reach note on one row
    html = tmp_path / "report.html"
    html.write_text(render_html(page), encoding="utf-8")
    m = measure_layout(html, tmp_path)
    assert not m["console_errors"], m["console_errors"]
    assert sorted(r["category"] for r in m["rows"]) == sorted(CATEGORIES)
    for r in m["rows"]:  # decision and S of every category inside the first 1280x800 screen
        assert r["decision_bottom"] <= 800 and r["s_bottom"] <= 800, r
        assert re.match(r"\d+\.\d\d", r["s"]) or (r["decision"] == "no decision" and r["s"] == "n/a"), r
    assert m["answer_bottom"] <= 800
    assert m["first_plot_top"] <= 2 * 800  # the first figure within the first two screens
    assert m["drawn"] == m["plots"] > 5 * len(CATEGORIES) - 5  # every figure drawn, collapsed ones too
    assert m["detail_plot_widths"] and min(m["detail_plot_widths"]) > 1000  # sized when their <details> opens
    shot = tmp_path / "first-screen.png"
    proc = subprocess.run([*_chromium_args(tmp_path / "profile2"), f"--screenshot={shot}", html.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert shot.exists() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
