"""The ledger verb's tables: :func:`render_report` prints the dict of
:func:`specledger.ledger.report.ledger_report` (the JSON output) as rich tables, one section per part of
it, so the two outputs can never disagree."""

from __future__ import annotations

from typing import Any

from specledger.ledger.report import MIB
from specledger.ledger.report_types import (
    AcceptanceSectionDict,
    LedgerReportDict,
    MemorySectionDict,
    OptimalSectionDict,
    QuantSectionDict,
    ScenarioDict,
    StepReadDict,
    TreeSectionDict,
)


def widths_text(widths: list[int]) -> str:
    """Run-length text of a width profile: [2, 1, 1, 1] → '2,1×3' (runs of three or more)."""
    parts: list[str] = []
    index = 0
    while index < len(widths):
        run = 1
        while index + run < len(widths) and widths[index + run] == widths[index]:
            run += 1
        parts.append(f"{widths[index]}×{run}" if run > 2 else ",".join([str(widths[index])] * run))
        index += run
    return ",".join(parts)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"



def render_report(report: LedgerReportDict, console: Any) -> None:
    """Print the report dict as rich tables."""
    base = report.get("base_ms")
    if report.get("acceptance") is not None:
        _acceptance(report["acceptance"], base, console)
    for scenario in report.get("scenarios", []):
        _scenario(scenario, base, console)
    if len(report.get("scenarios", [])) > 1:
        _side_by_side(report, console)
    for opt in report.get("optimal", []):
        _optimal(opt, console)
    if report.get("tree") is not None:
        _tree(report["tree"], console)
    if report.get("memory") is not None:
        _memory(report["memory"], console)
    if report.get("quant") is not None:
        _quant(report["quant"], console)


def _acceptance(acc: AcceptanceSectionDict, base: float | None, console: Any) -> None:
    from rich.table import Table

    console.print(f"[bold]Acceptance[/]: {acc['source']}")
    console.print("  conditional a_j:        " + ", ".join(_fmt(v) for v in acc["conditional"]))
    console.print("  Pr(K>=i) (vLLM per-pos): " + ", ".join(_fmt(v) for v in acc["per_position"]))
    console.print(
        "  Pr(K=0..γ):              " + ", ".join(_fmt(v) for v in acc["histogram_probabilities"])
    )
    if acc.get("observed_expected_length") is not None:
        console.print(f"  observed mean K+1:       {_fmt(acc['observed_expected_length'])}")
    table = Table(title="E[L] = 1 + Σ Pr(K≥i)  (bonus token included)")
    for name in ("γ", "E[L]", "E[K] (no bonus)", "ΔE[L] of γ-th"):
        table.add_column(name, justify="right")
    if base is not None:
        table.add_column("break-even round ms (T0·E[L])", justify="right")
    for row in acc["rows"]:
        cells = [
            str(row["gamma"]),
            _fmt(row["expected_length"]),
            _fmt(row["mean_accepted"]),
            _fmt(row["marginal_gain"]),
        ]
        if base is not None:
            cells.append(_fmt(row["break_even_round_ms"], 2))
        table.add_row(*cells)
    console.print(table)


def _scenario(scenario: ScenarioDict, base: float | None, console: Any) -> None:
    from rich.table import Table

    split = any("draft_ms" in row for row in scenario["rows"])
    table = Table(title=f"{scenario['label']}: round ms = {scenario['model']}  (T0 = {base:g} ms)")
    columns = ["γ", "E[L]"] + (["draft", "verify", "other"] if split else []) + [
        "round ms", "ms/token", "speed-up", "pays?",
    ]  # fmt: skip
    for name in columns:
        table.add_column(name, justify="right")
    for row in scenario["rows"]:
        parts = [_fmt(row.get(k), 2) for k in ("draft_ms", "verify_ms", "other_ms")] if split else []
        table.add_row(
            str(row["gamma"]),
            _fmt(row["expected_length"]),
            *parts,
            _fmt(row["round_ms"], 2),
            _fmt(row["ms_per_token"]),
            _fmt(row["speedup"]),
            "yes" if row["pays"] else "no",
        )
    console.print(table)


def _side_by_side(report: LedgerReportDict, console: Any) -> None:
    from rich.table import Table

    scenarios = report["scenarios"]
    table = Table(title="speed-up side by side (pays if > 1)")
    table.add_column("γ", justify="right")
    table.add_column("E[L]", justify="right")
    for scenario in scenarios:
        table.add_column(scenario["label"], justify="right")
    for index, gamma in enumerate(report["gammas"]):
        table.add_row(
            str(gamma),
            _fmt(scenarios[0]["rows"][index]["expected_length"]),
            *(_fmt(s["rows"][index]["speedup"]) for s in scenarios),
        )
    console.print(table)


def _optimal(opt: OptimalSectionDict, console: Any) -> None:
    from rich.table import Table

    best = opt["best"]
    verdict = "plain decoding (speculation off)" if best["gamma"] == 0 else f"γ = {best['gamma']}"
    table = Table(title=f"{opt['label']}: marginal table, γ searched in 0..{opt['max_gamma']}")
    for name in ("γ", "ΔE[L]", "Δcost ms", "ΔE[L]·T0 ms", "speed-up", "ΔS", "cheaper than plain?"):
        table.add_column(name, justify="right")
    for m in opt["marginal"]:
        table.add_row(
            f"{m['gamma_from']}→{m['gamma']}",
            _fmt(m["delta_length"]),
            _fmt(m["delta_cost_ms"], 2),
            _fmt(m["plain_value_ms"], 2),
            _fmt(m["speedup"]),
            f"{m['delta_speedup']:+.3f}",
            "yes" if m["cheaper_than_plain"] else "no",
        )
    console.print(table)
    console.print(
        f"  optimal: {verdict}, E[L] {_fmt(best['expected_length'])}, round {_fmt(best['round_ms'], 2)} ms, "
        f"speed-up {_fmt(best['speedup'])}  (S rises only while ΔE[L]/Δcost > E[L]/T_round)"
    )


def _tree(tree: TreeSectionDict, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"depth vs width at {tree['budget']} candidate nodes")
    for name in ("shape", "nodes", "depth", "width per depth", "E[L]"):
        table.add_column(name, justify="right")
    for row in tree["rows"]:
        table.add_row(
            row["shape"], str(row["nodes"]), str(row["depth"]), widths_text(row["widths"]),
            _fmt(row["expected_length"]),
        )  # fmt: skip
    console.print(table)
    console.print(f"  sibling model: {tree['acceptance_model']}")
    console.print("  p_i: " + ", ".join(_fmt(p, 4) for p in tree["positional"][:8]))


def _memory(memory: MemorySectionDict, console: Any) -> None:
    from rich.table import Table

    console.print(
        f"[bold]KV[/] {memory['model']}: {memory['layers']} layers × 2 × {memory['kv_heads']} kv heads × "
        f"{memory['head_dim']} head_dim × {memory['bytes_per_element']} B = {memory['kv_bytes_per_token']} B/token"
    )
    tree = memory.get("tree")
    rule = "M ≈ B·γ·m_KV" + (", a tree's B·nodes·m_KV" if tree is not None else "")
    table = Table(title=f"extra target KV for candidates, {rule} (B = {memory['batch']})")
    for name in ("γ", "KiB / request", f"MiB for B={memory['batch']}"):
        table.add_column(name, justify="right")
    for row in memory["rows"]:
        table.add_row(
            str(row["gamma"]),
            _fmt(row["candidate_kv_bytes_per_request"] / 1024, 1),
            _fmt(row["candidate_kv_bytes"] / MIB, 2),
        )
    if tree is not None:
        table.add_row(f"tree {tree['nodes']} nodes", _fmt(tree["candidate_kv_bytes_per_request"] / 1024, 1),
                      _fmt(tree["candidate_kv_bytes"] / MIB, 2))
    console.print(table)
    if memory.get("step_read") is not None:
        console.print("  " + step_read_text(memory["step_read"], memory["batch"], memory["kv_bytes_per_token"]))


def step_read_text(read: StepReadDict, batch: int, m_kv: int) -> str:
    """The bytes one step reads, as one line: 'each step reads B·c·m_KV = 4 × 4096 × 46080 B = 720.0 MiB of KV
    at context 4096 (+ 100.0 MiB weights = 820.0 MiB, KV 88 %)'."""
    text = (f"each step (plain or verify round) reads B·c·m_KV = {batch} × {read['context']} × {m_kv} B = "
            f"{read['kv_read_bytes_per_step'] / MIB:.1f} MiB of KV at context {read['context']}")
    if read.get("read_bytes_per_step") is not None:
        share = read["kv_share"]
        text += (f" (+ {read['weight_bytes'] / MIB:.1f} MiB weights = {read['read_bytes_per_step'] / MIB:.1f} MiB"
                 + (f", KV {100 * share:.0f} %)" if share is not None else ")"))
    return text


def _quant(quant: QuantSectionDict, console: Any) -> None:
    from rich.table import Table

    table = Table(title="quantization × speculation: four measurements, one baseline")
    for name in ("setting", "tokens/s", "speed-up vs baseline"):
        table.add_column(name, justify="right")
    for row in quant["rows"]:
        table.add_row(row["setting"], _fmt(row["tokens_per_s"], 1), _fmt(row["speedup"]))
    console.print(table)
    console.print(
        f"  measured combined {_fmt(quant['measured_combined_speedup'])} vs product of singles "
        f"{_fmt(quant['product_of_single_speedups'])} (reference only; interaction {_fmt(quant['interaction'])})"
    )
