"""The service-level objective the gates judge against: its keys and defaults, its file (``.toml`` or
``.json``, keys at top level or under ``[slo]``; unknown keys are errors), and the target load check."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from specledger.errors import SpecLedgerError


@dataclass(frozen=True)
class SLO:
    ttft_p99_ms: float = 2000.0
    tpot_p50_ms: float = 200.0
    #: at loads > 1 (the load gates also read TPOT P99 and token-ITL P99)
    tpot_p99_ms: float = 400.0
    itl_p99_ms: float = 500.0
    stall_ms: float = 1000.0
    quality_tolerance: float = 0.02
    max_memory_mb: float | None = None
    min_ci_low: float = 1.0
    min_sampled_prompts: int = 20
    alpha: float = 0.01
    require_assessed: bool = False
    #: the concurrency the service runs at; the verdict at this load is the one to act on
    target_load: int | None = None
    #: resource cost limit at loads > 1: CPU-seconds per 1k committed tokens (None = reported, not judged)
    max_cpu_s_per_1k_tokens: float | None = None
    #: relative band around each latency limit inside which a gate's outcome is *marginal*: within the
    #: run-to-run drift of the machine (10–25 % between minutes on a shared 2-core VM), so a verdict that
    #: hinges on it is marked not yet resolved rather than reported as settled
    margin: float = 0.1
    #: practical-equivalence margin of the decision: two settings whose paired speed-up ratio has its
    #: 1 − decision_alpha interval inside [1/(1+m), 1+m] are equivalent (TOST), and so is a setting
    #: within it of plain decoding (no practical gain). Default 5 %: above the A/A noise of a paired ratio
    #: (about 1 % after 8 prompts) and the rerun noise of one prompt's speed-up (median 3.6 % between two
    #: runs); docs/decisions.md has the measurements
    equivalence_margin: float = 0.05
    #: the decision's error rate over a whole race: every interval it reads is a 1 − decision_alpha confidence
    #: sequence (:mod:`specledger.analysis.sequential`), so over all of a race's looks the chance that it ever misses
    #: its true ratio -- e.g. two settings of equal speed called different -- is at most decision_alpha (0.05:
    #: 95 % intervals)
    decision_alpha: float = 0.05

    def to_dict(self) -> dict[str, float | int | bool | None]:
        return asdict(self)


def _check_value(name: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise SpecLedgerError(f"SLO key {name!r} must be true or false, got {value!r}")
        return value
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise SpecLedgerError(f"SLO key {name!r} must be a non-negative number, got {value!r}")
    if name == "alpha" and not 0 < value < 1:
        raise SpecLedgerError(f"SLO key 'alpha' must be between 0 and 1, got {value!r}")
    if name == "decision_alpha" and not 0 < value < 0.5:
        raise SpecLedgerError(f"SLO key 'decision_alpha' must be in (0, 0.5), e.g. 0.05, got {value!r}")
    if name == "equivalence_margin" and not 0 < value < 0.5:
        raise SpecLedgerError(f"SLO key 'equivalence_margin' must be in (0, 0.5), e.g. 0.03 for 3 %, got {value!r}")
    return int(value) if isinstance(default, int) else float(value)


def slo_from_dict(data: dict[str, Any], source: str = "SLO") -> SLO:
    """Build an :class:`SLO` from a mapping (top level or under an ``slo`` table); unknown keys are errors."""
    if not isinstance(data, dict):
        raise SpecLedgerError(f"{source}: expected a table/object of SLO keys")
    if isinstance(data.get("slo"), dict):
        data = data["slo"]
    known = {f.name: f.default for f in fields(SLO)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise SpecLedgerError(
            f"{source}: unknown SLO key(s) {', '.join(unknown)}; allowed: {', '.join(known)}"
        )
    values = {}
    for name, value in data.items():
        default = known[name]
        if name in ("max_memory_mb", "target_load", "max_cpu_s_per_1k_tokens") and value is None:
            values[name] = None
            continue
        if name == "target_load":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 1 or value != int(value):
                raise SpecLedgerError(f"{source}: SLO key 'target_load' must be a whole number of concurrent "
                                      f"requests ≥ 1, got {value!r}")
            values[name] = int(value)
            continue
        values[name] = _check_value(name, value, default if default is not None else 0.0)
    return SLO(**values)


def check_target_load(slo: SLO, measured: Sequence[int], simulated: Sequence[int] = ()) -> None:
    """One-line error when the SLO's ``target_load`` is neither measured nor simulated in this run."""
    if slo.target_load is None or slo.target_load in set(measured) | set(simulated):
        return
    have = ", ".join(str(x) for x in sorted(set(measured))) or "none"
    sim = ", ".join(str(x) for x in sorted(set(simulated)))
    raise SpecLedgerError(
        f"SLO target_load {slo.target_load} was not measured (loads {have})"
        + (f" or simulated (loads {sim})" if sim else "")
        + f"; add it with --loads ...,{slo.target_load}"
        + (f" (or --simulate-loads ...,{slo.target_load})" if sim else "") + " or change target_load"
    )


def load_slo(path: str | Path | None) -> SLO:
    """The SLO from a ``.toml`` or ``.json`` file (keys at top level or under ``[slo]``), or defaults for None."""
    if path is None:
        return SLO()
    p = Path(path)
    if not p.is_file():
        raise SpecLedgerError(f"SLO file not found: {p}; pass an existing .toml or .json file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecLedgerError(f"SLO file {p} is not UTF-8 text; save it as UTF-8 TOML or JSON") from None
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise SpecLedgerError(f"SLO file {p} must end in .toml or .json")
    except (ValueError, json.JSONDecodeError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise SpecLedgerError(f"SLO file {p} is not valid {suffix[1:].upper()}: {exc}") from None
    return slo_from_dict(data, str(p))
