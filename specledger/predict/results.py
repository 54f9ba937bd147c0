"""What the forecasts and the run's self-checks return, as the JSON objects they are written as (``summary.json``
``prediction_check``, ``specledger predict --json``): typed by their keys, plain dicts at run time. Speed-ups are
end-to-end ratios (speculative tokens/s over plain tokens/s on the same prompts), errors relative
(|predicted − measured| / measured), E[L] in tokens per round."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, TypedDict


class PredictionExtraDict(TypedDict):
    """What a chain forecast of one category says besides its speed-up (:class:`~specledger.predict.predict
    .Prediction` ``extra``, flattened into its JSON)."""

    predicted_plain_tokens_per_s: float | None
    baseline: str  # "measured" (the run's plain decoding of these prompts sets tokens/s) or "predicted"
    el: float | None  # E[L] of a round
    t_round_ms: float | None  # the mean round's time
    acceptance_source: str  # "replayed", "chains" or "mixed"
    window_levels: int  # prompts priced at their own side-by-side window levels
    term_sources: dict[str, str]  # cost term -> where its price came from


@dataclass
class Prediction:
    """A chain forecast of one (category, drafter, γ): the end-to-end speed-up and tokens/s, their 5-95 % ranges
    and how the forecast was made."""

    category: str
    drafter: str
    gamma: int
    predicted_speedup: float
    predicted_tokens_per_s: float
    interval: list[float]  # 5-95 % of the speed-up
    tokens_per_s_interval: list[float]
    requests: int
    rounds_per_request: float
    assumption: str
    cost_source: str
    extra: PredictionExtraDict

    def to_dict(self) -> dict[str, Any]:
        """Every field, with ``extra`` flattened into the top level."""
        d = asdict(self)
        extra = d.pop("extra")
        return {**d, **extra}


class GammaPointDict(TypedDict):
    """The forecast S at one γ of an S-vs-γ curve (γ = 0: plain decoding, S = 1)."""

    gamma: int
    el: float | None
    t_round_ms: float | None
    speedup: float


class GammaCurveDict(TypedDict):
    """One (category, temperature, drafter)'s S-vs-γ curve and the prompts it is priced on."""

    curve: list[GammaPointDict]
    prompts: int


class _ForecastRowKeys(TypedDict):
    category: str
    drafter: str
    gamma: int
    prompts: int  # prompts the forecast and the measurement share
    measured_speedup: float
    predicted_speedup: float
    abs_error: float  # |predicted − measured| / measured


class SpeedupErrorDict(_ForecastRowKeys, total=False):
    """One held-out setting's forecast against its measurement; ``covered`` where the forecast has an interval."""

    covered: bool | None  # the measured S inside the forecast's 5-95 % interval (None: no interval drawn)


class BucketRowDict(SpeedupErrorDict):
    """One (drafter, γ) of a context bucket forecast without any of that bucket's records."""

    context: float  # the held-out prompts' mean length, tokens


class _HeldOutKeys(TypedDict):
    fitted_gammas: list[int]  # the γ's the acceptance chains were fitted on
    interval: list[float]  # the forecast S's 5-95 % range
    acceptance_source: str | None
    predicted_el: float | None
    measured_el: float | None
    predicted_t_round_ms: float | None
    measured_t_round_ms: float
    predicted_rounds_per_request: float
    measured_rounds_per_request: float


class HeldOutRowDict(SpeedupErrorDict, _HeldOutKeys):
    """One category's forecast of a γ held out of the fit (leave one γ out), against its measured S."""


class ErrorSummaryDict(TypedDict):
    """The absolute relative errors of a check's rows: median, P90, max, their count, and how often the measured S
    fell inside the forecast's interval (None without rows or intervals)."""

    median_abs_error: float | None
    p90_abs_error: float | None
    max_abs_error: float | None
    n: int
    interval_coverage: float | None


class MachineNoiseDict(TypedDict):
    """How much the machine moves: plain decoding's step times (ms) at P10 / P50 / P90, each request's steps
    scaled by its median; ``busy`` when P90 / P10 > 1.5."""

    p10_ms: float
    p50_ms: float
    p90_ms: float
    requests: int
    steps: int
    busy: bool


class _PredictionCheckKeys(ErrorSummaryDict):
    rows: list[HeldOutRowDict]
    machine_noise: MachineNoiseDict | None
    method: str
    assumption: str  # the acceptance model's assumption past the measured positions


class PredictionCheckDict(_PredictionCheckKeys, total=False):
    """The run's leave-one-γ-out check; ``note`` when nothing could be held out."""

    note: str


class BucketCheckDict(ErrorSummaryDict):
    """The leave-one-context-bucket-out check."""

    rows: list[BucketRowDict]
    method: str


class ScenarioPredictionDict(TypedDict):
    """The end-to-end model's S of one measured setting."""

    speedup: float
    kind: str  # "held out" (fitted without its γ) or "in sample"


class ReproducibilityDict(TypedDict):
    """How far the measured S of one setting moves between runs: |S_a / S_b − 1| over pairs of runs."""

    pairs: int
    runs: int
    median_run_to_run: float
    p90_run_to_run: float
    median_single_run: float  # one run's own share of it (over √2)
    p90_single_run: float
