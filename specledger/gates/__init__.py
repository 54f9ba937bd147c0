"""The four deployment gates (correctness, quality, latency, capacity) and the per-category verdict.

Each gate is ``pass``, ``fail`` or ``not assessed`` (shown honestly, never guessed) with an
evidence string (:mod:`.result`), judged against the SLO (:mod:`.slo`):

- :mod:`.correctness`: greedy (T = 0) outputs token-identical to plain decoding on every shared prompt;
  under sampling, the tokens after the first speculative round over many samples of one prompt,
  speculative vs plain, with its power stated (:mod:`specledger.gates.sampled_stats`); "not assessed
  (power X %)" when the sample is too small.
- :mod:`.quality`: mean task score (``extra["quality"]``) at most ``quality_tolerance`` below the baseline's.
- :mod:`.latency`: TTFT P99, TPOT P50, chunk ITL P99 and the longest stall within the SLO.
- :mod:`.capacity`: paired tokens/s ≥ the baseline's; peak memory within ``max_memory_mb`` if both are known;
  at loads > 1 goodput, KV capacity and CPU cost.

:mod:`.evaluate` applies all four to a scenario at load 1, :mod:`.loads` to every load point > 1.
Verdict per (category, temperature) (:mod:`.verdicts`): the fastest scenario with no failed gate and a
speed-up CI lower bound above ``min_ci_low``; otherwise "off". ``not assessed`` blocks only with
``require_assessed``.
"""

from specledger.gates.capacity import (
    capacity_gate,
    cpu_per_1k_tokens,
    goodput,
    kv_capacity,
    load_capacity_gate,
    meets_slo,
)
from specledger.gates.correctness import correctness_gate, greedy_correctness, sampled_correctness
from specledger.gates.evaluate import evaluate_gates
from specledger.gates.latency import latency_gate, load_latency_gate, ttft_drift, with_measured_margin
from specledger.gates.quality import quality_gate
from specledger.gates.result import FAIL, GATES, NOT_ASSESSED, PASS, GateResult
from specledger.gates.slo import SLO, check_target_load, load_slo, slo_from_dict
from specledger.gates.verdicts import (
    CONTROL_CATEGORIES,
    DRAFTER_MEMORY_RANK,
    control_repetition,
    prompts_to_separate,
    repeated_ngram_fraction,
    verdicts,
)

__all__ = [
    "CONTROL_CATEGORIES", "DRAFTER_MEMORY_RANK", "FAIL", "GATES", "NOT_ASSESSED", "PASS", "SLO", "GateResult",
    "capacity_gate", "check_target_load", "control_repetition", "correctness_gate", "cpu_per_1k_tokens",
    "evaluate_gates", "goodput", "greedy_correctness", "kv_capacity", "latency_gate", "load_capacity_gate",
    "load_latency_gate", "load_slo", "meets_slo", "prompts_to_separate", "quality_gate", "repeated_ngram_fraction",
    "sampled_correctness", "slo_from_dict", "ttft_drift", "verdicts", "with_measured_margin",
]
