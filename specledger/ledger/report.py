"""The ledger verb's figures as one plain dict: a :class:`LedgerRequest` (what was asked, parsed)
-> :func:`ledger_report` (the JSON output of ``specledger ledger --json``; the tables print the
same dict). Pure math over :mod:`specledger.ledger` (no torch, no I/O but ``--kv``'s config file).

E[L] = 1 + Σ_i Pr(K ≥ i) (the bonus token counted); speed-up S = T0·E[L] / T_round(γ); speculation
pays only where T_round(γ) < T0·E[L].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specledger.errors import SpecLedgerError, require
from specledger.ledger.acceptance import (
    check_chain,
    check_histogram,
    check_probability,
    conditional_from_histogram,
    conditional_from_survival,
    expected_length_from_chain,
    expected_length_from_histogram,
    histogram_from_conditional,
    survival_from_chain,
)
from specledger.ledger.fourway import compare_quant_and_spec
from specledger.ledger.memory import kv_read_bytes, load_kv_shape, speculation_memory, step_read_bytes
from specledger.ledger.report_types import (
    AcceptanceSectionDict,
    LedgerReportDict,
    LedgerRowDict,
    MemorySectionDict,
    OptimalSectionDict,
    QuantSectionDict,
    StepReadDict,
    TreeSectionDict,
)
from specledger.ledger.speedup import (
    CostModel,
    LedgerRow,
    SplitCostModel,
    break_even_round_ms,
    ledger_row,
    marginal_table,
    optimal_gamma,
)
from specledger.ledger.trees import depth_vs_width, positional_from_sibling_conditionals

EXAMPLE_ACCEPTANCE = 0.8
EXAMPLE_GAMMAS = (1, 2, 4, 8)
EXAMPLE_BASE_MS = 10.0
EXAMPLE_SCENARIOS = (("cheap draft", "10+0.7*k+0.1*k^2"), ("costly draft", "10+5*k+0.8*k^2"))
DEFAULT_GAMMAS = (1, 2, 4, 8)
MIB = 1024 * 1024


# --------------------------------------------------------------------------- the request


@dataclass
class LedgerRequest:
    """Everything the ledger verb was asked for (already parsed, not yet validated as a whole)."""

    acceptance: float | None = None
    acceptance_chain: list[float] | None = None
    histogram: list[float] | None = None
    per_position: list[float] | None = None
    gammas: list[int] | None = None
    base_ms: float | None = None
    scenarios: list[tuple[str, CostModel]] = field(default_factory=list)
    optimal: bool = False
    max_gamma: int = 16
    tree_budget: int | None = None
    sibling_acceptance: list[float] | None = None
    tree_max_depth: int | None = None
    kv: str | None = None
    batch: int = 1
    kv_bytes: int | None = None
    block_size: int | None = None
    four_way: list[float] | None = None
    context: int | None = None  # tokens already in each request's KV cache (the KV every step reads)
    weight_bytes: float | None = None  # bytes of weights one step reads (with context: bytes read per step)


@dataclass(frozen=True)
class _Acceptance:
    source: str
    chain: tuple[float, ...]  # conditional a_1..a_n, n = the longest γ we may evaluate
    default_gammas: tuple[int, ...]
    observed_expected_length: float | None = None


def _resolve_acceptance(req: LedgerRequest) -> _Acceptance | None:
    given = [
        name
        for name, value in (
            ("--acceptance", req.acceptance),
            ("--acceptance-chain", req.acceptance_chain),
            ("--histogram", req.histogram),
            ("--per-position", req.per_position),
        )
        if value is not None
    ]
    require(len(given) <= 1, f"give one acceptance source, not {' and '.join(given)}")
    if not given:
        return None
    if req.acceptance is not None:
        a = check_probability(req.acceptance)
        longest = max([*(req.gammas or DEFAULT_GAMMAS), req.max_gamma if req.optimal else 0])
        return _Acceptance(f"constant conditional acceptance a = {a:g}", (a,) * longest, DEFAULT_GAMMAS)
    if req.acceptance_chain is not None:
        chain = check_chain(req.acceptance_chain)
        require(len(chain) > 0, "the acceptance chain is empty; give a_1,a_2,... e.g. 0.9,0.8,0.7")
        return _Acceptance("conditional acceptance chain a_1..a_γ", chain, (len(chain),))
    if req.histogram is not None:
        counts = check_histogram(req.histogram)
        require(
            len(counts) >= 2, "the K histogram needs counts for K = 0..γ with γ >= 1 (at least two counts)"
        )
        chain = tuple(conditional_from_histogram(counts))
        return _Acceptance(
            f"K histogram over {sum(counts):g} rounds (K = 0..{len(counts) - 1})",
            chain,
            (len(chain),),
            observed_expected_length=expected_length_from_histogram(counts),
        )
    rates = req.per_position or []
    require(len(rates) > 0, "the per-position rates are empty; give Pr(K>=1),Pr(K>=2),... e.g. 0.8,0.6,0.45")
    chain = tuple(conditional_from_survival(rates))
    return _Acceptance("unconditional per-position rates (vLLM style)", chain, (len(chain),))


def _gammas_for(req: LedgerRequest, acc: _Acceptance | None) -> list[int]:
    gammas = list(req.gammas) if req.gammas else list(acc.default_gammas if acc else DEFAULT_GAMMAS)
    if acc is not None:
        too_long = [g for g in gammas if g > len(acc.chain)]
        if too_long:
            raise SpecLedgerError(
                f"γ={too_long[0]} needs acceptance for {too_long[0]} positions but the {acc.source} covers "
                f"{len(acc.chain)}; give --gamma up to {len(acc.chain)}"
            )
    return gammas


def _row_dict(row: LedgerRow, model: CostModel | None = None) -> LedgerRowDict:
    out: LedgerRowDict = {
        "gamma": row.gamma,
        "expected_length": row.expected_length,
        "round_ms": row.round_ms,
        "ms_per_token": row.ms_per_token,
        "break_even_round_ms": row.break_even_ms,
        "speedup": row.speedup,
        "pays": row.pays,
    }
    if isinstance(model, SplitCostModel) and row.gamma > 0:
        parts = model.split(row.gamma)
        out.update(draft_ms=parts.draft_ms, verify_ms=parts.verify_ms, other_ms=parts.other_ms)
    return out


def _tree_positional(req: LedgerRequest) -> tuple[list[float], str]:
    if req.sibling_acceptance is not None:
        return list(req.sibling_acceptance), "Sequoia positional vector p_i (given)"
    budget = req.tree_budget or 0
    if req.acceptance_chain is not None:
        conditionals = req.acceptance_chain
        text = "--acceptance-chain read per sibling rank: c_i = Pr(rank i accepted | ranks < i rejected)"
    elif req.acceptance is not None:
        conditionals = [req.acceptance] * max(budget, 1)
        text = f"every ranked sibling accepted with conditional chance {req.acceptance:g} given earlier ones rejected"
    else:
        raise SpecLedgerError(
            "--tree-budget needs --sibling-acceptance p1,p2,..., --acceptance-chain or --acceptance"
        )
    return positional_from_sibling_conditionals(conditionals), text + "; p_i = c_i·Π_{j<i}(1−c_j)"


def ledger_report(req: LedgerRequest) -> LedgerReportDict:
    """The whole ledger as a JSON-ready dict (acceptance, per-scenario rows, optimum, tree, memory)."""
    acc = _resolve_acceptance(req)
    _check_request(req, acc)
    gammas = _gammas_for(req, acc)
    report: LedgerReportDict = {"gammas": gammas, "base_ms": req.base_ms}
    if acc is not None:
        report["acceptance"] = _acceptance_section(req, acc, gammas)
        report["scenarios"] = [
            {
                "label": label,
                "model": model.label,
                "rows": [_row_dict(ledger_row(acc.chain, g, req.base_ms, model), model) for g in gammas],
            }
            for label, model in req.scenarios
        ]
        if req.optimal:
            report["optimal"] = [_optimal_section(req, acc, label, model) for label, model in req.scenarios]
    if req.tree_budget is not None:
        report["tree"] = _tree_section(req)
    if req.kv is not None:
        report["memory"] = _memory_section(req, gammas)
    if req.four_way is not None:
        report["quant"] = _quant_section(req)
    return report


def _check_request(req: LedgerRequest, acc: _Acceptance | None) -> None:
    """One-line errors for a request that asks nothing or misses an input its figures need."""
    require(
        acc is not None or req.kv is not None or req.four_way is not None or req.tree_budget is not None,
        "nothing to compute; give --acceptance (or --acceptance-chain/--histogram/--per-position), "
        "--tree-budget, --kv, --four-way or --example",
    )
    require(req.max_gamma >= 1, f"--max-gamma {req.max_gamma} must be >= 1")
    require(req.context is None or req.kv is not None,
            "--context needs --kv (the model whose KV a step reads), e.g. --kv smollm2 --context 4096")
    require(req.weight_bytes is None or req.context is not None,
            "--weight-bytes needs --context (bytes read per step = weights + B·context·m_KV)")
    require(req.context is None or req.context >= 0, f"--context {req.context} must be >= 0 tokens")
    require(req.weight_bytes is None or (math.isfinite(req.weight_bytes) and req.weight_bytes >= 0),
            f"--weight-bytes {req.weight_bytes} must be >= 0 bytes")
    if req.base_ms is not None:
        require(
            math.isfinite(req.base_ms) and req.base_ms > 0, f"--base-ms {req.base_ms} must be a positive ms"
        )
    require(
        not req.scenarios or req.base_ms is not None,
        "round-time scenarios need the plain-decoding time per token; give --base-ms T0",
    )
    require(
        acc is not None or not req.scenarios,
        "round-time scenarios need an acceptance source, e.g. --acceptance 0.8",
    )
    require(
        not req.optimal or req.scenarios, "--optimal needs a cost model: --round-ms or --draft-ms/--verify-ms"
    )


def _acceptance_section(req: LedgerRequest, acc: _Acceptance, gammas: list[int]) -> AcceptanceSectionDict:
    """The acceptance source, its chain, survival and histogram, and E[L] per γ."""
    full = acc.chain[: max(gammas)] if gammas and req.acceptance is not None else acc.chain
    survival = survival_from_chain(full)
    return {
        "source": acc.source,
        "conditional": list(full),
        "per_position": survival,
        "histogram_probabilities": histogram_from_conditional(full),
        "expected_length": expected_length_from_chain(full),
        "observed_expected_length": acc.observed_expected_length,
        "rows": [
            {
                "gamma": g,
                "expected_length": expected_length_from_chain(acc.chain[:g]),
                "mean_accepted": expected_length_from_chain(acc.chain[:g]) - 1.0,
                "marginal_gain": survival_from_chain(acc.chain[:g])[-1] if g > 0 else 0.0,
                "break_even_round_ms": (
                    break_even_round_ms(req.base_ms, expected_length_from_chain(acc.chain[:g]))
                    if req.base_ms is not None
                    else None
                ),
            }
            for g in gammas
        ],
    }


def _optimal_section(req: LedgerRequest, acc: _Acceptance, label: str, model: CostModel) -> OptimalSectionDict:
    """The speed-maximising γ of one scenario and the marginal table that finds it."""
    best = optimal_gamma(acc.chain, req.base_ms, model, req.max_gamma)
    return {
        "label": label,
        "max_gamma": min(req.max_gamma, len(acc.chain)),
        "best": _row_dict(best.best, model),
        "marginal": [
            {
                "gamma_from": m.gamma_from,
                "gamma": m.gamma,
                "delta_length": m.delta_length,
                "delta_cost_ms": m.delta_cost_ms,
                "plain_value_ms": m.plain_value_ms,
                "speedup": m.speedup,
                "delta_speedup": m.delta_speedup,
                "cheaper_than_plain": m.cheaper_than_plain,
                "raises_speedup": m.raises_speedup,
            }
            for m in marginal_table(acc.chain, req.base_ms, model, req.max_gamma)
        ],
    }


def _tree_section(req: LedgerRequest) -> TreeSectionDict:
    """Depth against width at the node budget: chain, k-ary and the best tree."""
    require(req.tree_budget >= 1, f"--tree-budget {req.tree_budget} must be >= 1 node")
    positional, model_text = _tree_positional(req)
    rows = depth_vs_width(positional, req.tree_budget, max_depth=req.tree_max_depth)
    return {
        "budget": req.tree_budget,
        "max_depth": req.tree_max_depth,
        "acceptance_model": model_text,
        "positional": positional,
        "rows": [
            {
                "shape": r.label,
                "nodes": r.nodes,
                "depth": r.depth,
                "widths": list(r.widths),
                "expected_length": r.expected_length,
            }
            for r in rows
        ],
    }


def _memory_section(req: LedgerRequest, gammas: list[int]) -> MemorySectionDict:
    """The extra target KV the candidates take per γ (and per tree of ``--tree-budget`` nodes: every node
    takes a slot), for one request and for the batch; with ``--context``, the KV every step reads."""
    require(req.batch >= 1, f"--batch {req.batch} must be >= 1")
    shape = load_kv_shape(req.kv, req.kv_bytes)
    section: MemorySectionDict = {
        "model": req.kv,
        "layers": shape.layers,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "bytes_per_element": shape.bytes_per_element,
        "kv_bytes_per_token": shape.bytes_per_token,
        "batch": req.batch,
        "block_size": req.block_size,
        "rows": [
            {
                "gamma": g,
                "candidate_kv_bytes_per_request": speculation_memory(
                    shape, 1, g, block_size=req.block_size
                ).total,
                "candidate_kv_bytes": speculation_memory(
                    shape, req.batch, g, block_size=req.block_size
                ).total,
            }
            for g in gammas
        ],
    }
    if req.tree_budget:
        section["tree"] = {
            "nodes": req.tree_budget,
            "candidate_kv_bytes_per_request": speculation_memory(shape, 1, req.tree_budget, block_size=req.block_size
                                                                 ).total,
            "candidate_kv_bytes": speculation_memory(shape, req.batch, req.tree_budget, block_size=req.block_size
                                                     ).total,
        }
    if req.context is not None:
        section["step_read"] = _step_read(shape.bytes_per_token, req.context, req.batch, req.weight_bytes)
    return section


def _step_read(m_kv: int, context: int, batch: int, weight_bytes: float | None) -> StepReadDict:
    """What one step (a plain step or a verify round) reads at ``context``: the KV B·c·m_KV, and with the weights
    W the total W + B·c·m_KV and the KV's share of it (:func:`specledger.ledger.memory.step_read_bytes`)."""
    kv = kv_read_bytes(m_kv, context, batch)
    out: StepReadDict = {"context": context, "kv_read_bytes_per_step": kv, "weight_bytes": weight_bytes,
                         "read_bytes_per_step": None, "kv_share": None}
    if weight_bytes is not None:
        total = step_read_bytes(weight_bytes, m_kv, context, batch)
        out.update(read_bytes_per_step=total, kv_share=kv / total if total > 0 else None)
    return out


def _quant_section(req: LedgerRequest) -> QuantSectionDict:
    """The four-way quantization × speculation record: speed-ups against one baseline."""
    require(
        len(req.four_way) == 4, "--four-way takes four tokens/s: baseline,quant-only,spec-only,combined"
    )
    record = compare_quant_and_spec(*req.four_way)
    return {
        "rows": [{"setting": s, "tokens_per_s": t, "speedup": x} for s, t, x in record.rows()],
        "product_of_single_speedups": record.product_of_single_speedups,
        "measured_combined_speedup": record.combined_speedup,
        "interaction": record.interaction,
    }
