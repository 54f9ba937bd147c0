"""The ledger verb's report as JSON (``specledger ledger --json``), section by section: what
:func:`specledger.ledger.report.ledger_report` builds and :func:`specledger.ledger.render.render_report` prints.
Times in milliseconds, sizes in bytes, E[L] in tokens per round (the bonus token counted)."""

from __future__ import annotations

from typing import TypedDict


class _LedgerRowKeys(TypedDict):
    gamma: int
    expected_length: float
    round_ms: float
    ms_per_token: float
    break_even_round_ms: float  # the round time at which speculation stops paying (T0·E[L])
    speedup: float
    pays: bool


class LedgerRowDict(_LedgerRowKeys, total=False):
    """One γ of one round-time scenario; the draft / verify / other split where the scenario prices parts."""

    draft_ms: float
    verify_ms: float
    other_ms: float


class ScenarioDict(TypedDict):
    """One round-time scenario: its label, its cost model's text and a row per γ."""

    label: str
    model: str
    rows: list[LedgerRowDict]


class AcceptanceRowDict(TypedDict):
    """E[L] at one γ under the acceptance source."""

    gamma: int
    expected_length: float
    mean_accepted: float  # E[K]: E[L] without the bonus token
    marginal_gain: float  # what the γ-th candidate adds to E[L]: Pr(K ≥ γ)
    break_even_round_ms: float | None  # T0·E[L]; None without --base-ms


class AcceptanceSectionDict(TypedDict):
    """The acceptance source, its chain, survival and histogram, and E[L] per γ."""

    source: str
    conditional: list[float]  # a_1..a_n
    per_position: list[float]  # Pr(K ≥ i), vLLM's per-position rates
    histogram_probabilities: list[float]  # Pr(K = 0..n)
    expected_length: float
    observed_expected_length: float | None  # the histogram's own mean K + 1, when one was given
    rows: list[AcceptanceRowDict]


class MarginalRowDict(TypedDict):
    """One step γ_from → γ of the marginal table that finds the optimal γ."""

    gamma_from: int
    gamma: int
    delta_length: float
    delta_cost_ms: float
    plain_value_ms: float  # ΔE[L]·T0: what plain decoding would pay for the same tokens
    speedup: float
    delta_speedup: float
    cheaper_than_plain: bool
    raises_speedup: bool


class OptimalSectionDict(TypedDict):
    """The speed-maximising γ of one scenario and the marginal table that finds it."""

    label: str
    max_gamma: int  # the largest γ searched
    best: LedgerRowDict
    marginal: list[MarginalRowDict]


class TreeRowDict(TypedDict):
    """One tree shape at the node budget."""

    shape: str
    nodes: int
    depth: int
    widths: list[int]  # nodes per depth
    expected_length: float


class TreeSectionDict(TypedDict):
    """Depth against width at the node budget: chain, k-ary and the best tree."""

    budget: int
    max_depth: int | None
    acceptance_model: str
    positional: list[float]  # Sequoia's p_i per sibling rank
    rows: list[TreeRowDict]


class MemoryRowDict(TypedDict):
    """The candidates' extra target KV at one γ."""

    gamma: int
    candidate_kv_bytes_per_request: int
    candidate_kv_bytes: int  # for the whole batch


class TreeMemoryDict(TypedDict):
    """The extra target KV of one tree of ``nodes`` candidates."""

    nodes: int
    candidate_kv_bytes_per_request: int
    candidate_kv_bytes: int


class StepReadDict(TypedDict):
    """What one step reads at ``context``: the KV B·c·m_KV, and with the weights the total and the KV's share."""

    context: int
    kv_read_bytes_per_step: float
    weight_bytes: float | None
    read_bytes_per_step: float | None
    kv_share: float | None


class _MemoryKeys(TypedDict):
    model: str | None
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_element: int
    kv_bytes_per_token: int
    batch: int
    block_size: int | None
    rows: list[MemoryRowDict]


class MemorySectionDict(_MemoryKeys, total=False):
    """The model's KV shape and the candidates' extra KV per γ; a tree's and the step read when asked."""

    tree: TreeMemoryDict
    step_read: StepReadDict


class QuantRowDict(TypedDict):
    setting: str
    tokens_per_s: float
    speedup: float  # against the baseline


class QuantSectionDict(TypedDict):
    """The four-way quantization × speculation record: speed-ups against one baseline."""

    rows: list[QuantRowDict]
    product_of_single_speedups: float
    measured_combined_speedup: float
    interaction: float


class _ReportKeys(TypedDict):
    gammas: list[int]
    base_ms: float | None  # T0, plain decoding's time per token


class LedgerReportDict(_ReportKeys, total=False):
    """The whole ledger: the sections asked for (acceptance and scenarios with an acceptance source)."""

    acceptance: AcceptanceSectionDict
    scenarios: list[ScenarioDict]
    optimal: list[OptimalSectionDict]
    tree: TreeSectionDict
    memory: MemorySectionDict
    quant: QuantSectionDict
