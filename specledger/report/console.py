"""The answer on the console: one line per category, the schedule, the forecast self-check (<= 40 lines for
the default run). The full tables follow only with ``--verbose`` (:func:`print_summary`, :func:`print_experiments`:
the tables of ``specledger run``, ``sweep`` and ``report --verbose``).

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
    lines += mix_lines(summary.get("mix") or [], width)
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
    table = Table(title="specledger: speculative decoding ledger", show_lines=False, header_style="bold")
    for col, justify in (
        ("setting", "left"),
        ("S [95% CI]", "right"),
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
            _f(b["rounds"]["el_full"]),
            _f(b["totals"]["tokens_per_s"], 1),
            _f(b["rounds"]["t_round_ms"]),
            "",
            "",
        )
    for s in summary.get("scenarios", []):
        lo, hi = s.get("speedup_ci") or (None, None)
        t0 = s.get("t0_ms")
        el = s["rounds"]["el_full"]
        gates = " ".join(
            _STATUS.get(s.get("gates", {}).get(g, {}).get("status", ""), "?")
            for g in ("correctness", "quality", "latency", "capacity")
        )
        speed = "n/a" if s.get("speedup") is None else f"{s['speedup']:.3f} [{_f(lo, 2)}, {_f(hi, 2)}]"
        table.add_row(
            s["label"],
            speed,
            _pred(s),
            _f(el),
            _f(s["totals"]["tokens_per_s"], 1),
            _f(s["rounds"]["t_round_ms"]),
            _f(t0 * el if t0 is not None and el is not None else None),
            gates,
        )
    if table.row_count:  # a probe at loads > 1 only has no solo rows
        console.print(table)
        console.print("[dim]pred S: the end-to-end performance model (prefill and boundary rounds included), fitted "
                      "without that γ; * in sample (the drafter ran one γ only)[/]")
    console.print(
        "[dim]gates: C correctness, Q quality, L latency, Cap capacity (✓ pass, ✗ fail, – not assessed)[/]"
    )
    loads = summary.get("loads") or [1]
    several = len(loads) + len(summary.get("simulated_loads") or []) > 1 or loads != [1]
    for v in summary.get("verdicts", []):
        head = (f"deploy {v['drafter']} γ={v['gamma']}" if v["decision"] == "deploy"
                else "control" if v["decision"] == "control" else "off")
        colour = "green" if v["decision"] == "deploy" else "yellow"
        at = f" load {v.get('load') or 1}" + (" (simulated)" if v.get("simulated") else "") if several else ""
        console.print(f"[bold]{v['category']} T={v['temperature']:g}{at}[/]: [{colour}]{head}[/] — "
                      f"{escape(v['reason'])}")
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


def print_prediction_check(check: dict[str, Any], console: Console) -> None:
    """One line: the run's leave-one-γ-out forecast error, with the machine's noise beside it."""
    if not check.get("n"):
        return
    line = (f"forecast self-check (leave one γ out, {check['n']} settings): median |error| "
            f"{100 * check['median_abs_error']:.1f} %, P90 {100 * check['p90_abs_error']:.1f} %")
    noise = check.get("machine_noise")
    if noise:
        line += (f"; machine noise: plain step P10/P50/P90 {noise['p10_ms']:.1f}/{noise['p50_ms']:.1f}/"
                 f"{noise['p90_ms']:.1f} ms" + (" (busy: speed figures unreliable)" if noise["busy"] else ""))
    console.print(line, highlight=False)


def print_load_gates(summary: dict[str, Any], console: Console) -> None:
    """One row per setting and load > 1: S with CI and the four gates (evidence in the report)."""
    rows = summary.get("load_scenarios") or []
    if not rows:
        return
    table = Table(title="at loads > 1 (continuous batching, closed loop)", header_style="bold")
    for col in ("setting", "S [95% CI]", "C Q L Cap", "failed gates (evidence in the report)"):
        table.add_column(col)
    for s in rows:
        lo, hi = s.get("speedup_ci") or (None, None)
        gates = " ".join(_STATUS.get(s["gates"][g]["status"], "?")
                         for g in ("correctness", "quality", "latency", "capacity"))
        speed = "n/a" if s.get("speedup") is None else f"{s['speedup']:.3f} [{_f(lo)}, {_f(hi)}]"
        failed = "; ".join(f"{g}: {s['gates'][g]['evidence']}" for g in ("correctness", "quality", "latency",
                                                                             "capacity")
                           if s["gates"][g]["status"] == "fail")
        table.add_row(s["label"], speed, gates, escape(failed[:160]))
    console.print(table)


def _ci(row: dict[str, Any]) -> str:
    lo, hi = row.get("speedup_ci") or (None, None)
    speed = _f(row.get("speedup"), 3)
    return speed if lo is None or hi is None else f"{speed} [{_f(lo)}, {_f(hi)}]"


def _same(row: dict[str, Any]) -> str:
    c = row.get("correctness")
    if not c:
        return "ref"
    colour = "green" if c["all_identical"] else "red"
    return f"[{colour}]{c['identical']}/{c['of']}[/]"


def print_experiments(summary: dict[str, Any], console: Console | None = None) -> None:
    """Tables of the side experiments in ``summary["experiments"]`` (quantization four-way, policies,
    serving with its deploy table)."""
    console = console or Console()
    experiments = summary.get("experiments") or {}
    q = experiments.get("quantization")
    if q:
        picks = q.get("drafters") or {}
        drafters = ", ".join(f"{t} {p['label']}" for t, p in picks.items()) or f"{q['drafter']} γ={q['gamma']}"
        table = Table(title=f"quantization four-way ({drafters}, {len(q['prompts'])} prompts)", header_style="bold")
        for col in ("setting", "tok/s", "S vs fp32 plain [95% CI]", "E[L]", "identical to verifier", "task score"):
            table.add_column(col, justify="left" if col == "setting" else "right")
        for r in q["settings"]:
            table.add_row(r["setting"], _f(r["tokens_per_s"], 1), _ci(r), _f(r["el_full"]) if r["speculative"] else "1",
                          _same(r), _f(r.get("quality_mean"), 3))
        console.print(table)
        for line in q.get("statements", []):
            console.print(f"  {line}")
    p = experiments.get("policies")
    if p:
        table = Table(title=f"speculation-length policies ({p['drafter']}, {len(p['prompts'])} prompts)",
                      header_style="bold")
        for col in ("setting", "tok/s", "S [95% CI]", "mean γ", "E[L]", "accept", "identical"):
            table.add_column(col, justify="left" if col == "setting" else "right")
        for r in p["settings"]:
            table.add_row(r["setting"], _f(r["tokens_per_s"], 1), _ci(r), _f(r["mean_gamma"]), _f(r["el_full"]),
                          _f(r["acceptance_rate"], 3), _same(r))
        console.print(table)
        if p.get("goodput_vs_best_static"):
            console.print(f"  {p['goodput_vs_best_static']['statement']}")
    if experiments.get("serving"):
        print_serving(experiments["serving"], console)
    if experiments.get("probe") or experiments.get("vllm_bench") or experiments.get("guidellm"):
        print_endpoint_figures(experiments, console)


def _bytes(x: Any) -> str:
    if x is None:
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B"


def _load(row: dict[str, Any]) -> str:
    """Compact load label: c=4 (concurrency), 2 req/s (Poisson rate), ctx 1024 (context length)."""
    kind, load = row.get("kind"), row.get("load")
    where = f" {row['source']} c={row.get('concurrency')}" if kind == "context" and row.get("source") else ""
    return {"concurrency": f"c={load}", "rate": f"{load:g} req/s" if isinstance(load, (int, float)) else str(load),
            "context": f"ctx {load}{where}"}.get(kind, f"{kind} {load}")


def _q(point: dict[str, Any], key: str, q: str, digits: int = 1) -> str:
    return _f((point.get(key) or {}).get(q), digits)


def print_serving(serving: dict[str, Any], console: Console) -> None:
    """The serving experiment: one row per (load, setting), the crossover per drafter, the memory
    ledger and the per-load deploy table with the best drafter's batch-size schedule."""
    points = [*serving.get("concurrency", []), *serving.get("rate", []), *serving.get("context", [])]
    reps = serving.get("repeats") or 1
    table = Table(title=f"serving under load ({len(serving.get('prompts', []))} prompts, "
                        f"{serving.get('max_tokens')} tokens each"
                        + (f", {reps} repeats, S with 95% interval)" if reps > 1 else ")"), header_style="bold")
    for col in ("load", "setting", "tok/s", "S", "TTFT P50", "TPOT P50", "chunk ITL P99", "stall ms",
                "tok/chunk", "batch", "preempt"):
        table.add_column(col, justify="left" if col in ("load", "setting") else "right")
    for p in points:
        colour = "" if p.get("speedup") is None or p["drafter"] == "none" else (
            "green" if p["speedup"] > 1 else "red")
        speed = _f(p.get("speedup"), 3)
        if p.get("speedup_ci") and p["drafter"] != "none":
            speed += f" [{_f(p['speedup_ci'][0], 2)}, {_f(p['speedup_ci'][1], 2)}]"
        table.add_row(_load(p), p.get("setting", p["drafter"]), _f(p["throughput_tok_s"], 1),
                      f"[{colour}]{speed}[/]" if colour else speed, _q(p, "ttft_ms", "p50"), _q(p, "tpot_ms", "p50", 2),
                      _q(p, "itl_chunk_ms", "p99"), _f(p.get("longest_stall_ms"), 1),
                      _f((p.get("tokens_per_chunk") or {}).get("mean")), _f(p.get("mean_batch")),
                      str(p.get("preemptions", 0)))
    console.print(table)
    for kind, by_setting in (serving.get("crossover") or {}).items():
        parts = [f"{name}: {'< 1 from ' + str(c) if c is not None else 'never below 1'}"
                 for name, c in by_setting.items()]
        console.print(f"  crossover ({kind}): " + "; ".join(parts))
    for r in serving.get("context_crossover") or []:
        c = r["crossover_concurrency"]
        by = ", ".join(f"c={k}: {_f(v, 2)}" for k, v in r["speedup_by_concurrency"].items())
        console.print(f"  crossover at ctx {r['length']} ({r['source']}) {r['setting']}: "
                      f"{'< 1 from c=' + str(c) if c is not None else 'never below 1'} ({by})")
    ledger = Table(title="memory ledger: candidate KV", header_style="bold")
    for col in ("load", "setting", "B", "γ", "predicted B·γ·m_KV", "engine peak", "rel. diff", "slot cache"):
        ledger.add_column(col, justify="left" if col in ("load", "setting") else "right")
    for p in points:
        m = p.get("memory")
        if m:
            rel = m.get("relative_difference")
            ledger.add_row(_load(p), p.get("setting", ""), str(m.get("batch", "")),
                           str(m.get("gamma", "")), _bytes(m["predicted_candidate_kv_bytes"]),
                           _bytes(m["engine_peak_candidate_kv_bytes"]),
                           "n/a" if rel is None else f"{100 * rel:+.1f}%", _bytes(m["static_slot_cache_bytes"]))
    if ledger.rows:
        console.print(ledger)
    print_policy_vs_static(serving, console)
    print_deploy_table(serving, console)


def print_policy_vs_static(serving: dict[str, Any], console: Console) -> None:
    """Each dynamic policy / the best static choice (plain or a static γ) in hindsight, per load."""
    rows = serving.get("policy_vs_static") or []
    if not rows:
        return
    table = Table(title="dynamic γ policies vs the best static γ in hindsight (same load, same requests)",
                  header_style="bold")
    for col in ("load", "policy", "best static", "ratio", "95% interval", "at least as good?"):
        table.add_column(col, justify="right" if col in ("ratio", "95% interval") else "left")
    for r in rows:
        ci = f"[{_f(r['ci'][0], 3)}, {_f(r['ci'][1], 3)}]" if r.get("ci") else "n/a (1 run)"
        table.add_row(_load(r), r["policy"], r["best_static"], _f(r.get("ratio"), 3), ci,
                      "[green]yes[/]" if r["at_least_as_good"] else "[red]no[/]")
    console.print(table)


def print_deploy_table(serving: dict[str, Any], console: Console) -> None:
    """Per load: deploy <drafter γ> or off; then the best drafter's {concurrency: γ} and engine configs."""
    table = Table(title="deploy table: what to run at each load", header_style="bold")
    for col in ("load", "decision", "γ", "best candidate", "its S", "tok/s"):
        table.add_column(col, justify="left" if col in ("load", "decision", "best candidate") else "right")
    for r in serving.get("deploy_table", []):
        on = r["decision"] == "deploy"
        table.add_row(_load(r), f"[green]deploy {r['drafter']}[/]" if on else "[yellow]off[/]",
                      str(r["gamma"]) if on else "off", r.get("best_candidate") or "n/a", _f(r.get("speedup"), 3),
                      _f(r.get("throughput_tok_s"), 1))
    console.print(table)
    d = serving.get("deploy") or {}
    if d.get("best_drafter"):
        schedule = ", ".join(f"{c}: {k}" for c, k in d["gamma_by_concurrency"].items())
        console.print(f"  best drafter overall: {d['best_drafter']} γ={d['gamma']}; γ by concurrency {{{schedule}}}")
        vllm = d.get("vllm") or {}
        if vllm.get("speculative_config"):
            console.print(f"  vLLM: --speculative-config '{json.dumps(vllm['speculative_config'])}'", soft_wrap=True,
                          markup=False)
        if vllm.get("note"):
            console.print(f"  [dim]{escape(vllm['note'])}[/]")
        console.print(f"  [dim]SGLang: {escape(d.get('sglang_note', ''))}[/]")


def print_endpoint_figures(experiments: dict[str, Any], console: Console) -> None:
    """Endpoint figures of ``specledger probe`` / ``import-vllm-bench``: one row per endpoint (client-side
    throughput and latency, server-side acceptance from /metrics) and the server-wide warnings."""
    views = list((experiments.get("probe") or {}).get("endpoints") or [])
    for key, role in (("vllm_bench", "vllm bench"), ("guidellm", "guidellm")):
        if experiments.get(key):
            views.append({"role": role, "url": experiments[key].get("source_file"), **experiments[key]})
    table = Table(title="endpoint figures (client-side timings, server-wide acceptance)", header_style="bold")
    for col in ("endpoint", "tok/s", "TTFT P99", "TPOT P50", "chunk ITL P99", "E[L] reported", "E[L] 1+ΣPr(K≥i)",
                "a_i"):
        table.add_column(col, justify="left" if col in ("endpoint", "a_i") else "right")
    for v in views:
        s, led = v.get("summary") or {}, v.get("acceptance_ledger") or {}
        table.add_row(f"{v.get('role')} {v.get('url') or ''}", _f(s.get("output_throughput_tok_s"), 1),
                      _f((s.get("ttft_ms") or {}).get("p99"), 1), _f((s.get("tpot_ms") or {}).get("p50")),
                      _f((s.get("chunk_itl_ms") or {}).get("p99"), 1), _f(led.get("el_reported"), 3),
                      _f(led.get("el_from_per_position"), 3),
                      " ".join(_f(a, 2) for a in led.get("conditional_a") or []) or "n/a")
    console.print(table)
    notes = [w for v in views for w in v.get("warnings") or []] + [v["note"] for v in views[-1:] if v.get("note")]
    for note in dict.fromkeys(notes):
        console.print(f"  [dim]{escape(note)}[/]")


__all__ = ["answer_lines", "category_line", "print_answer", "print_deploy_table", "print_experiments",
           "print_summary", "schedule_lines"]
