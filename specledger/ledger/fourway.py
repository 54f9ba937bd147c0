"""Quantization and speculation: four measurements, speed-ups that do not multiply.

Baseline, quant-only, spec-only and combined are four separate measurements. Every speed-up
is taken against the *same* baseline. The product of the two single speed-ups is shown next
to the measured combined speed-up as a reference, never in its place: quantization changes
the very bottleneck speculation exploits (and the target that verifies), so the two effects
interact. Quality must be checked against the target actually verifying (the quantized one
when the target is quantized).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specledger.errors import require


def _speed(value: float, name: str) -> float:
    number = float(value)
    require(
        math.isfinite(number) and number > 0, f"{name} is {value!r} tokens/s; it must be a positive speed"
    )
    return number


@dataclass(frozen=True)
class FourWayComparison:
    """Tokens/s of baseline, quant-only, spec-only and combined, measured under the same conditions."""

    baseline_tps: float
    quant_only_tps: float
    spec_only_tps: float
    combined_tps: float

    def __post_init__(self) -> None:
        _speed(self.baseline_tps, "baseline speed")
        _speed(self.quant_only_tps, "quant-only speed")
        _speed(self.spec_only_tps, "spec-only speed")
        _speed(self.combined_tps, "combined speed")

    @property
    def quant_speedup(self) -> float:
        """S_q = quant-only / baseline."""
        return self.quant_only_tps / self.baseline_tps

    @property
    def spec_speedup(self) -> float:
        """S_s = spec-only / baseline."""
        return self.spec_only_tps / self.baseline_tps

    @property
    def combined_speedup(self) -> float:
        """S_qs = combined / baseline: the measured number to report."""
        return self.combined_tps / self.baseline_tps

    @property
    def product_of_single_speedups(self) -> float:
        """S_q · S_s: what naive multiplication would promise (reference only)."""
        return self.quant_speedup * self.spec_speedup

    @property
    def interaction(self) -> float:
        """S_qs / (S_q · S_s): < 1 means the two gains overlap, > 1 that they reinforce."""
        return self.combined_speedup / self.product_of_single_speedups

    @property
    def spec_speedup_on_quantized(self) -> float:
        """combined / quant-only: what speculation adds once the target is already quantized."""
        return self.combined_tps / self.quant_only_tps

    def rows(self) -> list[tuple[str, float, float]]:
        """(setting, tokens/s, speed-up vs the same baseline) for the four measurements."""
        return [
            ("baseline", self.baseline_tps, 1.0),
            ("quant only", self.quant_only_tps, self.quant_speedup),
            ("spec only", self.spec_only_tps, self.spec_speedup),
            ("quant + spec (measured)", self.combined_tps, self.combined_speedup),
        ]


def compare_quant_and_spec(
    baseline_tps: float, quant_only_tps: float, spec_only_tps: float, combined_tps: float
) -> FourWayComparison:
    """Build the four-way record (validates every speed > 0)."""
    return FourWayComparison(baseline_tps, quant_only_tps, spec_only_tps, combined_tps)
