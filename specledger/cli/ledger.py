"""``specledger ledger``: the performance ledger (E[L], round cost, speed-up, optimal γ) from the command line.

Options are parsed into a :class:`~specledger.ledger.report.LedgerRequest`
(:func:`~specledger.ledger.options.ledger_request`); :func:`~specledger.ledger.report.ledger_report` turns it
into a plain dict (the JSON output), and :func:`~specledger.ledger.render.render_report` prints the same dict
as rich tables, so the two outputs can never disagree.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from specledger.ledger.options import ledger_request
from specledger.ledger.render import render_report
from specledger.ledger.report import ledger_report

_Text = str | None


def ledger(
    acceptance: Annotated[float | None, typer.Option(
        "--acceptance", "-a", help="Constant conditional acceptance a in [0,1] at every position.")] = None,
    acceptance_chain: Annotated[_Text, typer.Option(
        "--acceptance-chain", help="Conditional chain a_1,a_2,... (a_j given 1..j-1 accepted); γ = its length.")
    ] = None,
    histogram: Annotated[_Text, typer.Option(
        "--histogram", help="Observed counts of K = 0,1,..,γ over full rounds, e.g. 12,20,30,38.")] = None,
    per_position: Annotated[_Text, typer.Option(
        "--per-position", help="vLLM per-position rates Pr(K>=1),Pr(K>=2),... (accepted_per_pos/num_drafts).")
    ] = None,
    gamma: Annotated[_Text, typer.Option("--gamma", "-g", help="Candidates per round to tabulate, e.g. 1,2,4,8.")
                     ] = None,
    base_ms: Annotated[float | None, typer.Option(
        "--base-ms", help="T0: plain-decoding ms per token (same conditions).")] = None,
    round_ms: Annotated[list[str] | None, typer.Option(
        "--round-ms", help="Round ms as an expression in k ('10+0.7*k+0.1*k^2') or a measured table "
                           "'1:10.8,2:11.8'. Repeat for scenarios.")] = None,
    draft_ms: Annotated[_Text, typer.Option("--draft-ms", help="Draft ms per round, expression in k (split model).")
                        ] = None,
    verify_ms: Annotated[_Text, typer.Option(
        "--verify-ms", help="Verify ms per round, expression in k (split model).")] = None,
    other_ms: Annotated[_Text, typer.Option(
        "--other-ms", help="Other ms per round (sampling, cache, sync), in k.")] = None,
    optimal: Annotated[bool, typer.Option(
        "--optimal", help="Find the speed-maximising γ (0 = off) and print the marginal table.")] = False,
    max_gamma: Annotated[int, typer.Option("--max-gamma", help="Largest γ searched by --optimal.")] = 16,
    tree_budget: Annotated[int | None, typer.Option(
        "--tree-budget", help="Compare chain, k-ary and best tree at N nodes.")] = None,
    sibling_acceptance: Annotated[_Text, typer.Option(
        "--sibling-acceptance", help="Sequoia vector p_1,p_2,...: Pr(i-th ranked child is the accepted one), Σ<=1.")
    ] = None,
    tree_max_depth: Annotated[int | None, typer.Option("--tree-max-depth", help="Depth limit for the best tree.")
                              ] = None,
    kv: Annotated[_Text, typer.Option(
        "--kv", help="config.json path (or 'smollm2') for the candidate-KV memory table.")] = None,
    batch: Annotated[int, typer.Option("--batch", "-b", help="Requests in the batch (B) for the KV table.")] = 1,
    kv_bytes: Annotated[int | None, typer.Option(
        "--kv-bytes", help="Bytes per KV element (default from config dtype, else 2).")] = None,
    block_size: Annotated[int | None, typer.Option(
        "--block-size", help="Paged-KV block size in tokens (round γ up).")] = None,
    context: Annotated[int | None, typer.Option(
        "--context", help="Tokens already in each request's KV cache: the KV every step reads, B·context·m_KV "
                          "(needs --kv).")] = None,
    weight_bytes: Annotated[float | None, typer.Option(
        "--weight-bytes", help="Bytes of weights one step reads (with --context: bytes read per step = weights + "
                               "KV, and the KV's share).")] = None,
    four_way: Annotated[_Text, typer.Option(
        "--four-way", help="Tokens/s of baseline,quant-only,spec-only,combined: speed-ups vs one baseline.")] = None,
    example: Annotated[bool, typer.Option(
        "--example", help="The worked example (T0 10 ms, a 0.8, two cost curves).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the ledger as JSON instead of tables.")] = False,
) -> None:
    """Expected committed length, round cost and speed-up: does speculation pay, and at which γ?

    E[L] = 1 + Σ Pr(K≥i), S = T0·E[L]/T_round; speculation pays only if T_round < T0·E[L].
    """
    report = ledger_report(ledger_request(
        acceptance=acceptance, acceptance_chain=acceptance_chain, histogram=histogram, per_position=per_position,
        gamma=gamma, base_ms=base_ms, round_ms=round_ms, draft_ms=draft_ms, verify_ms=verify_ms, other_ms=other_ms,
        optimal=optimal, max_gamma=max_gamma, tree_budget=tree_budget, sibling_acceptance=sibling_acceptance,
        tree_max_depth=tree_max_depth, kv=kv, batch=batch, kv_bytes=kv_bytes, block_size=block_size,
        four_way=four_way, example=example, context=context, weight_bytes=weight_bytes))
    if json_output:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=120, file=sys.stdout)
    render_report(report, console)
