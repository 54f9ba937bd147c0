"""``specledger ledger``: the performance ledger (E[L], round cost, speed-up, optimal γ) from the command line.

Options are parsed into a :class:`~specledger.ledger.report.LedgerRequest`;
:func:`~specledger.ledger.report.ledger_report` turns it into a plain dict (the JSON output), and
:func:`render_report` prints the same dict as rich tables, so the two outputs can never disagree.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from specledger.errors import SpecLedgerError, require
from specledger.ledger.acceptance import check_gamma
from specledger.ledger.expr import parse_cost_expression
from specledger.ledger.report import (
    EXAMPLE_ACCEPTANCE,
    EXAMPLE_BASE_MS,
    EXAMPLE_GAMMAS,
    EXAMPLE_SCENARIOS,
    MIB,
    LedgerRequest,
    ledger_report,
)
from specledger.ledger.speedup import ExpressionCostModel, SplitCostModel, parse_cost_model

# --------------------------------------------------------------------------- parsing


def parse_number_list(text: str, what: str) -> list[float]:
    """``"0.9, 0.8,0.7"`` → floats; empty text or a non-number is a SpecLedgerError naming ``what``."""
    items = [item.strip() for item in text.split(",")] if text is not None else []
    require(any(items), f"{what} is empty; give comma-separated numbers, e.g. 0.9,0.8,0.7")
    numbers: list[float] = []
    for item in items:
        try:
            numbers.append(float(item))
        except ValueError:
            raise SpecLedgerError(f"{what}: {item!r} is not a number; give comma-separated numbers") from None
    return numbers


def parse_gamma_list(text: str) -> list[int]:
    """``"1,2,4,8"`` → [1, 2, 4, 8]; each γ a whole number ≥ 0."""
    gammas: list[int] = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = int(item)
        except ValueError:
            raise SpecLedgerError(
                f"gamma {item!r} is not a whole number; give e.g. --gamma 1,2,4,8"
            ) from None
        gammas.append(check_gamma(value))
    return gammas


# --------------------------------------------------------------------------- rendering


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


def render_report(report: dict[str, Any], console: Any) -> None:
    """Print the report dict as rich tables."""
    from rich.table import Table

    acc = report.get("acceptance")
    base = report.get("base_ms")
    if acc is not None:
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

    for scenario in report.get("scenarios", []):
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

    scenarios = report.get("scenarios", [])
    if len(scenarios) > 1:
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

    for opt in report.get("optimal", []):
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

    tree = report.get("tree")
    if tree is not None:
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

    memory = report.get("memory")
    if memory is not None:
        console.print(
            f"[bold]KV[/] {memory['model']}: {memory['layers']} layers × 2 × {memory['kv_heads']} kv heads × "
            f"{memory['head_dim']} head_dim × {memory['bytes_per_element']} B = {memory['kv_bytes_per_token']} B/token"
        )
        table = Table(title=f"extra target KV for candidates, M ≈ B·γ·m_KV (B = {memory['batch']})")
        for name in ("γ", "KiB / request", f"MiB for B={memory['batch']}"):
            table.add_column(name, justify="right")
        for row in memory["rows"]:
            table.add_row(
                str(row["gamma"]),
                _fmt(row["candidate_kv_bytes_per_request"] / 1024, 1),
                _fmt(row["candidate_kv_bytes"] / MIB, 2),
            )
        console.print(table)

    quant = report.get("quant")
    if quant is not None:
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


# --------------------------------------------------------------------------- the verb


def _split_model(draft: str | None, verify: str | None, other: str | None) -> SplitCostModel:
    require(
        verify is not None, "--draft-ms/--other-ms need --verify-ms as well (the target's verify time in k)"
    )
    return SplitCostModel(
        draft=parse_cost_expression(draft or "0"),
        verify=parse_cost_expression(verify),
        other=parse_cost_expression(other or "0"),
    )


def ledger(
    acceptance: float | None = typer.Option(
        None, "--acceptance", "-a", help="Constant conditional acceptance a in [0,1] at every position."
    ),
    acceptance_chain: str | None = typer.Option(
        None,
        "--acceptance-chain",
        help="Conditional chain a_1,a_2,... (a_j given 1..j-1 accepted); γ = its length.",
    ),
    histogram: str | None = typer.Option(
        None, "--histogram", help="Observed counts of K = 0,1,..,γ over full rounds, e.g. 12,20,30,38."
    ),
    per_position: str | None = typer.Option(
        None,
        "--per-position",
        help="vLLM per-position rates Pr(K>=1),Pr(K>=2),... (accepted_per_pos/num_drafts).",
    ),
    gamma: str | None = typer.Option(
        None, "--gamma", "-g", help="Candidates per round to tabulate, e.g. 1,2,4,8."
    ),
    base_ms: float | None = typer.Option(
        None, "--base-ms", help="T0: plain-decoding ms per token (same conditions)."
    ),
    round_ms: list[str] | None = typer.Option(
        None,
        "--round-ms",
        help="Round ms as an expression in k ('10+0.7*k+0.1*k^2') or a measured table '1:10.8,2:11.8'. Repeat for scenarios.",
    ),
    draft_ms: str | None = typer.Option(
        None, "--draft-ms", help="Draft ms per round, expression in k (split model)."
    ),
    verify_ms: str | None = typer.Option(
        None, "--verify-ms", help="Verify ms per round, expression in k (split model)."
    ),
    other_ms: str | None = typer.Option(
        None, "--other-ms", help="Other ms per round (sampling, cache, sync), in k."
    ),
    optimal: bool = typer.Option(
        False, "--optimal", help="Find the speed-maximising γ (0 = off) and print the marginal table."
    ),
    max_gamma: int = typer.Option(16, "--max-gamma", help="Largest γ searched by --optimal."),
    tree_budget: int | None = typer.Option(
        None, "--tree-budget", help="Compare chain, k-ary and best tree at N nodes."
    ),
    sibling_acceptance: str | None = typer.Option(
        None,
        "--sibling-acceptance",
        help="Sequoia vector p_1,p_2,...: Pr(i-th ranked child is the accepted one), Σ<=1.",
    ),
    tree_max_depth: int | None = typer.Option(
        None, "--tree-max-depth", help="Depth limit for the best tree."
    ),
    kv: str | None = typer.Option(
        None, "--kv", help="config.json path (or 'smollm2') for the candidate-KV memory table."
    ),
    batch: int = typer.Option(1, "--batch", "-b", help="Requests in the batch (B) for the KV table."),
    kv_bytes: int | None = typer.Option(
        None, "--kv-bytes", help="Bytes per KV element (default from config dtype, else 2)."
    ),
    block_size: int | None = typer.Option(
        None, "--block-size", help="Paged-KV block size in tokens (round γ up)."
    ),
    four_way: str | None = typer.Option(
        None,
        "--four-way",
        help="Tokens/s of baseline,quant-only,spec-only,combined: speed-ups vs one baseline.",
    ),
    example: bool = typer.Option(
        False, "--example", help="The worked example (T0 10 ms, a 0.8, two cost curves)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the ledger as JSON instead of tables."),
) -> None:
    """Expected committed length, round cost and speed-up: does speculation pay, and at which γ?

    E[L] = 1 + Σ Pr(K≥i), S = T0·E[L]/T_round; speculation pays only if T_round < T0·E[L].
    """
    req = LedgerRequest(
        acceptance=acceptance,
        acceptance_chain=parse_number_list(acceptance_chain, "--acceptance-chain")
        if acceptance_chain is not None
        else None,
        histogram=parse_number_list(histogram, "--histogram") if histogram is not None else None,
        per_position=parse_number_list(per_position, "--per-position") if per_position is not None else None,
        gammas=parse_gamma_list(gamma) if gamma is not None else None,
        base_ms=base_ms,
        optimal=optimal,
        max_gamma=max_gamma,
        tree_budget=tree_budget,
        sibling_acceptance=(
            parse_number_list(sibling_acceptance, "--sibling-acceptance")
            if sibling_acceptance is not None
            else None
        ),
        tree_max_depth=tree_max_depth,
        kv=kv,
        batch=batch,
        kv_bytes=kv_bytes,
        block_size=block_size,
        four_way=parse_number_list(four_way, "--four-way") if four_way is not None else None,
    )
    for index, text in enumerate(round_ms or [], start=1):
        req.scenarios.append(
            (f"scenario {index}" if len(round_ms or []) > 1 else "scenario", parse_cost_model(text))
        )
    if draft_ms is not None or verify_ms is not None or other_ms is not None:
        req.scenarios.append(("split round", _split_model(draft_ms, verify_ms, other_ms)))
    if example:
        clashing = [
            name
            for name, value in (
                ("--acceptance", acceptance),
                ("--acceptance-chain", acceptance_chain),
                ("--histogram", histogram),
                ("--per-position", per_position),
                ("--gamma", gamma),
                ("--base-ms", base_ms),
                ("--round-ms", round_ms or None),
                ("--verify-ms", verify_ms),
                ("--draft-ms", draft_ms),
                ("--other-ms", other_ms),
            )  # fmt: skip
            if value is not None
        ]
        require(not clashing, f"--example sets its own inputs; drop {', '.join(clashing)}")
        req.acceptance = EXAMPLE_ACCEPTANCE
        req.gammas = list(EXAMPLE_GAMMAS)
        req.base_ms = EXAMPLE_BASE_MS
        req.scenarios = [
            (label, ExpressionCostModel(parse_cost_expression(text))) for label, text in EXAMPLE_SCENARIOS
        ]
    report = ledger_report(req)
    if json_output:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=120, file=sys.stdout)
    render_report(report, console)
