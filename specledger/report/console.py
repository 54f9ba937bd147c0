"""The answer on the console: one line per category, the schedule, the forecast self-check (<= 40 lines for
the default run). The full tables follow only with ``--verbose`` (:func:`print_summary`, and the side
experiments' tables in :mod:`specledger.report.console_experiments`: those of ``specledger run``, ``sweep`` and
``report --verbose``).

Line per category (at load 1, or the SLO's target load)::

    code        deploy ngram γ=4   S 2.00 [1.97–2.03]  E[L] 3.10  resolved (winner): ngram γ=4 beats ...

Every server- or file-supplied string is printed without markup (``markup=False``), so text such as
``[/bold]`` in a category name cannot break the output.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _num(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def decision_text(v: dict[str, Any]) -> str:
    """"deploy ngram γ=4", "off", "no decision", "control"."""
    d = v.get("decision")
    if d == "deploy":
        setting = v.get("setting") or f"{v.get('drafter')} γ={v.get('gamma')}"
        return f"deploy {setting}"
    return {"no-decision": "no decision", "control": "control"}.get(str(d), "off")


def interval_text(lo: Any, hi: Any) -> str:
    """"[1.30–2.24]", or "[no interval]" where a bound is missing (the confidence sequence is unbounded below 4
    prompts)."""
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (lo, hi))
    return f"[{lo:.2f}–{hi:.2f}]" if ok else "[no interval]"


def speedup_text(v: dict[str, Any]) -> str:
    """"S 1.71 [1.30–2.24] n=8": S with its interval and the prompts it rests on (a verdict's ``prompts``); the
    point alone where no prompts are counted (a control, an interval given whole)."""
    s = v.get("speedup")
    if not isinstance(s, (int, float)):
        return "S –"
    lo, hi = (v.get("speedup_ci") or [None, None])[:2]
    n = v.get("prompts")
    if not n:
        return f"S {s:.2f}" + (f" {interval_text(lo, hi)}" if lo is not None and hi is not None else "")
    return f"S {s:.2f} {interval_text(lo, hi)} n={n}"


def comparison_text(c: dict[str, Any]) -> str:
    """"suffix γ=4 / ngram γ=2 1.540 [1.23–1.93] n=8 (a faster)": one paired ratio of a verdict."""
    lo, hi = (c.get("ci") or [None, None])[:2]
    return f"{c['a']} / {c['b']} {_num(c.get('ratio'), 3)} {interval_text(lo, hi)} n={c.get('n')} ({c.get('verdict')})"


def status_text(v: dict[str, Any]) -> str:
    """"resolved (winner)", "open", "no decision", "control"."""
    res = v.get("resolution") or ("resolved" if v.get("resolved") else "open")
    if v.get("decision") in ("control", "no-decision"):
        return ""
    return f"resolved ({res})" if v.get("resolved") else "open"


def category_line(v: dict[str, Any], width: int) -> str:
    """One line: category, decision, S [CI], E[L], resolved or open, and the one reason."""
    el = v.get("mean_committed")
    why = v.get("headline") or v.get("reason") or ""
    if v.get("slo_out_of_reach"):
        why += f"; {v['slo_out_of_reach'].split(';')[0]}"
    status = status_text(v)
    return (f"  {v['category']:<{width}} {decision_text(v):<22} {speedup_text(v):<25} E[L] {_num(el):<5} "
            + (f"{status}: " if status else "") + why)


def _answer_load(summary: dict[str, Any]) -> int:
    target = (summary.get("slo") or {}).get("target_load")
    return int(target) if target else int((summary.get("loads") or [1])[0])


def cell_text(v: dict[str, Any]) -> str:
    """One load of a schedule: "16 → off (S < 1)", "64 sim → ngram γ=2 (open)"."""
    load = f"{v.get('load') or 1}" + (" sim" if v.get("simulated") else "")
    what = decision_text(v).removeprefix("deploy ")
    notes = []
    if not v.get("resolved") and v.get("decision") not in ("control",):
        notes.append("open")
    if v.get("decision") == "off":
        head = str(v.get("headline") or "")
        notes.append("S < 1" if head.startswith("S < 1") else "no gain" if head.startswith("no practical")
                     else "gates" if "fails" in head else "")
    if v.get("slo_out_of_reach"):
        notes.append("SLO out of reach even for plain")
    notes = [n for n in notes if n]
    return f"{load} → {what}" + (f" ({', '.join(notes)})" if notes else "")


def schedule_lines(verdicts: Sequence[dict[str, Any]], width: int) -> list[str]:
    """Per (category, temperature): its decision at every load, in load order, then where each change lies
    between the loads measured and where the configs switch (:func:`specledger.gates.schedule.switch_text`)."""
    from specledger.gates.schedule import switch_text

    by: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for v in verdicts:
        if v.get("decision") != "control":
            by[(v["category"], float(v["temperature"]))].append(v)
    lines = []
    for (cat, _), cells in by.items():
        cells.sort(key=lambda v: (int(v.get("load") or 1), bool(v.get("simulated"))))
        lines.append(f"  {cat:<{width}} " + " · ".join(cell_text(v) for v in cells) + switch_text(cells))
    return lines


def mix_lines(mix: Sequence[dict[str, Any]], width: int) -> list[str]:
    """The one setting for all the traffic (:mod:`specledger.gates.mix`): its shares, then its line in the
    categories' format."""
    lines = []
    for m in mix:
        shares = ", ".join(f"{c} {100 * w:.0f} %" for c, w in (m.get("weights") or {}).items())
        t = f" T={float(m['temperature']):g}" if len(mix) > 1 else ""
        lines.append(f"one setting for all the traffic{t} (shares of requests: {shares}):")
        lines.append(category_line(m, width))
    return lines


def answer_lines(summary: dict[str, Any]) -> list[str]:
    """The console answer as plain lines (see the module doc)."""
    verdicts = summary.get("verdicts") or []
    load = _answer_load(summary)
    here = [v for v in verdicts if int(v.get("load") or 1) == load and not v.get("simulated")]
    temps = sorted({float(v["temperature"]) for v in here})
    meta = summary.get("meta") or {}
    race = meta.get("race") or summary.get("race") or {}
    lines = []
    head = f"specledger: {meta.get('model', 'run')}"
    if race:
        head += (f" — budget {race.get('budget_s', 0):.0f} s, {len(race.get('rounds') or [])} race rounds, "
                 f"{len(race.get('dropped') or [])} settings dropped ({race.get('stopped') or 'stopped'})")
    lines.append(head)
    if (summary.get("disturbance") or {}).get("line"):  # specledger.mainjob.disturbance: quiet, or how disturbed
        lines.append(summary["disturbance"]["line"])
    resolved = [v for v in here if v.get("resolved") and v.get("decision") != "control"]
    decidable = [v for v in here if v.get("decision") != "control"]
    from specledger.report.view import ci_name

    lines.append(f"answer at load {load} (measured; S = speed-up vs plain [{ci_name(summary.get('slo') or {})}] "
                 f"n=prompts; E[L] = tokens per round): {len(resolved)} of {len(decidable)} decisions resolved")
    width = max([len(str(v["category"])) for v in verdicts] + [8])
    for t in temps:
        for v in [v for v in here if float(v["temperature"]) == t]:
            line = category_line(v, width)
            lines.append(line if len(temps) == 1 else line.replace(f"  {v['category']}", f"  {v['category']} T={t:g}",
                                                                   1))
    lines += mix_lines(summary.get("mix") or [], width)
    from specledger.gates.context_schedule import context_line

    for entry in summary.get("context_schedules") or []:
        lines.append(context_line(entry))
        if entry.get("engine_note"):
            lines.append(f"    {entry['engine_note']}")
    loads = sorted({int(v.get("load") or 1) for v in verdicts})
    if len(loads) > 1:
        lines.append("schedule (load → setting; sim = simulated):")
        lines += schedule_lines(verdicts, width)
    if any(s.get("vllm") for s in summary.get("schedules") or []):
        lines.append("paste-ready engine configs (vLLM, TensorRT-LLM, SGLang, llama.cpp): summary.json "
                     "`schedules`, and the report's first screen")
    if (line := self_check_line(summary.get("prediction_check") or {})) is not None:
        lines.append(line)
    bw = meta.get("bandwidth") or {}
    if bw.get("bandwidth"):
        lines.append(f"plain decode ({meta.get('dtype') or 'weights'}): {bw['bandwidth']}")
    return lines


def print_answer(summary: dict[str, Any], console: Console | None = None, verbose: bool = False) -> None:
    """The answer lines; with ``verbose`` the full tables after them."""
    console = console or Console()
    from specledger.probe.safe_text import visible

    for line in answer_lines(summary):  # control characters of file-supplied names shown, never sent raw
        console.print(visible(line), markup=False, highlight=False, soft_wrap=True)
    if verbose:
        print_summary(summary, console)



# ---- the full tables (``--verbose``; ``specledger run`` and ``sweep`` print them too) ----

_STATUS = {"pass": "[green]✓[/]", "fail": "[red]✗[/]", "not assessed": "[dim]–[/]"}


def _f(x: Any, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _pred(s: dict[str, Any]) -> str:
    """The end-to-end predicted S of a setting; ``*`` marks an in-sample figure."""
    value = s.get("predicted_speedup_e2e")
    if value is None:
        return "n/a"
    return f"{value:.3f}" + ("*" if s.get("prediction_kind") == "in sample" else "")


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """Compact table (one row per setting: S with CI, E[L], tok/s, round ms, gates) and the verdicts."""
    console = console or Console()
    from specledger.report.view import ci_name

    name = ci_name(summary.get("slo") or {})
    table = Table(title="specledger: speculative decoding ledger", show_lines=False, header_style="bold")
    for col, justify in (
        ("setting", "left"),
        (f"S [{name}]", "right"),
        ("n", "right"),
        ("pred S (e2e)", "right"),
        ("E[L]", "right"),
        ("tok/s", "right"),
        ("round ms", "right"),
        ("T0·E[L] ms", "right"),
        ("C Q L Cap", "center"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for b in summary.get("baselines", []):
        table.add_row(
            b["label"],
            "1 (ref)",
            "",
            "",
            _f(b["rounds"]["el_full"]),
            _f(b["totals"]["tokens_per_s"], 1),
            _f(b["rounds"]["t_round_ms"]),
            "",
            "",
        )
    for s in summary.get("scenarios", []):
        t0 = s.get("t0_ms")
        el = s["rounds"]["el_full"]
        gates = " ".join(
            _STATUS.get(s.get("gates", {}).get(g, {}).get("status", ""), "?")
            for g in ("correctness", "quality", "latency", "capacity")
        )
        table.add_row(
            s["label"],
            _ci(s, "[no interval]"),
            str(s.get("paired_prompts") or ""),
            _pred(s),
            _f(el),
            _f(s["totals"]["tokens_per_s"], 1),
            _f(s["rounds"]["t_round_ms"]),
            _f(t0 * el if t0 is not None and el is not None else None),
            gates,
        )
    if table.row_count:  # a probe at loads > 1 only has no solo rows
        console.print(table)
        console.print(f"[dim]S: {escape(name)}, n prompts paired with plain; pred S: the end-to-end forecast model "
                      "(prefill and boundary rounds included; the self-check's and the S-vs-γ curves'), fitted without "
                      "that γ; * in sample (the drafter ran one γ only)[/]")
    console.print(
        "[dim]gates: C correctness, Q quality, L latency, Cap capacity (✓ pass, ✗ fail, – not assessed)[/]"
    )
    loads = summary.get("loads") or [1]
    several = len(loads) + len(summary.get("simulated_loads") or []) > 1 or loads != [1]
    for v in [*summary.get("verdicts", []), *summary.get("mix", [])]:  # the categories', then the traffic's as one
        head = (f"deploy {v['drafter']} γ={v['gamma']}" if v["decision"] == "deploy"
                else "control" if v["decision"] == "control" else "off")
        colour = "green" if v["decision"] == "deploy" else "yellow"
        at = f" load {v.get('load') or 1}" + (" (simulated)" if v.get("simulated") else "") if several else ""
        console.print(f"[bold]{v['category']} T={v['temperature']:g}{at}[/]: [{colour}]{head}[/] — "
                      f"{escape(v['reason'])}")
        for c in v.get("comparisons") or []:
            console.print(f"    paired {comparison_text(c)}", markup=False, highlight=False)
    print_load_gates(summary, console)
    schedules = summary.get("schedules", [])
    if schedules:
        sim = summary.get("simulated_loads") or []
        console.print(f"[bold]schedule (load → setting; loads {', '.join(map(str, loads))}"
                      + (f"; simulated {', '.join(map(str, sim))}, marked (sim)" if sim else "") + ")[/]")
        for s in schedules:
            console.print(f"  {s['category']} T={s['temperature']:g}: {escape(s['text'])}", highlight=False)
            if s.get("vllm"):
                console.print(f"    vLLM --speculative-config '{json.dumps(s['vllm'], ensure_ascii=False)}'",
                              highlight=False, markup=False)
                console.print(f"    TensorRT-LLM {json.dumps(s['trtllm'], ensure_ascii=False)}", highlight=False)
    print_prediction_check(summary.get("prediction_check") or {}, console)


def self_check_line(check: dict[str, Any]) -> str | None:
    """The run's forecast self-check in one line: the end-to-end forecast model (the one behind the report's S-vs-γ
    curves and the tables' pred S) with each γ held out, its error against the measured S, and the machine's noise
    beside it; None when nothing was held out."""
    if not check.get("n"):
        return None
    line = (f"forecast self-check (end-to-end forecast model, each γ held out, {check['n']} settings): median "
            f"|error| {100 * check['median_abs_error']:.1f} %, P90 {100 * check['p90_abs_error']:.1f} %")
    noise = check.get("machine_noise")
    if noise:
        line += (f"; plain step P10/P50/P90 {noise['p10_ms']:.1f}/{noise['p50_ms']:.1f}/{noise['p90_ms']:.1f} ms"
                 + (" (busy machine: speed figures unreliable)" if noise.get("busy") else ""))
    return line


def print_prediction_check(check: dict[str, Any], console: Console) -> None:
    """:func:`self_check_line`, printed."""
    if (line := self_check_line(check)) is not None:
        console.print(line, highlight=False)


def print_load_gates(summary: dict[str, Any], console: Console) -> None:
    """One row per setting and load > 1: S with CI and the four gates (evidence in the report)."""
    rows = summary.get("load_scenarios") or []
    if not rows:
        return
    from specledger.report.view import SIMULATED_INTERVAL, ci_name

    table = Table(title="at loads > 1 (continuous batching, closed loop)", header_style="bold")
    for col in ("setting", f"S [{ci_name(summary.get('slo') or {})}; simulated: *]", "n", "C Q L Cap",
                "failed gates (evidence in the report)"):
        table.add_column(col)
    for s in rows:
        gates = " ".join(_STATUS.get(s["gates"][g]["status"], "?")
                         for g in ("correctness", "quality", "latency", "capacity"))
        speed = _ci(s, "[no interval]") + ("*" if s.get("simulated") and s.get("speedup") is not None else "")
        failed = "; ".join(f"{g}: {s['gates'][g]['evidence']}" for g in ("correctness", "quality", "latency",
                                                                             "capacity")
                           if s["gates"][g]["status"] == "fail")
        table.add_row(s["label"], speed, str(s.get("paired_prompts") or ""), gates, escape(failed[:160]))
    console.print(table)
    if any(s.get("simulated") for s in rows):
        console.print(f"[dim]* {SIMULATED_INTERVAL}[/]")


def _ci(row: dict[str, Any], missing: str = "") -> str:
    """"1.708 [1.30, 2.24]": a row's S (3 digits) and its interval; "n/a" without S; S and ``missing`` without an
    interval."""
    lo, hi = row.get("speedup_ci") or (None, None)
    speed = _f(row.get("speedup"), 3)
    if row.get("speedup") is None:
        return speed
    return f"{speed} {missing}".rstrip() if lo is None or hi is None else f"{speed} [{_f(lo)}, {_f(hi)}]"


__all__ = ["answer_lines", "category_line", "print_answer", "print_summary", "schedule_lines"]
