"""What the simulator returns and writes (``simulate.json``, the validation against a serving sweep), by its
keys: plain dicts at run time. Times in milliseconds unless the key says ``_s``, throughput in output tokens per
second of the makespan, a verify premium as T(verify step) / T(the same step without candidates)."""

from __future__ import annotations

from typing import TypedDict

from specledger.records import GammaSpec

# ``from`` is a keyword: the document's first keys in the functional form
_SimulateDocSource = TypedDict("_SimulateDocSource", {"experiment": str, "created": str, "from": str})


class SimMetricsDict(TypedDict):
    """One simulated point's figures (:meth:`specledger.simulate.simulator.SimResult.metrics`); None where the
    point has too few requests, steps or gaps to say."""

    requests: int
    tokens: int
    wall_s: float  # the makespan
    throughput_tok_s: float
    request_rate_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    itl_p50_ms: float | None  # chunk-level
    itl_p99_ms: float | None
    itl_std_ms: float | None
    itl_token_p99_ms: float | None  # token-level: the zero gaps inside a chunk added
    itl_token_std_ms: float | None
    longest_stall_ms: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    mean_latency_s: float | None
    mean_in_flight: float | None
    offered_rate_s: float | None
    preemptions: int
    recompute_s: float
    steps: int
    mean_batch: float | None
    mean_rows_per_step: float | None
    el: float | None  # tokens per round, the prefill's first token left out
    acceptance_rate: float | None
    peak_kv_tokens: int
    replicas: int
    verify_s: float  # the speculative steps' forward seconds
    verify_base_s: float  # the same forwards without their candidate rows
    verify_ratio: float | None  # verify_s / verify_base_s


class SimPointDict(SimMetricsDict, total=False):
    """One setting at one load of ``simulate.json``: the load under its kind's key (``concurrency``, ``rate`` or
    ``replay``), the setting, its figures, its speed-up over plain at that load and its break-even premium."""

    concurrency: int
    rate: float  # Poisson requests per second
    replay: str  # the replayed arrivals' label
    setting: str
    gamma: GammaSpec
    tree_budget: int
    speedup: float | None
    break_even_verify_premium: float | None


class CapacityRowDict(TypedDict, total=False):
    """Replicas one setting needs to meet the SLO at one Poisson rate (None: more than the most tried), with its
    figures there; ``saving_vs_plain``: plain's replicas minus this setting's."""

    rate: float
    setting: str
    replicas: int | None
    slo: str
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    throughput_tok_s: float | None
    saving_vs_plain: int | None


class CrossoverCellDict(TypedDict):
    """One (context, concurrency) cell of the crossover map: each speculative setting's speed-up over plain and
    break-even premium, and the best setting ("plain" where none beats it)."""

    context: int
    concurrency: int
    speedup: dict[str, float]
    break_even_verify_premium: dict[str, float | None]
    best: str


class SimServerDict(TypedDict):
    """The simulated server's limits as asked (None: the simulator's default)."""

    max_num_seqs: int | None
    max_batched_tokens: int | None
    kv_budget_tokens: int | None
    block_size: int
    chunked_prefill: bool
    reserve_gamma: bool


class _SimulateDocKeys(_SimulateDocSource):
    drafter: str
    settings: list[str]
    cost_source: str
    acceptance: str
    chains: str
    acceptance_assumption: str
    acceptance_per_setting: dict[str, str]
    requests: int
    tree_budget: int
    cost_per_setting: dict[str, str]  # a tree setting's pricer
    replicas: int
    router: str
    server: SimServerDict
    points: list[SimPointDict]
    simulated_s: float


class SimulateDocDict(_SimulateDocKeys, total=False):
    """``simulate.json``: what was simulated from which run, every point, and the capacity plan and crossover map
    where asked."""

    capacity_plan: list[CapacityRowDict]
    crossover_map: list[CrossoverCellDict]


class RealSimDict(TypedDict):
    """One figure measured and simulated; ``error`` = (sim − real) / real (None where it cannot be taken)."""

    real: float | None
    sim: float | None
    error: float | None


class LoadValidationRowDict(TypedDict, total=False):
    """One simulated load point of a run that the run also measured: each validated figure real and simulated
    (``speedup`` for a speculative setting)."""

    temperature: float
    load: int
    setting: str
    reps: int  # simulation seeds pooled
    throughput_tok_s: RealSimDict
    ttft_p50_ms: RealSimDict
    tpot_p50_ms: RealSimDict
    itl_p99_ms: RealSimDict
    speedup: RealSimDict


class NoiseDict(TypedDict):
    """The measurement's own noise: the relative sd of its repeats (``blocked by repeat``: the repeats' common
    drift taken out over a load's settings)."""

    method: str
    rel_sd: float
    settings: int
    repeats: int


class _FigureKeys(TypedDict):
    real: float  # the mean over repeats
    sim: float  # the mean over seeds and repeats
    error: float | None
    real_repeats: list[float | None]
    within: bool | None  # |sim − real| inside the figure's tolerance
    real_spread: float | None  # (max − min) / mean of the real repeats
    real_ci_half: float | None  # the real mean's 95 % t half-width, relative
    noise: NoiseDict | None


class ValidatedFigureDict(_FigureKeys, total=False):
    """One figure of one serving point, real against simulated; ``real_ci_half_unblocked`` where blocking over
    the load's settings replaced the repeats' own half-width."""

    real_ci_half_unblocked: float | None


class SpeedupSidesDict(TypedDict, total=False):
    """Speed-up over plain at the same load, real and simulated; ``real_repeats``: repeat r's over plain's."""

    real: float
    sim: float
    real_repeats: list[float]


class _ValidationRowKeys(TypedDict):
    kind: str
    load: int
    setting: str
    drafter: str
    gamma: GammaSpec
    repeats: int
    throughput_tok_s: ValidatedFigureDict
    tpot_p50_ms: ValidatedFigureDict
    ttft_p50_ms: ValidatedFigureDict
    itl_p99_ms: ValidatedFigureDict
    itl_p99_ms_mean_only: float | None  # the mean-only model (inference-sim's): every round E[K]
    tpot_p50_ms_mean_only: float | None


class ValidationRowDict(_ValidationRowKeys, total=False):
    """One serving point (kind, load, setting) real against simulated, figure by figure; ``speedup`` where
    plain was measured at its load."""

    speedup: SpeedupSidesDict


class CrossoverCheckDict(TypedDict):
    """Per (load, drafter): the smallest static γ whose speed-up is below 1 (None: none), real and simulated, the
    best γ of each, and whether the simulation falls on the side of 1 the real repeats resolve at every γ."""

    load: int
    drafter: str
    crossover_real: int | None
    crossover_sim: int | None
    best_real: int
    best_sim: int
    same: bool
    real_sides: dict[int, str]  # γ -> ">1", "<1" or "~1" (the repeats straddle 1)
    consistent: bool


class ValidationDict(TypedDict):
    """The simulator against a serving sweep: every point, the crossovers, the cost per held-out repeat and the
    tolerance per figure."""

    points: list[ValidationRowDict]
    crossover: list[CrossoverCheckDict]
    cost_source: dict[int, str]
    tolerance: dict[str, float]
    seeds: int
    jitter: bool
    per: str
    chains: str
