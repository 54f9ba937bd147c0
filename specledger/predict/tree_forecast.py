"""Forecasts at a token-tree budget: ``specledger predict --tree-budget N`` (rows = nodes + 1).

A tree round verifies up to N candidate nodes, at most ``depth`` (the run's γ) deep, in one target forward
of N + 1 rows (the last committed token plus the nodes). It is priced on the run's cost model
(:class:`specledger.cost.pricer.StepPricer`, its measured surface):

    T_round = T_draft + T_s(rows, c) · π + T_other

π is the tree pass's premium over the chain pass at equal rows (per-row k/v writes, the accepted path's
compaction): the median of t_verify / T_s(rows, c) over the run's branching tree rounds, 1 (stated) when
the run verified none. §2.1's chain formula E[L] = 1 + Σ Π a_j does not hold for a tree (siblings are
alternatives), so a tree's acceptance is one of two things, and every forecast says which:

* **measured** -- the run verified trees of this drafter at this budget and depth: S_d = Pr(accepted path
  ≥ d) over its full proposing rounds, E[L] = 1 + Σ_d S_d (the observed accepted-path lengths), rows =
  1 + the nodes those rounds verified on average;
* **DP from measured acceptance by depth×rank** -- p_{d,i}, the chance that the i-th ranked child of a
  reached node at depth d − 1 is the accepted one, counted over every tree and chain the drafter verified
  (:func:`specledger.ledger.trees.count_depth_rank`), feeds :func:`specledger.ledger.trees.best_tree_by_depth`
  for N nodes at depth ≤ γ; S_d is the best shape's path mass at depth d and rows = N + 1 (the drafter is
  assumed to fill the budget).

A drafter proposes in a fraction f of rounds (a model-free drafter may find nothing to copy: that round is
a plain step). Per request, with n tokens still to commit at context c and depth g(n) = min(depth,
M − done − 1) as the engine clamps it (M = the request's max_tokens):

    V(n) = T_draft + f·[T_s(rows, c)·π + Σ_k Pr(K = k | g) V(n − min(k + 1, n))]
                   + (1 − f)·[T_s(1, c) + V(n − 1)] + T_other,        V(0) = 0
    Pr(K ≥ k | g) = S_k for k ≤ g, 0 beyond

and plain decoding V_0(n) = T_s(1, c) + T_other(plain) + V_0(n − 1). A category's S = Σ T_plain / Σ T_tree
over its prompts (greedy output does not depend on the drafter), T = T_prefill(P) + V(output − 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specledger.engine.drafters.catalog import PLAIN
from specledger.errors import SpecLedgerError, require
from specledger.ledger.trees import best_tree_by_depth, count_depth_rank, survival_by_depth, width_per_depth
from specledger.records import RequestRecord, RoundRecord

MIN_ROUNDS = 10  # full proposing rounds a measured acceptance (or a category of its own) needs
MIN_TRIES = 5  # tries a depth×rank cell needs before it stands on its own (else the rank's pooled value)
MEASURED = "measured"
DP_SOURCE = "DP from measured acceptance by depth×rank"


@dataclass
class TreeAcceptance:
    """Acceptance of one tree setting: S_d (given the drafter proposed), the fill f, nodes per proposing
    round, where they came from (``source``: measured / DP ...) and what they rest on (``detail``)."""

    survival: list[float]
    fill: float
    nodes: float
    source: str
    detail: str
    rounds: int
    widths: list[float] = field(default_factory=list)

    @property
    def el(self) -> float:
        """E[L] of a proposing round: 1 + Σ_d S_d (accepted path + the bonus token)."""
        return 1.0 + sum(self.survival)

    def pr_k(self, g: int) -> np.ndarray:
        """Pr(K = k), k = 0..g, with the tree cut at depth g (a deeper accepted path stops at g)."""
        s = [1.0] + [float(x) for x in self.survival[:g]] + [0.0] * max(0, g - len(self.survival))
        s.append(0.0)
        return np.array([s[k] - s[k + 1] if k < g else s[g] for k in range(g + 1)])


def solo_main(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """Solo, static-γ records of the main job at the lowest temperature (trees and chains alike)."""
    recs = [r for r in records if not r.extra.get("experiment") and isinstance(r.gamma, int)
            and not isinstance(r.gamma, bool) and all(rd.batch_size <= 1 for rd in r.rounds)]
    if not recs:
        return []
    t = min(r.temperature for r in recs)
    return [r for r in recs if abs(r.temperature - t) < 1e-9]


def verified_trees(rounds: Iterable[RoundRecord]) -> Iterable[tuple[list[int], list[int]]]:
    """(parents, accepted path) of every full proposing round; a chain round as the one-branch tree."""
    for rd in rounds:
        if rd.truncated or rd.proposed <= 0:
            continue
        if rd.tree_parents is not None:
            yield list(rd.tree_parents), list(rd.tree_path or [])
        else:
            yield list(range(-1, rd.proposed - 1)), list(range(rd.accepted))


def measured_acceptance(records: Sequence[RequestRecord], budget: int, depth: int) -> TreeAcceptance | None:
    """The acceptance the run measured at (budget, depth), from the records' full rounds; None when fewer
    than :data:`MIN_ROUNDS` of them proposed a tree."""
    rounds = [rd for r in records if r.tree_budget == budget and r.gamma == depth for rd in r.rounds
              if not rd.truncated]
    proposing = [rd for rd in rounds if rd.proposed > 0]
    if len(proposing) < MIN_ROUNDS:
        return None
    k = np.array([rd.accepted for rd in proposing])
    survival = [float(np.mean(k >= d)) for d in range(1, depth + 1)]
    widths: list[list[int]] = []
    for rd in proposing:
        depth_of: list[int] = []
        for p in rd.tree_parents or range(-1, rd.proposed - 1):
            depth_of.append(1 if p < 0 else depth_of[p] + 1)
        widths.append(np.bincount(depth_of, minlength=depth + 1)[1:].tolist())
    mean_widths = [float(np.mean([w[d] if d < len(w) else 0 for w in widths])) for d in range(depth)]
    return TreeAcceptance(survival, len(proposing) / len(rounds), float(np.mean([rd.proposed for rd in proposing])),
                          MEASURED, f"{MEASURED}: {len(proposing)} full tree rounds at budget {budget}, depth ≤ "
                          f"{depth} (observed accepted-path lengths, mean committed {1 + float(k.mean()):.3f})",
                          len(proposing), mean_widths)


def dp_acceptance(records: Sequence[RequestRecord], budget: int, depth: int) -> TreeAcceptance:
    """The DP's best shape for ``budget`` nodes at depth ≤ ``depth``, fed with p_{d,i} counted over every
    tree and chain in ``records`` (cells with fewer than :data:`MIN_TRIES` tries take the rank's value
    pooled over depths); the fill is the records' (tree rounds' where there are some)."""
    rounds = [rd for r in records for rd in r.rounds if not rd.truncated and rd.gamma > 0]
    counts = count_depth_rank(verified_trees(rounds))
    require(counts.rounds > 0, "the run has no full proposing rounds of this drafter to measure acceptance on; "
            "run it with --tree-budgets (or any γ) first")
    rows, pooled = counts.rows(MIN_TRIES)
    best = best_tree_by_depth(rows, budget, depth)
    survival = survival_by_depth(best.shape, rows)
    tree_rounds = [rd for rd in rounds if rd.tree_parents is not None] or rounds
    fill = sum(rd.proposed > 0 for rd in tree_rounds) / len(tree_rounds)
    ranks_seen = sum(1 for t in (sum(r[i] for r in counts.tries) for i in range(len(counts.tries[0]))) if t)
    note = "" if ranks_seen > 1 else "; only first-ranked children were ever verified (no tree rounds): the DP can " \
                                     "only build a chain -- measure ranks with --tree-budgets"
    detail = (f"{DP_SOURCE}: {counts.rounds} verified trees/chains, p by rank "
              f"{[round(x, 3) for x in counts.pooled_by_rank()[:max(ranks_seen, 1)]]} (pooled over depths), "
              f"{len(rows)} depth rows, {pooled} sparse cells (< {MIN_TRIES} tries) at the pooled value; DP best "
              f"shape widths {width_per_depth(best.shape)}, E[L] {best.expected_length:.3f}{note}")
    return TreeAcceptance(survival, fill, float(budget), DP_SOURCE, detail, counts.rounds,
                          [float(w) for w in width_per_depth(best.shape)])


def tree_acceptance(records: Sequence[RequestRecord], drafter: str, budget: int, depth: int,
                    category: str | None = None) -> TreeAcceptance:
    """Measured where the category has :data:`MIN_ROUNDS` tree rounds at (budget, depth), else the DP from
    the category's depth×rank counts, else the DP pooled over every category (said in ``detail``)."""
    mine = [r for r in records if r.drafter == drafter]
    cat = [r for r in mine if category is None or (r.category or "default") == category]
    acc = measured_acceptance(cat, budget, depth)
    if acc is not None:
        return acc
    full = sum(1 for _ in verified_trees(rd for r in cat for rd in r.rounds if rd.gamma > 0))
    if full >= MIN_ROUNDS or category is None:
        return dp_acceptance(cat, budget, depth)
    acc = dp_acceptance(mine, budget, depth)
    acc.detail += f" (pooled over categories: {category!r} has {full} proposing rounds)"
    return acc


# ----------------------------------------------------------------------------- costs


@dataclass
class TreeCosts:
    """The per-round parts a tree forecast adds to the pricer's, each with its source."""

    premium: float
    draft: Callable[[float], float]
    other_tree: float
    other_plain: float
    sources: dict[str, str]


def _median_ratio(pricer: Any, rounds: Sequence[RoundRecord]) -> tuple[float, int]:
    ratios = [rd.t_verify / p for rd in rounds
              if (p := pricer.round_s(rd.proposed + 1, float(rd.context_len))) > 0 and rd.t_verify > 0]
    return (float(np.median(ratios)), len(ratios)) if ratios else (1.0, 0)


def tree_costs(pricer: Any, records: Sequence[RequestRecord], drafter: str, budget: int, depth: int,
               rows: float, context: float = 512.0) -> TreeCosts:
    """π, the draft and other seconds of a tree round and plain's other seconds, from the run where it
    measured them (this setting's rounds first, then the drafter's tree rounds), else the pricer.
    ``context``: where the verify source is read off the surface (measured / interpolated / extrapolated)."""
    mine = [r for r in records if r.drafter == drafter and r.tree_budget > 0]
    rounds = [rd for r in mine for rd in r.rounds]
    branched = [rd for rd in rounds if rd.tree_parents is not None and rd.proposed > 0
                and any(p != i - 1 for i, p in enumerate(rd.tree_parents))]
    premium, n = _median_ratio(pricer, branched)
    src: dict[str, str] = {}
    lookup = getattr(getattr(pricer, "surface", None), "lookup", None)
    where = (f"{lookup(rows, 1, context).source} on the surface at context {context:.0f}" if lookup is not None
             else "the pricer's forward")
    src["verify"] = (f"{pricer.source}: T_s({rows:.1f} rows, c) ({where}) × tree-pass premium {premium:.3f} "
                     + (f"(median t_verify / T_s over {n} measured branching tree rounds)" if n else
                        "(assumed 1: the run verified no branching tree, the chain pass's cost is used)"))
    here = [rd for r in mine if r.tree_budget == budget and r.gamma == depth for rd in r.rounds]
    same_depth = [rd for rd in rounds if rd.gamma == depth]
    for name, pool in ((f"measured: mean over {len(here)} tree rounds at budget {budget}, depth {depth}", here),
                       (f"measured: mean over {len(same_depth)} tree rounds of depth {depth} at budgets "
                        f"{sorted({r.tree_budget for r in mine if r.gamma == depth})}", same_depth)):
        if len(pool) >= MIN_ROUNDS:
            t_draft = float(np.mean([rd.t_draft for rd in pool]))
            other = float(np.mean([rd.t_other for rd in pool]))
            src["draft"], src["other"] = f"{name} ({t_draft * 1e3:.2f} ms)", f"{name} ({other * 1e3:.2f} ms)"
            draft: Callable[[float], float] = lambda c, t=t_draft: t  # noqa: E731
            break
    else:
        other = float(pricer.other_s(1))
        draft = lambda c: float(pricer.draft_s(drafter, depth, c))  # noqa: E731
        src["draft"] = (f"{pricer.source}: draft_s({drafter}, γ={depth}) -- assumed: a tree costs what a chain of "
                        "its depth does (one draft pass per level; no tree rounds measured)")
        src["other"] = f"{pricer.source}: other_s (no tree rounds measured)"
    plain = [rd for r in records if r.drafter == PLAIN.name for rd in r.rounds]
    other_plain = float(np.mean([rd.t_other for rd in plain])) if plain else float(pricer.other_s(1))
    src["other (plain)"] = (f"measured: mean over {len(plain)} plain rounds" if plain
                            else f"{pricer.source}: other_s")
    src["prefill"] = f"{pricer.source}: prefill_s (the same on both sides)"
    return TreeCosts(premium, draft, other, other_plain, src)


# ----------------------------------------------------------------------------- one request, one category


@dataclass
class Sizes:
    """One measured prompt's sizes (output from its plain record: greedy output is the same)."""

    prompt_id: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int


def request_seconds(pricer: Any, drafter: str, acc: TreeAcceptance | None, costs: TreeCosts | None,
                    size: Sizes, depth: int, rows: float) -> tuple[float, float, float]:
    """(seconds, expected rounds, expected tree rounds) of one request: prefill + the module's recursion;
    ``acc`` or ``costs`` None, or ``depth`` 0, is plain decoding (T_s(1, c) + T_other(plain) per token)."""
    prompt_tokens, output_tokens, max_tokens = size.prompt_tokens, size.output_tokens, size.max_tokens
    n_tot = max(int(output_tokens) - 1, 0)  # the prefill emits the first token
    v = np.zeros(n_tot + 1)
    r = np.zeros(n_tot + 1)
    rt = np.zeros(n_tot + 1)
    other_plain = costs.other_plain if costs is not None else float(pricer.other_s(1))
    for n in range(1, n_tot + 1):
        done = 1 + n_tot - n
        c = float(prompt_tokens + done)
        g = max(0, min(depth, int(max_tokens) - done - 1)) if costs is not None and acc is not None else 0
        plain_s = float(pricer.round_s(1, c))
        if g == 0:
            v[n], r[n], rt[n] = plain_s + other_plain + v[n - 1], 1.0 + r[n - 1], rt[n - 1]
            continue
        pk = acc.pr_k(g)
        nxt = n - np.minimum(np.arange(g + 1) + 1, n)
        f = acc.fill
        tree_s = float(pricer.round_s(rows, c)) * costs.premium
        v[n] = costs.draft(c) + costs.other_tree + f * (tree_s + float(pk @ v[nxt])) + (1 - f) * (plain_s + v[n - 1])
        r[n] = 1.0 + f * float(pk @ r[nxt]) + (1 - f) * r[n - 1]
        rt[n] = f * (1.0 + float(pk @ rt[nxt])) + (1 - f) * rt[n - 1]
    pre = float(pricer.prefill_s(int(prompt_tokens)))
    begin = getattr(pricer, "begin_s", None)  # a measured cost model's drafter start-up inside the prefill
    if begin is not None:
        pre += float(begin(drafter if costs is not None else PLAIN.name, int(prompt_tokens)))
    return pre + float(v[n_tot]), float(r[n_tot]), float(rt[n_tot])


@dataclass
class TreePrediction:
    category: str
    drafter: str
    depth: int
    tree_budget: int
    requests: int
    predicted_speedup: float
    interval: list[float]  # 5-95 % over a bootstrap of prompts (the cost model's uncertainty not included)
    predicted_tokens_per_s: float
    predicted_plain_tokens_per_s: float
    el: float  # E[L] of a proposing tree round
    rounds_per_request: float
    t_round_ms: float
    acceptance_source: str
    term_sources: dict[str, str]
    widths: list[float]
    measured_speedup: float | None = None  # the run's own paired S at this setting, where it measured it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def category_sizes(records: Sequence[RequestRecord], drafter: str, category: str,
                   max_tokens: int | None) -> list[Sizes]:
    """The category's prompts: sizes from its plain records (else the drafter's), one per prompt. ``max_tokens``
    other than the run's (as chain forecasts do): a request cut by length goes on to the new budget, one that
    stopped at EOS stops at the same token."""
    cat = [r for r in records if (r.category or "default") == category]
    pool = [r for r in cat if r.drafter == PLAIN.name] or [r for r in cat if r.drafter == drafter]
    out: dict[str, Sizes] = {}
    for r in pool:
        pid = r.prompt_id or r.request_id
        run_m = int(r.extra.get("max_tokens") or r.output_tokens)
        n_out = r.output_tokens
        if max_tokens is not None:
            n_out = int(max_tokens) if r.stop_reason == "length" or n_out >= run_m else min(n_out, int(max_tokens))
        out.setdefault(pid, Sizes(pid, r.prompt_tokens, n_out, int(max_tokens or run_m)))
    return list(out.values())


def predict_tree_category(pricer: Any, records: Sequence[RequestRecord], category: str, drafter: str, depth: int,
                          budget: int, max_tokens: int | None = None, n_boot: int = 200,
                          seed: int = 0) -> TreePrediction | None:
    """S and tokens/s of ``drafter`` with trees of ``budget`` nodes at depth ≤ ``depth`` on the category's
    measured prompts (module docstring); None when the category has no prompts."""
    sizes = category_sizes(records, drafter, category, max_tokens)
    if not sizes:
        return None
    acc = tree_acceptance(records, drafter, budget, depth, category)
    rows = 1.0 + (acc.nodes if acc.source == MEASURED else float(budget))
    costs = tree_costs(pricer, [r for r in records if (r.category or "default") == category] or records,
                       drafter, budget, depth, rows, float(np.median([s.prompt_tokens for s in sizes])))
    spec = [request_seconds(pricer, drafter, acc, costs, s, depth, rows) for s in sizes]
    plain = [request_seconds(pricer, PLAIN.name, None, None, s, 0, 1.0)[0] for s in sizes]
    ts, tp = np.array([x[0] for x in spec]), np.array(plain)
    tokens = np.array([s.output_tokens for s in sizes], dtype=float)
    s_hat = float(tp.sum() / ts.sum()) if ts.sum() > 0 else math.nan
    rng = np.random.default_rng(seed)
    draws = [tp[i].sum() / ts[i].sum() for i in (rng.integers(0, len(sizes), len(sizes)) for _ in range(n_boot))]
    rounds = float(np.sum([x[1] for x in spec]))
    begin = getattr(pricer, "begin_s", None)
    round_s = ts.sum() - sum(float(pricer.prefill_s(s.prompt_tokens)) + (float(begin(drafter, s.prompt_tokens))
                                                                        if begin is not None else 0.0) for s in sizes)
    measured = _measured_speedup(records, category, drafter, depth, budget)
    sources = dict(costs.sources)
    sources["acceptance"] = acc.detail
    sources["fill"] = f"{acc.fill:.3f} of rounds propose a tree (measured " + \
        ("at this setting)" if acc.source == MEASURED else "over the drafter's tree rounds, else all its rounds)")
    return TreePrediction(
        category=category, drafter=drafter, depth=depth, tree_budget=budget, requests=len(sizes),
        predicted_speedup=s_hat,
        interval=[float(np.percentile(draws, 5)), float(np.percentile(draws, 95))] if draws else [s_hat, s_hat],
        predicted_tokens_per_s=float(tokens.sum() / ts.sum()) if ts.sum() > 0 else math.nan,
        predicted_plain_tokens_per_s=float(tokens.sum() / tp.sum()) if tp.sum() > 0 else math.nan,
        el=acc.el, rounds_per_request=rounds / len(sizes), t_round_ms=1e3 * round_s / rounds if rounds else math.nan,
        acceptance_source=acc.source, term_sources=sources, widths=acc.widths, measured_speedup=measured)


def _measured_speedup(records: Sequence[RequestRecord], category: str, drafter: str, depth: int,
                      budget: int) -> float | None:
    from specledger.predict.check import measured_speedup

    cat = [r for r in records if (r.category or "default") == category]
    spec = [r for r in cat if r.drafter == drafter and r.gamma == depth and r.tree_budget == budget]
    s = measured_speedup(spec, [r for r in cat if r.drafter == PLAIN.name]) if spec else math.nan
    return s if math.isfinite(s) else None


def check_budget(budget: Any) -> None:
    """A forecast's tree budget: a whole number of nodes in 1..MAX_TREE_BUDGET (the DP's range)."""
    from specledger.ledger.trees import MAX_TREE_BUDGET

    require(isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1,
            f"--tree-budget must be >= 1 node (rows = nodes + 1), got {budget!r}")
    require(budget <= MAX_TREE_BUDGET, f"--tree-budget {budget} exceeds {MAX_TREE_BUDGET} nodes; give a smaller budget")


def predict_trees(pricer: Any, records: Sequence[RequestRecord], drafter: str, depth: int, budget: int,
                  max_tokens: int | None = None, categories: Sequence[str] | None = None) -> list[TreePrediction]:
    """One :func:`predict_tree_category` per category that has prompts."""
    check_budget(budget)
    require(depth >= 1, f"--gamma (the tree's depth limit) must be >= 1, got {depth}")
    cats = categories or sorted({r.category or "default" for r in records})
    out = [predict_tree_category(pricer, records, c, drafter, depth, budget, max_tokens) for c in cats]
    return [p for p in out if p is not None]


def load_tree_inputs(run_dir: Path, cost: Path | None) -> tuple[Any, list[RequestRecord], int | None]:
    """(pricer, solo main-job records with trees, the run's max_tokens): ``cost`` any cost file
    (:func:`specledger.cost.loader.load_pricer`), else the run's own cost model (:mod:`specledger.predict.rundata`)."""
    from specledger.cost.loader import load_pricer
    from specledger.predict.rundata import load_run_models
    from specledger.rundir import TRACE_NAME, read_records

    models = load_run_models(run_dir, None) if cost is None else None
    pricer = load_pricer(cost) if cost is not None else models.cost  # type: ignore[union-attr]
    records = solo_main(read_records(Path(run_dir) / TRACE_NAME))
    if models is not None:
        return pricer, records, models.max_tokens
    from specledger.rundir import META_NAME, read_json

    meta_path = Path(run_dir) / META_NAME
    mt = (read_json(meta_path).get("config") or {}).get("max_tokens") if meta_path.exists() else None
    return pricer, records, mt if isinstance(mt, int) else None


def check_tree_drafter(records: Sequence[RequestRecord], drafter: str, run_dir: Path) -> None:
    """A one-line error unless the run measured ``drafter`` (its acceptance is needed)."""
    known = sorted({r.drafter for r in records if r.drafter != PLAIN.name})
    if drafter not in known:
        raise SpecLedgerError(f"{run_dir} has no measured requests of drafter {drafter!r} (it has: "
                              f"{', '.join(known) or 'none'}); predict a drafter the run measured")


def print_tree_forecast(preds: Sequence[TreePrediction], pricer_source: str, max_tokens: int | None,
                        as_json: bool = False) -> None:
    """The forecast as a table (or JSON), then where every term came from, per category."""
    if as_json:
        import json

        print(json.dumps([p.to_dict() for p in preds], indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not preds:
        console.print("no category has measured prompts to forecast")
        return
    p0 = preds[0]
    t = Table(title=f"predicted end to end: {p0.drafter} tree={p0.tree_budget} nodes (rows {p0.tree_budget + 1}), "
                    f"depth ≤ {p0.depth}, max_tokens={max_tokens or 'as run'}")
    for col in ("category", "prompts", "E[L]", "acceptance", "rounds/request", "ms/round", "tokens/s", "speed-up S",
                "S 5-95 %", "measured S"):
        t.add_column(col, justify="left" if col in ("category", "acceptance") else "right")
    for p in preds:
        source = "measured" if p.acceptance_source == MEASURED else "DP (depth×rank)"
        t.add_row(p.category, str(p.requests), f"{p.el:.3f}", source, f"{p.rounds_per_request:.1f}",
                  f"{p.t_round_ms:.2f}", f"{p.predicted_tokens_per_s:.1f}", f"{p.predicted_speedup:.3f}",
                  f"{p.interval[0]:.3f} - {p.interval[1]:.3f}",
                  "-" if p.measured_speedup is None else f"{p.measured_speedup:.3f}")
    console.print(t)
    console.print(f"cost model: {pricer_source}")
    console.print("S 5-95 %: a bootstrap over the category's prompts (the cost model's own uncertainty not included)")
    for p in preds:
        console.print(f"[bold]{p.category}[/] -- where each term came from:")
        for term, where in p.term_sources.items():
            console.print(f"  {term}: {where}")


def forecast_cli(run_dir: Path, drafter: str, depth: int, budget: int, max_tokens: int | None, cost: Path | None,
                 categories: str | None, as_json: bool) -> list[TreePrediction]:
    """``predict --tree-budget``: check the flags (one-line errors), load the run, forecast, print."""
    check_budget(budget)
    pricer, records, run_max = load_tree_inputs(run_dir, cost)
    check_tree_drafter(records, drafter, run_dir)
    cats = [c for c in categories.split(",") if c] if categories else None
    known = sorted({r.category or "default" for r in records})
    unknown = sorted(set(cats or []) - set(known))
    if unknown:
        raise SpecLedgerError(f"unknown categories {', '.join(unknown)}; the run has {', '.join(known)}")
    preds = predict_trees(pricer, records, drafter, depth, budget, max_tokens, cats)
    print_tree_forecast(preds, pricer.source, max_tokens or run_max, as_json)
    return preds
