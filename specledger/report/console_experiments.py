"""The side experiments on the console (``specledger sweep`` and ``run --full``): quantization, policies, serving under
load with its deploy table, and endpoint figures."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specledger.engine.drafters.catalog import PLAIN
from specledger.report.console import _ci, _f

if TYPE_CHECKING:
    from specledger.bench.experiment import IdenticalDict
    from specledger.bench.serving_types import (
        DeployRowDict,
        LatencyFigures,
        PolicyVsStaticDict,
        ServingDocDict,
        ServingPointDict,
    )

    #: a row of a load point's table: where it sits is its kind, load and (a context point) source and concurrency
    LoadRow = ServingPointDict | PolicyVsStaticDict | DeployRowDict


def _same(c: IdenticalDict | None) -> str:
    """"3/3" in green where every output equals the verifier's, red where one differs; "ref" for the reference."""
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
        for col in ("setting", "tok/s", "S vs fp32 plain [95% bootstrap CI]", "E[L]", "identical to verifier",
                    "task score"):
            table.add_column(col, justify="left" if col == "setting" else "right")
        for r in q["settings"]:
            table.add_row(r["setting"], _f(r["tokens_per_s"], 1), _ci(r.get("speedup"), r.get("speedup_ci")),
                          _f(r["el_full"]) if r["speculative"] else "1", _same(r.get("correctness")),
                          _f(r.get("quality_mean"), 3))
        console.print(table)
        for line in q.get("statements", []):
            console.print(f"  {line}")
    p = experiments.get("policies")
    if p:
        table = Table(title=f"speculation-length policies ({p['drafter']}, {len(p['prompts'])} prompts)",
                      header_style="bold")
        for col in ("setting", "tok/s", "S [95% bootstrap CI]", "mean γ", "E[L]", "accept", "identical"):
            table.add_column(col, justify="left" if col == "setting" else "right")
        for r in p["settings"]:
            table.add_row(r["setting"], _f(r["tokens_per_s"], 1), _ci(r.get("speedup"), r.get("speedup_ci")),
                          _f(r["mean_gamma"]), _f(r["el_full"]), _f(r["acceptance_rate"], 3),
                          _same(r.get("correctness")))
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


def _load(row: LoadRow) -> str:
    """Compact load label: c=4 (concurrency), 2 req/s (Poisson rate), ctx 1024 (context length)."""
    kind, load = row.get("kind"), row.get("load")
    where = f" {row['source']} c={row.get('concurrency')}" if kind == "context" and row.get("source") else ""
    return {"concurrency": f"c={load}", "rate": f"{load:g} req/s" if isinstance(load, (int, float)) else str(load),
            "context": f"ctx {load}{where}"}.get(kind, f"{kind} {load}")


def _q(figures: LatencyFigures | None, q: str, digits: int = 1) -> str:
    """One statistic ``q`` ("p50", "p99") of a latency distribution, "n/a" without it."""
    return _f((figures or {}).get(q), digits)


def print_serving(serving: ServingDocDict, console: Console) -> None:
    """The serving experiment: one row per (load, setting), the crossover per drafter, the memory
    ledger and the per-load deploy table with the best drafter's batch-size schedule."""
    points = [*serving.get("concurrency", []), *serving.get("rate", []), *serving.get("context", [])]
    reps = serving.get("repeats") or 1
    table = Table(title=f"serving under load ({len(serving.get('prompts', []))} prompts, "
                        f"{serving.get('max_tokens')} tokens each"
                        + (f", {reps} repeats, S with its 95% t-interval over repeats)" if reps > 1 else ")"),
                  header_style="bold")
    for col in ("load", "setting", "tok/s", "S", "TTFT P50", "TPOT P50", "chunk ITL P99", "stall ms",
                "tok/chunk", "batch", "preempt"):
        table.add_column(col, justify="left" if col in ("load", "setting") else "right")
    for p in points:
        colour = "" if p.get("speedup") is None or p["drafter"] == PLAIN.name else (
            "green" if p["speedup"] > 1 else "red")
        speed = _f(p.get("speedup"), 3)
        if p.get("speedup_ci") and p["drafter"] != PLAIN.name:
            speed += f" [{_f(p['speedup_ci'][0], 2)}, {_f(p['speedup_ci'][1], 2)}]"
        table.add_row(_load(p), p.get("setting", p["drafter"]), _f(p["throughput_tok_s"], 1),
                      f"[{colour}]{speed}[/]" if colour else speed, _q(p.get("ttft_ms"), "p50"),
                      _q(p.get("tpot_ms"), "p50", 2), _q(p.get("itl_chunk_ms"), "p99"),
                      _f(p.get("longest_stall_ms"), 1),
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


def print_policy_vs_static(serving: ServingDocDict, console: Console) -> None:
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


def print_deploy_table(serving: ServingDocDict, console: Console) -> None:
    """Per load: deploy <drafter γ> or off; then the best drafter's {concurrency: γ} and engine configs."""
    table = Table(title="deploy table: what to run at each load", header_style="bold")
    for col in ("load", "decision", "γ", "best candidate", "its S", "tok/s"):
        table.add_column(col, justify="left" if col in ("load", "decision", "best candidate") else "right")
    for r in serving.get("deploy_table", []):
        on = r.get("drafter") is not None  # the deploy table names a drafter exactly where it deploys one
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
