"""A candidate setting as the verdict reads it: one scenario of :func:`specledger.analysis.run.analyze_scenario`
(or of a load point, a simulated load, the traffic mix) with its gates, the keys the decision rule uses named.

The analysis writes more keys than these (its figures for the report); the rule reads only what is named here.
Hand-built scenarios (tests, imports) may leave any of them out: every class is ``total=False``."""

from __future__ import annotations

from typing import TypedDict

from specledger.analysis.paired import RatioInterval
from specledger.gates.latency import LatencyFigures
from specledger.gates.result import GateOutcome

#: gate name -> its outcome
Gates = dict[str, GateOutcome]


class PromptTotals(TypedDict, total=False):
    """Per-prompt totals of one setting, aligned by prompt (repeats summed)."""

    prompts: list[str]
    tokens: list[float]  # committed tokens
    seconds: list[float]  # request latency, s


class PairedTotals(PromptTotals, total=False):
    """A setting's ``per_prompt``: its totals on the prompts plain ran too, plain's beside them (``base_``), and
    its ``own`` totals on every prompt it ran (for comparing two settings)."""

    base_tokens: list[float]
    base_seconds: list[float]
    own: PromptTotals


#: category -> prompt -> (committed tokens, seconds) of one setting
PromptBlocks = dict[str, dict[str, tuple[float, float]]]


class MixBlocks(TypedDict):
    """A setting's blocks on the mix: on the prompts plain ran (``spec``), plain's there, and its own on every
    prompt it ran (for comparing two settings)."""

    spec: PromptBlocks
    plain: PromptBlocks
    own: PromptBlocks


class Candidate(TypedDict, total=False):
    """One setting in one (category, temperature) at one load: what the decision rule reads."""

    category: str
    temperature: float
    drafter: str
    gamma: int | str  # the draft length, or its policy's name
    tree_budget: int  # 0: a chain
    label: str  # the scenario's label ("code T=0 ngram γ=4")
    speedup: float | None  # S against plain (None: not measured)
    speedup_ci: list[float | None]  # its 1 − α interval as given (None: unknown)
    paired_prompts: int  # prompts behind it
    per_prompt: PairedTotals  # paired per-prompt totals (absent: compare by the given intervals only)
    gates: Gates
    rounds: dict[str, float]  # round-ledger figures: ``rounds``, ``full_rounds``, ``el_full`` (E[L])
    totals: dict[str, float]  # ``requests``, ``tokens``
    load: int  # concurrency (load points, simulated loads)
    simulated: bool
    latency: LatencyFigures
    # the capacity gate's figures at load 1 (:func:`specledger.gates.evaluate.evaluate_gates`)
    paired_tokens_per_s: float | None  # the setting's tokens/s on the prompts plain ran too
    baseline_tokens_per_s: float | None  # plain's there
    memory_bytes: float | None  # peak memory of the setting's run
    # a simulated load's candidates (:mod:`specledger.gates.simulated`)
    speedup_bootstrap_ci: list[float]  # the prompt bootstrap's interval, before the simulator's error widens it
    requests: int  # simulated requests of the category at the point
    reps: int  # times the point was simulated
    # the traffic mix's candidates (:mod:`specledger.gates.mix`)
    mix_blocks: MixBlocks
    mix_vs_plain: RatioInterval
    per_category_speedup: dict[str, float | None]


class Baseline(TypedDict, total=False):
    """Plain decoding in one (category, temperature) as the gates read it
    (:func:`specledger.analysis.run.analyze_baseline`)."""

    category: str
    temperature: float
    latency: LatencyFigures
    load: int  # a load point's concurrency
    latency_gate: GateOutcome  # plain's own latency gate at that load


__all__ = ["Baseline", "Candidate", "Gates", "MixBlocks", "PairedTotals", "PromptBlocks", "PromptTotals"]
