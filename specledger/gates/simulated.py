"""The verdict at simulated loads: the simulator's points through the load gates, labelled simulated.

Input: simulated points (:class:`specledger.simulate.run_loads.SimPoint`: per request ``prompt_ids``,
``tokens``, ``seconds``, ``ttft_s``, ``tpot_s``, ``max_gap_s``; per point ``wall_s``, ``itl_token_p99_ms``,
``load``, ``drafter``, ``gamma``, ``temperature``) and the simulator's validation at the measured loads
(the simulator imports nothing from the gates). Per (category, temperature, simulated load) and setting:

- speed-up: S = (Σ tokens / Σ latency) of the setting over plain's, per prompt of the category, paired
  (:func:`specledger.simulate.run_loads.sim_speedup`); its interval is the prompt bootstrap
  widened by the simulator's own error, [lo · (1 − e), hi · (1 + e)] with e the largest |error| of the
  simulated speed-up against the measured one at the measured loads > 1. Not validated (no measured
  load > 1): no interval, hence no "deploy" -- the simulator's error is unknown;
- latency: :func:`specledger.gates.load_latency_gate` on the simulated TTFT P99, TPOT P50/P99 and
  longest stall of the category's requests and the whole point's token-ITL P99 (the simulator keeps
  chunk gaps per step, not per request);
- capacity: goodput (requests meeting every per-request SLO, :func:`specledger.gates.meets_slo`'s
  rule, per second of the point) at least plain's at that load; KV capacity
  (:func:`specledger.gates.kv_capacity` on the setting's measured requests) at least the load; CPU
  cost is not simulated: with ``max_cpu_s_per_1k_tokens`` set the gate is "not assessed" unless
  another part fails;
- correctness and quality: the simulator produces no tokens. A setting that failed either gate at a
  measured load fails it here too (exactness does not depend on the load); otherwise "not assessed
  (simulated: ...)", never a pass.

Decisions: :func:`specledger.gates.verdicts`, each entry with ``load``, ``simulated: true`` and
``simulation_error`` (the validated errors, or "not validated").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specledger.analysis.metrics import MS
from specledger.engine.drafters.catalog import PLAIN
from specledger.gates import (
    FAIL,
    GATES,
    NOT_ASSESSED,
    PASS,
    SLO,
    GateResult,
    kv_capacity,
    load_latency_gate,
)
from specledger.gates.candidates import Candidate, Gates
from specledger.gates.decision import SimulationError, VerdictDict
from specledger.gates.latency import LatencyFigures
from specledger.gates.result import GateOutcome
from specledger.gates.verdicts import decide
from specledger.records import RequestRecord, setting_label
from specledger.simulate.run_loads import SimPoint, sim_speedup

NOT_VALIDATED = "not validated"


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q) * MS) if values.size else None


def sim_latency(p: SimPoint, mask: np.ndarray) -> LatencyFigures:
    """The latency figures :func:`~specledger.gates.load_latency_gate` reads, from the masked requests (ms)."""
    tpots = p.tpot_s[mask]
    tpots = tpots[~np.isnan(tpots)]
    gaps = p.max_gap_s[mask]
    return {"ttft_ms": {"p50": _pct(p.ttft_s[mask], 50), "p99": _pct(p.ttft_s[mask], 99)},
            "tpot_ms": {"p50": _pct(tpots, 50), "p99": _pct(tpots, 99)},
            "itl_token_ms": {"p99": p.itl_token_p99_ms},
            "longest_stall_ms": float(gaps.max() * MS) if gaps.size else None}


def sim_goodput(p: SimPoint, mask: np.ndarray, slo: SLO) -> tuple[float | None, int, int]:
    """(requests meeting TTFT ≤ ``ttft_p99_ms``, TPOT ≤ ``tpot_p99_ms`` and longest gap ≤ ``stall_ms``
    per second of the point, met, of) -- :func:`specledger.gates.meets_slo` on simulated requests."""
    ttft, tp, gap = p.ttft_s[mask] * MS, p.tpot_s[mask] * MS, p.max_gap_s[mask] * MS
    met = (ttft <= slo.ttft_p99_ms) & (np.isnan(tp) | (tp <= slo.tpot_p99_ms)) & (gap <= slo.stall_ms)
    n_met = int(met.sum())
    return (n_met / p.wall_s if p.wall_s > 0 else None), n_met, int(mask.sum())


def carried_gate(name: str, measured: Sequence[tuple[int, GateOutcome]]) -> GateResult:
    """Correctness / quality at a simulated load from the same setting's gates at the measured loads."""
    failed = [(load, g) for load, g in measured if g.get("status") == FAIL]
    if failed:
        load, g = failed[0]
        return GateResult(name, FAIL, f"simulated: failed at measured load {load} ({g.get('evidence')}); "
                                      "the simulator produces no tokens to check")
    passed = sorted({load for load, g in measured if g.get("status") == PASS})
    at = f"; passed at measured load{'s' if len(passed) > 1 else ''} {', '.join(map(str, passed))}" if passed else ""
    return GateResult(name, NOT_ASSESSED, f"not assessed (simulated: the simulator produces no tokens{at})")


def sim_capacity_gate(p: SimPoint, plain: SimPoint, mask: np.ndarray, plain_mask: np.ndarray,
                      solo: Sequence[RequestRecord], meta: Mapping[str, Any], slo: SLO) -> GateResult:
    """Goodput vs plain's at the same simulated load; KV capacity vs the load; CPU cost not simulated."""
    g, met, of = sim_goodput(p, mask, slo)
    bg, bmet, bof = sim_goodput(plain, plain_mask, slo)
    if g is None or bg is None:
        return GateResult("capacity", NOT_ASSESSED, "not assessed (simulated: no plain point at this load)")
    fails = ["goodput"] if g < bg else []
    parts = [f"simulated goodput {g:.2f} req/s ({met}/{of} met the SLO) {'≥' if g >= bg else '<'} plain {bg:.2f} "
             f"({bmet}/{bof})"]
    fits, text = kv_capacity(solo, int(p.gamma or 0), dict(meta), slo)
    parts.append(text + (f" {'≥' if fits >= p.load else '<'} load {p.load}" if fits is not None else ""))
    if fits is not None and fits < p.load:
        fails.append("KV")
    status = FAIL if fails else PASS
    if slo.max_cpu_s_per_1k_tokens is not None:
        parts.append("CPU cost not assessed (simulated: the simulator does not model CPU time)")
        status = FAIL if fails else NOT_ASSESSED
    return GateResult("capacity", status, "; ".join(parts))


def error_note(errors: Mapping[str, float], validated_at: Sequence[int]) -> SimulationError:
    """``simulation_error`` of a simulated entry: the largest |error| per figure at the measured loads."""
    if not validated_at or "speedup" not in errors:
        return SimulationError(tuple(validated_at), dict(errors), NOT_VALIDATED)
    names = {"speedup": "speed-up", "throughput_tok_s": "throughput", "ttft_p50_ms": "TTFT P50",
             "tpot_p50_ms": "TPOT P50", "itl_p99_ms": "ITL P99"}
    parts = ", ".join(f"{names[k]} ±{100 * v:.0f} %" for k, v in errors.items() if k in names)
    return SimulationError(tuple(validated_at), dict(errors),
                           f"simulator vs measured at load{'s' if len(validated_at) > 1 else ''} "
                           f"{', '.join(map(str, validated_at))}: {parts}")


def simulated_scenarios(points: Sequence[SimPoint], categories: Mapping[str, str], solo: Sequence[RequestRecord],
                        measured_gates: Mapping[tuple, Sequence[tuple[int, Gates]]],
                        meta: Mapping[str, Any], slo: SLO, speedup_error: float | None,
                        n_resamples: int = 1000, seed: int = 0) -> list[Candidate]:
    """One scenario dict per (category, temperature, load, setting) of the simulated ``points`` (plain left
    out), with ``gates`` and the widened interval. ``categories``: prompt id -> category; ``measured_gates``:
    (category, temperature, drafter, gamma) -> [(load, gates)] at the measured loads."""
    plain = {(p.temperature, p.load): p for p in points if p.drafter == PLAIN.name}
    out: list[Candidate] = []
    for p in points:
        base = plain.get((p.temperature, p.load))
        if p.drafter == PLAIN.name or base is None:
            continue
        for cat in sorted({categories.get(pid, "") for pid in p.prompt_ids}):
            prompts = {pid for pid in p.prompt_ids if categories.get(pid, "") == cat}
            mask, bmask = p.select(prompts), base.select(prompts)
            s, lo, hi, n = sim_speedup(p, base, prompts, n_resamples, seed)
            e = speedup_error
            ci = ([lo * (1 - e), hi * (1 + e)] if e is not None and math.isfinite(lo) and math.isfinite(hi)
                  else [None, None])
            mine = [r for r in solo if r.category == cat and r.drafter == p.drafter and r.gamma == p.gamma
                    and float(r.temperature) == p.temperature]
            history = measured_gates.get((cat, p.temperature, p.drafter, p.gamma), [])
            gates = {
                "correctness": carried_gate("correctness", [(ld, g["correctness"]) for ld, g in history]),
                "quality": carried_gate("quality", [(ld, g["quality"]) for ld, g in history]),
                "latency": _sim_latency_gate(sim_latency(p, mask), slo),
                "capacity": sim_capacity_gate(p, base, mask, bmask, mine, meta, slo),
            }
            label = f"{cat} T={p.temperature:g} {setting_label(p.drafter, p.gamma)} @ load {p.load} (simulated)"
            out.append({"category": cat, "temperature": p.temperature, "drafter": p.drafter, "gamma": p.gamma,
                        "tree_budget": 0, "label": label, "load": p.load, "simulated": True, "paired_prompts": n,
                        "speedup": s if math.isfinite(s) else None, "speedup_ci": ci,
                        "speedup_bootstrap_ci": [lo, hi], "requests": int(mask.sum()), "reps": p.reps,
                        "latency": sim_latency(p, mask), "gates": {k: gates[k].to_dict() for k in GATES}})
    return out


def _sim_latency_gate(latency: LatencyFigures, slo: SLO) -> GateResult:
    g = load_latency_gate(latency, slo)
    return GateResult("latency", g.status, f"simulated: {g.evidence} (token-ITL P99 of the whole point)")


def plain_latency(points: Sequence[SimPoint], categories: Mapping[str, str], slo: SLO) -> dict[tuple, GateResult]:
    """Plain decoding's simulated latency gate per (category, temperature, load)."""
    out = {}
    for p in points:
        if p.drafter != PLAIN.name:
            continue
        for cat in sorted({categories.get(pid, "") for pid in p.prompt_ids}):
            mask = p.select({pid for pid in p.prompt_ids if categories.get(pid, "") == cat})
            out[(cat, p.temperature, p.load)] = _sim_latency_gate(sim_latency(p, mask), slo)
    return out


def simulated_verdicts(scenarios: Sequence[Candidate], slo: SLO, controls: Mapping[tuple[str, float], float] | None,
                       note: SimulationError, plain: Mapping[tuple, GateResult] | None = None) -> list[VerdictDict]:
    """:func:`specledger.gates.verdicts` per simulated load, each entry labelled ``simulated`` with ``note``
    (:func:`error_note`) as ``simulation_error``; the reason says it was simulated and how well validated,
    and, where ``plain`` (:func:`plain_latency`) misses the latency SLO too, that the load needs capacity."""
    plain = plain or {}
    out = []
    for load in sorted({s["load"] for s in scenarios}):
        at = [s for s in scenarios if s["load"] == load]
        here = {(c, t): g for (c, t, ld), g in plain.items() if ld == load}
        for v in decide(at, slo, controls, here, load):
            if note.text == NOT_VALIDATED and v.is_off:
                best = max((s for s in at if s["category"] == v.category and s["temperature"] == v.temperature
                            and s["speedup"] is not None), key=lambda s: s["speedup"], default=None)
                top = (f" (best: {setting_label(best['drafter'], best['gamma'])}, simulated S = {best['speedup']:.2f})"
                       if best else "")
                v.reason = ("Off: simulated, and the simulator was not validated at any measured load > 1, so its "
                            f"speed-up has no interval{top}; measure a load > 1 too (e.g. --loads 1,16) "
                            "to validate it.")
                v.resolved = False
            elif not v.is_control:
                v.reason += f" Simulated at load {load}; {note.text}."
            v.load, v.simulated, v.simulation_error = load, True, note
            out.append(v.to_dict())
    return out


__all__ = ["NOT_VALIDATED", "carried_gate", "error_note", "plain_latency", "sim_capacity_gate", "sim_goodput",
           "sim_latency", "simulated_scenarios", "simulated_verdicts"]
