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
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specledger.gates.decision import Comparison, Verdict
from specledger.report.summary_model import Summary
from specledger.report.summary_rows import PredictionCheck, SettingRow

if TYPE_CHECKING:
    from specledger.gates.context_schedule import ContextSchedule


def _num(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def decision_text(v: Verdict) -> str:
    """"deploy ngram γ=4", "off", "no decision", "control"."""
    if v.decision == "deploy":
        setting = v.setting or f"{v.drafter} γ={v.gamma}"
        return f"deploy {setting}"
    return {"no-decision": "no decision", "control": "control"}.get(v.decision, "off")


def interval_text(lo: Any, hi: Any) -> str:
    """"[1.30–2.24]", or "[no interval]" where a bound is missing (the confidence sequence is unbounded below 4
    prompts)."""
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (lo, hi))
    return f"[{lo:.2f}–{hi:.2f}]" if ok else "[no interval]"


def speedup_text(v: Verdict) -> str:
    """"S 1.71 [1.30–2.24] n=8": S with its interval and the prompts it rests on (a verdict's ``prompts``); the
    point alone where no prompts are counted (a control, an interval given whole)."""
    s = v.speedup
    if not isinstance(s, (int, float)):
        return "S –"
    lo, hi = v.speedup_ci
    n = v.prompts
    if not n:
        return f"S {s:.2f}" + (f" {interval_text(lo, hi)}" if lo is not None and hi is not None else "")
    return f"S {s:.2f} {interval_text(lo, hi)} n={n}"


def comparison_text(c: Comparison) -> str:
    """"suffix γ=4 / ngram γ=2 1.540 [1.23–1.93] n=8 (a faster)": one paired ratio of a verdict."""
    lo, hi = c.ci
    return f"{c.a} / {c.b} {_num(c.ratio, 3)} {interval_text(lo, hi)} n={c.n} ({c.verdict})"


def status_text(v: Verdict) -> str:
    """"resolved (winner)", "open", "no decision", "control"."""
    res = v.resolution or ("resolved" if v.resolved else "open")
    if v.decision in ("control", "no-decision"):
        return ""
    return f"resolved ({res})" if v.resolved else "open"


def category_line(v: Verdict, width: int) -> str:
    """One line: category, decision, S [CI], E[L], resolved or open, and the one reason."""
    el = v.mean_committed
    why = v.headline or v.reason or ""
    if v.slo_out_of_reach:
        why += f"; {v.slo_out_of_reach.split(';')[0]}"
    status = status_text(v)
    return (f"  {v.category:<{width}} {decision_text(v):<22} {speedup_text(v):<25} E[L] {_num(el):<5} "
            + (f"{status}: " if status else "") + why)


def _answer_load(summary: Summary) -> int:
    target = summary.slo.target_load
    return int(target) if target else int((summary.loads or [1])[0])


def cell_text(v: Verdict) -> str:
    """One load of a schedule: "16 → off (S < 1)", "64 sim → ngram γ=2 (open)"."""
    load = f"{v.load_or_solo}" + (" sim" if v.simulated else "")
    what = decision_text(v).removeprefix("deploy ")
    notes = []
    if not v.resolved and v.decision != "control":
        notes.append("open")
    if v.decision == "off":
        head = v.headline
        notes.append("S < 1" if head.startswith("S < 1") else "no gain" if head.startswith("no practical")
                     else "gates" if "fails" in head else "")
    if v.slo_out_of_reach:
        notes.append("SLO out of reach even for plain")
    notes = [n for n in notes if n]
    return f"{load} → {what}" + (f" ({', '.join(notes)})" if notes else "")


def schedule_lines(verdicts: Sequence[Verdict], width: int) -> list[str]:
    """Per (category, temperature): its decision at every load, in load order, then where each change lies
    between the loads measured and where the configs switch (:func:`specledger.gates.schedule.switch_text`)."""
    from specledger.gates.schedule import switch_text

    by: dict[tuple[str, float], list[Verdict]] = defaultdict(list)
    for v in verdicts:
        if v.decision != "control":
            by[v.key].append(v)
    lines = []
    for (cat, _), cells in by.items():
        cells.sort(key=lambda v: (v.load_or_solo, bool(v.simulated)))
        lines.append(f"  {cat:<{width}} " + " · ".join(cell_text(v) for v in cells)
                     + switch_text(cells))
    return lines


def mix_lines(mix: Sequence[Verdict], width: int) -> list[str]:
    """The one setting for all the traffic (:mod:`specledger.gates.mix`): its shares, then its line in the
    categories' format."""
    lines = []
    for m in mix:
        shares = ", ".join(f"{c} {100 * w:.0f} %" for c, w in (m.weights or {}).items())
        t = f" T={float(m.temperature):g}" if len(mix) > 1 else ""
        lines.append(f"one setting for all the traffic{t} (shares of requests: {shares}):")
        lines.append(category_line(m, width))
    return lines


def answer_lines(summary: Summary | dict[str, Any]) -> list[str]:
    """The console answer as plain lines (see the module doc) of a summary, or of ``summary.json``'s content."""
    summary = Summary.read(summary)
    verdicts = summary.verdicts
    load = _answer_load(summary)
    here = [v for v in verdicts if v.load_or_solo == load and not v.simulated]
    temps = sorted({float(v.temperature) for v in here})
    meta = summary.meta
    race = meta.race or summary.race
    lines = []
    head = f"specledger: {meta.model if meta.model is not None else 'run'}"
    if race:
        head += (f" — budget {race.budget_s:.0f} s, {len(race.rounds)} race rounds, "
                 f"{len(race.dropped)} settings dropped ({race.stopped or 'stopped'})")
    lines.append(head)
    if summary.disturbance and summary.disturbance.line:  # specledger.mainjob.disturbance: quiet, or how disturbed
        lines.append(summary.disturbance.line)
    resolved = [v for v in here if v.resolved and v.decision != "control"]
    decidable = [v for v in here if v.decision != "control"]
    from specledger.report.view import ci_name

    lines.append(f"answer at load {load} (measured; S = speed-up vs plain [{ci_name(summary.slo)}] "
                 f"n=prompts; E[L] = tokens per round): {len(resolved)} of {len(decidable)} decisions resolved")
    width = max([len(str(v.category)) for v in verdicts] + [8])
    for t in temps:
        for v in [v for v in here if float(v.temperature) == t]:
            line = category_line(v, width)
            lines.append(line if len(temps) == 1 else line.replace(f"  {v.category}", f"  {v.category} T={t:g}", 1))
    lines += mix_lines(summary.mix, width)
    from specledger.gates.context_schedule import context_line

    for entry in summary.context_schedules:
        lines.append(context_line(cast("ContextSchedule", entry.model_dump())))
        if entry.engine_note:
            lines.append(f"    {entry.engine_note}")
    loads = sorted({v.load_or_solo for v in verdicts})
    if len(loads) > 1:
        lines.append("schedule (load → setting; sim = simulated):")
        lines += schedule_lines(verdicts, width)
    if any(s.vllm for s in summary.schedules):
        lines.append("paste-ready engine configs (vLLM, TensorRT-LLM, SGLang, llama.cpp): summary.json "
                     "`schedules`, and the report's first screen")
    if (line := self_check_line(summary.prediction_check)) is not None:
        lines.append(line)
    if meta.bandwidth is not None and meta.bandwidth.bandwidth:
        lines.append(f"plain decode ({meta.dtype or 'weights'}): {meta.bandwidth.bandwidth}")
    return lines


def print_answer(summary: Summary | dict[str, Any], console: Console | None = None, verbose: bool = False) -> None:
    """The answer lines of a summary (or of ``summary.json``'s content); with ``verbose`` the full tables after
    them."""
    summary = Summary.read(summary)
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


def _pred(s: SettingRow) -> str:
    """The end-to-end predicted S of a setting; ``*`` marks an in-sample figure."""
    value = s.predicted_speedup_e2e
    if value is None:
        return "n/a"
    return f"{value:.3f}" + ("*" if s.prediction_kind == "in sample" else "")


def _gate_marks(s: SettingRow) -> str:
    """The four gates' outcomes as marks (C Q L Cap)."""
    return " ".join(_STATUS.get(s.gates[g].status if g in s.gates else "", "?")
                    for g in ("correctness", "quality", "latency", "capacity"))


def print_summary(summary: Summary | dict[str, Any], console: Console | None = None) -> None:
    """Compact table (one row per setting: S with CI, E[L], tok/s, round ms, gates) and the verdicts, of a summary
    (or of ``summary.json``'s content)."""
    summary = Summary.read(summary)
    console = console or Console()
    from specledger.report.view import ci_name

    name = ci_name(summary.slo)
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
    for b in summary.baselines:
        table.add_row(b.label, "1 (ref)", "", "", _f(b.rounds.el_full), _f(b.totals.tokens_per_s, 1),
                      _f(b.rounds.t_round_ms), "", "")
    for s in summary.scenarios:
        t0, el = s.t0_ms, s.rounds.el_full
        table.add_row(s.label, _ci(s.speedup, s.speedup_ci, "[no interval]"), str(s.paired_prompts or ""), _pred(s),
                      _f(el), _f(s.totals.tokens_per_s, 1), _f(s.rounds.t_round_ms),
                      _f(t0 * el if t0 is not None and el is not None else None), _gate_marks(s))
    if table.row_count:  # a probe at loads > 1 only has no solo rows
        console.print(table)
        console.print(f"[dim]S: {escape(name)}, n prompts paired with plain; pred S: the end-to-end forecast model "
                      "(prefill and boundary rounds included; the self-check's and the S-vs-γ curves'), fitted without "
                      "that γ; * in sample (the drafter ran one γ only)[/]")
    console.print(
        "[dim]gates: C correctness, Q quality, L latency, Cap capacity (✓ pass, ✗ fail, – not assessed)[/]"
    )
    loads = summary.loads or [1]
    several = len(loads) + len(summary.simulated_loads) > 1 or loads != [1]
    for v in [*summary.verdicts, *summary.mix]:  # the categories', then the traffic's as one
        head = (f"deploy {v.drafter} γ={v.gamma}" if v.decision == "deploy"
                else "control" if v.decision == "control" else "off")
        colour = "green" if v.decision == "deploy" else "yellow"
        at = f" load {v.load_or_solo}" + (" (simulated)" if v.simulated else "") if several else ""
        console.print(f"[bold]{v.category} T={v.temperature:g}{at}[/]: [{colour}]{head}[/] — {escape(v.reason)}")
        for c in v.comparisons:
            console.print(f"    paired {comparison_text(c)}", markup=False, highlight=False)
    print_load_gates(summary, console)
    if summary.schedules:
        sim = summary.simulated_loads
        console.print(f"[bold]schedule (load → setting; loads {', '.join(map(str, loads))}"
                      + (f"; simulated {', '.join(map(str, sim))}, marked (sim)" if sim else "") + ")[/]")
        for sch in summary.schedules:
            console.print(f"  {sch.category} T={sch.temperature:g}: {escape(sch.text)}", highlight=False)
            if sch.vllm:
                console.print(f"    vLLM --speculative-config '{json.dumps(sch.vllm, ensure_ascii=False)}'",
                              highlight=False, markup=False)
                console.print(f"    TensorRT-LLM {json.dumps(sch.trtllm, ensure_ascii=False)}", highlight=False)
    print_prediction_check(summary.prediction_check, console)


def self_check_line(check: PredictionCheck) -> str | None:
    """The run's forecast self-check in one line: the end-to-end forecast model (the one behind the report's S-vs-γ
    curves and the tables' pred S) with each γ held out, its error against the measured S, and the machine's noise
    beside it; None when nothing was held out."""
    if not check.n:
        return None
    line = (f"forecast self-check (end-to-end forecast model, each γ held out, {check.n} settings): median "
            f"|error| {100 * check.median_abs_error:.1f} %, P90 {100 * check.p90_abs_error:.1f} %")  # type: ignore[operator]
    noise = check.machine_noise
    if noise:
        line += (f"; plain step P10/P50/P90 {noise.p10_ms:.1f}/{noise.p50_ms:.1f}/{noise.p90_ms:.1f} ms"
                 + (" (busy machine: speed figures unreliable)" if noise.busy else ""))
    return line


def print_prediction_check(check: PredictionCheck, console: Console) -> None:
    """:func:`self_check_line`, printed."""
    if (line := self_check_line(check)) is not None:
        console.print(line, highlight=False)


def print_load_gates(summary: Summary, console: Console) -> None:
    """One row per setting and load > 1: S with CI and the four gates (evidence in the report)."""
    rows = summary.load_scenarios
    if not rows:
        return
    from specledger.report.view import SIMULATED_INTERVAL, ci_name

    table = Table(title="at loads > 1 (continuous batching, closed loop)", header_style="bold")
    for col in ("setting", f"S [{ci_name(summary.slo)}; simulated: *]", "n", "C Q L Cap",
                "failed gates (evidence in the report)"):
        table.add_column(col)
    gates = ("correctness", "quality", "latency", "capacity")
    for s in rows:
        marks = " ".join(_STATUS.get(s.gates[g].status, "?") for g in gates)
        speed = _ci(s.speedup, s.speedup_ci, "[no interval]") + ("*" if s.simulated and s.speedup is not None else "")
        failed = "; ".join(f"{g}: {s.gates[g].evidence}" for g in gates if s.gates[g].status == "fail")
        table.add_row(s.label, speed, str(s.paired_prompts or ""), marks, escape(failed[:160]))
    console.print(table)
    if any(s.simulated for s in rows):
        console.print(f"[dim]* {SIMULATED_INTERVAL}[/]")


def _ci(speedup: float | None, ci: Sequence[float | None] | None, missing: str = "") -> str:
    """"1.708 [1.30, 2.24]": an S (3 digits) and its interval; "n/a" without S; S and ``missing`` without an
    interval."""
    lo, hi = ci or (None, None)
    text = _f(speedup, 3)
    if speedup is None:
        return text
    return f"{text} {missing}".rstrip() if lo is None or hi is None else f"{text} [{_f(lo)}, {_f(hi)}]"


__all__ = ["answer_lines", "category_line", "print_answer", "print_summary", "schedule_lines"]
