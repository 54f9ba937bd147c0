"""The answer on the console: one line per category, the schedule, the forecast self-check (<= 40 lines for
the default run). The full tables follow only with ``--verbose`` (:func:`specledger.report.cli.print_summary`).

Line per category (at load 1, or the SLO's target load)::

    code        deploy ngram γ=4   S 2.00 [1.97–2.03]  E[L] 3.10  resolved (winner): ngram γ=4 beats ...

Every server- or file-supplied string is printed without markup (``markup=False``), so text such as
``[/bold]`` in a category name cannot break the output.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from rich.console import Console


def _num(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def decision_text(v: dict[str, Any]) -> str:
    """"deploy ngram γ=4", "off", "no decision", "control"."""
    d = v.get("decision")
    if d == "deploy":
        setting = v.get("setting") or f"{v.get('drafter')} γ={v.get('gamma')}"
        return f"deploy {setting}"
    return {"no-decision": "no decision", "control": "control"}.get(str(d), "off")


def speedup_text(v: dict[str, Any]) -> str:
    s = v.get("speedup")
    if not isinstance(s, (int, float)):
        return "S –"
    lo, hi = (v.get("speedup_ci") or [None, None])[:2]
    return f"S {s:.2f}" + (f" [{_num(lo)}–{_num(hi)}]" if lo is not None and hi is not None else "")


def status_text(v: dict[str, Any]) -> str:
    """"resolved (winner)", "open", "no decision", "control"."""
    res = v.get("resolution") or ("resolved" if v.get("resolved") else "open")
    if v.get("decision") in ("control", "no-decision"):
        return ""
    return f"resolved ({res})" if v.get("resolved") else "open"


def category_line(v: dict[str, Any], width: int) -> str:
    """One line: category, decision, S [90 % CI], E[L], resolved or open, and the one reason."""
    el = v.get("mean_committed")
    why = v.get("headline") or v.get("reason") or ""
    if v.get("slo_out_of_reach"):
        why += f"; {v['slo_out_of_reach'].split(';')[0]}"
    status = status_text(v)
    return (f"  {v['category']:<{width}} {decision_text(v):<22} {speedup_text(v):<20} E[L] {_num(el):<5} "
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
    """Per (category, temperature): its decision at every load, in load order."""
    by: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for v in verdicts:
        if v.get("decision") != "control":
            by[(v["category"], float(v["temperature"]))].append(v)
    lines = []
    for (cat, _), cells in by.items():
        cells.sort(key=lambda v: (int(v.get("load") or 1), bool(v.get("simulated"))))
        lines.append(f"  {cat:<{width}} " + " · ".join(cell_text(v) for v in cells))
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
    resolved = [v for v in here if v.get("resolved") and v.get("decision") != "control"]
    decidable = [v for v in here if v.get("decision") != "control"]
    lines.append(f"answer at load {load} (measured; S = speed-up vs plain, 90 % CI; E[L] = tokens per round): "
                 f"{len(resolved)} of {len(decidable)} decisions resolved")
    width = max([len(str(v["category"])) for v in verdicts] + [8])
    for t in temps:
        for v in [v for v in here if float(v["temperature"]) == t]:
            line = category_line(v, width)
            lines.append(line if len(temps) == 1 else line.replace(f"  {v['category']}", f"  {v['category']} T={t:g}",
                                                                   1))
    loads = sorted({int(v.get("load") or 1) for v in verdicts})
    if len(loads) > 1:
        lines.append("schedule (load → setting; sim = simulated):")
        lines += schedule_lines(verdicts, width)
    if any(s.get("vllm") for s in summary.get("schedules") or []):
        lines.append("paste-ready engine configs (vLLM, TensorRT-LLM, SGLang, llama.cpp): summary.json "
                     "`schedules`, and the report's first screen")
    check = summary.get("prediction_check") or {}
    if check.get("n"):
        line = (f"forecast self-check (leave one γ out, {check['n']} settings): median |error| "
                f"{100 * check['median_abs_error']:.1f} %, P90 {100 * check['p90_abs_error']:.1f} %")
        noise = check.get("machine_noise")
        if noise:
            line += (f"; plain step P10/P50/P90 {noise['p10_ms']:.1f}/{noise['p50_ms']:.1f}/{noise['p90_ms']:.1f} ms"
                     + (" (busy machine: speed figures unreliable)" if noise.get("busy") else ""))
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
        from specledger.report.cli import print_summary

        print_summary(summary, console)


__all__ = ["answer_lines", "category_line", "print_answer", "schedule_lines"]
