"""Turn traces into answers: ledger figures per scenario, S with the decisions' interval, the round ledger's
reconciliation with the measured speed-up, fitted cost curves, optimal γ and the 'why' of slow-downs.

Pure functions over lists of :class:`~specledger.records.RequestRecord`; no I/O.
"""

from specledger.analysis.cost_fit import curve_best_gamma, describe_cost, verify_points
from specledger.analysis.metrics import (
    baseline_t0,
    conditional_acceptance,
    k_histogram,
    latency_stats,
    round_stats,
    totals,
)
from specledger.analysis.reconcile import reconcile, reconciliation_sentences, why_sentences
from specledger.analysis.run import analyze_baseline, analyze_run, analyze_scenario
from specledger.analysis.scenario import ScenarioKey, group_scenarios, key_of, shared_prompts
from specledger.analysis.stats import distribution, paired_speedup_bootstrap

__all__ = [
    "ScenarioKey",
    "analyze_baseline",
    "analyze_run",
    "analyze_scenario",
    "baseline_t0",
    "conditional_acceptance",
    "curve_best_gamma",
    "describe_cost",
    "distribution",
    "group_scenarios",
    "k_histogram",
    "key_of",
    "latency_stats",
    "paired_speedup_bootstrap",
    "reconcile",
    "reconciliation_sentences",
    "round_stats",
    "shared_prompts",
    "totals",
    "verify_points",
    "why_sentences",
]
