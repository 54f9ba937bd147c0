"""Reconcile the ledger's predicted speed-up with the measured one, and say why a scenario loses.

Multiplicative decomposition (each factor is a ratio of measured totals, so they multiply exactly):

    predicted S  = T0 · E[L]_full / E[T_round]_full          (the simplified ledger: full rounds only)
    decode S     = T0 · Σ L_all / Σ T_round_all                (every round, truncated ones included)

(both :func:`specledger.ledger.speedup.speedup_or_nan`, the ledger's S)
    measured S   = (Σ tokens / Σ total_time)_spec / (same)_plain

    measured S = predicted S × boundary factor × outside-rounds factor
    boundary factor       = decode S / predicted S   (truncated rounds commit fewer tokens)
    outside-rounds factor = measured S / decode S    (prefill, its first token, gaps between rounds)
"""

from __future__ import annotations

import math

from specledger.analysis.stats import finite_or_none
from specledger.ledger.speedup import speedup_or_nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def reconcile(spec: dict, base: dict, t0_s: float, measured_s: float) -> dict[str, object]:
    """Predicted vs measured speed-up with the residual split into named factors.

    ``spec`` / ``base`` are the :func:`specledger.analysis.metrics.round_stats` dicts merged with
    :func:`~specledger.analysis.metrics.totals` of the paired requests.
    """
    t0_ms = t0_s * 1e3
    predicted = speedup_or_nan(t0_ms, spec["el_full"], spec["t_round_ms"])
    decode = speedup_or_nan(t0_s, spec["committed_in_rounds"], spec["round_time_s"])
    in_rounds_spec = _ratio(spec["round_time_s"], spec["total_time_s"])
    in_rounds_base = _ratio(base["round_time_s"], base["total_time_s"])
    full = spec["full_rounds"] or 0
    return {
        "t0_ms": finite_or_none(t0_ms),
        "predicted_speedup": finite_or_none(predicted),
        "decode_speedup": finite_or_none(decode),
        "measured_speedup": finite_or_none(measured_s),
        "residual": finite_or_none(measured_s - predicted),
        "relative_residual": finite_or_none(_ratio(measured_s, predicted) - 1.0),
        "boundary_factor": finite_or_none(_ratio(decode, predicted)),
        "outside_rounds_factor": finite_or_none(_ratio(measured_s, decode)),
        "truncated_round_share": finite_or_none(_ratio(spec["truncated_rounds"], spec["rounds"])),
        "zero_proposal_share": finite_or_none(_ratio(spec["zero_proposal_rounds"], full)),
        "el_full": finite_or_none(spec["el_full"]),
        "el_proposing": finite_or_none(spec["el_proposing"]),
        "prefill_share_spec": finite_or_none(_ratio(spec["prefill_time_s"], spec["total_time_s"])),
        "prefill_share_plain": finite_or_none(_ratio(base["prefill_time_s"], base["total_time_s"])),
        "in_rounds_share_spec": finite_or_none(in_rounds_spec),
        "in_rounds_share_plain": finite_or_none(in_rounds_base),
        "other_share_of_round": finite_or_none(_ratio(spec["t_other_ms"], spec["t_round_ms"])),
    }


def reconciliation_sentences(rec: dict) -> list[str]:
    """The residual between the round ledger's S (full rounds only, from the setting's own measured E[L] and round
    time: a decomposition, not the forecast model of :mod:`specledger.predict`) and the measured speed-up,
    explained with numbers."""
    p, m = rec["predicted_speedup"], rec["measured_speedup"]
    if p is None or m is None:
        return ["Not enough rounds to reconcile predicted and measured speed-up."]
    out = [
        f"Round ledger (not a forecast: this setting's own measured full rounds) T0·E[L]/E[T_round] = {p:.3f}; "
        f"measured end-to-end S = {m:.3f} (residual {m - p:+.3f}, {100 * (m / p - 1):+.1f}%), split below."
    ]
    bf, of = rec["boundary_factor"], rec["outside_rounds_factor"]
    if bf is not None:
        out.append(
            f"Boundary rounds: {100 * (rec['truncated_round_share'] or 0):.1f}% of rounds were truncated by a stop "
            f"condition; counting them moves S by ×{bf:.3f}."
        )
    if of is not None:
        out.append(
            f"Outside the rounds: prefill is {100 * (rec['prefill_share_spec'] or 0):.1f}% of speculative time vs "
            f"{100 * (rec['prefill_share_plain'] or 0):.1f}% of plain time, rounds are "
            f"{100 * (rec['in_rounds_share_spec'] or 0):.1f}% vs {100 * (rec['in_rounds_share_plain'] or 0):.1f}%; "
            f"this moves S by ×{of:.3f}."
        )
    zp = rec["zero_proposal_share"]
    if zp and rec["el_proposing"] is None:
        out.append(f"{100 * zp:.1f}% of full rounds proposed nothing: the drafter found no candidates at all.")
    elif zp:
        out.append(
            f"{100 * zp:.1f}% of full rounds proposed nothing (a plain step at round cost): E[L] is "
            f"{rec['el_full']:.2f} over all full rounds vs {rec['el_proposing']:.2f} over proposing rounds."
        )
    if rec["other_share_of_round"] is not None:
        out.append(
            f"Other overhead (sampling, cache, stop checks) is {100 * rec['other_share_of_round']:.1f}% of a round."
        )
    return out


def why_sentences(spec: dict, t0_s: float, speedup: float, little_gain: float = 1.10) -> list[str]:
    """For a scenario with S < ``little_gain``: which term ate the gain, as sentences with numbers.

    The round pays iff  t_draft + (t_verify − T0) + t_other < T0·(E[L] − 1): the left side is
    the overhead (draft, verify above a plain step, other), the right side the gain bought by
    accepted tokens. The largest overhead term is named; E[L] is blamed when the gain itself is
    small (E[L] < 1.25).
    """
    if not math.isfinite(speedup) or speedup >= little_gain:
        return []
    t0 = t0_s * 1e3
    el, draft, verify, other, rnd = (
        spec[k] for k in ("el_full", "t_draft_ms", "t_verify_ms", "t_other_ms", "t_round_ms")
    )
    if not all(math.isfinite(x) for x in (t0, el, draft, verify, other, rnd)) or rnd <= 0:
        return [f"S = {speedup:.3f}, but there are no full rounds to explain it."]
    verdict = "slows down" if speedup < 1 else "gains little"
    gain = t0 * (el - 1.0)
    terms = {"draft cost": draft, "verify cost above T0": verify - t0, "other overhead": other}
    culprit = max(terms, key=lambda k: terms[k])
    out = [
        f"It {verdict} (S = {speedup:.3f}): a round costs {rnd:.2f} ms but plain decoding makes its "
        f"E[L] = {el:.2f} tokens in T0·E[L] = {t0 * el:.2f} ms.",
        f"Accepted tokens buy {gain:.2f} ms per round; overheads spend {draft:.2f} ms drafting "
        f"({100 * draft / rnd:.0f}% of the round), {verify - t0:+.2f} ms verifying above T0 = {t0:.2f} ms "
        f"(verify is {verify / t0:.2f}× T0) and {other:.2f} ms other ({100 * other / rnd:.0f}%).",
    ]
    if el < 1.25:
        out.append(
            f"Main cause: low E[L] ({el:.2f}) -- too few candidates are accepted to pay for any round overhead."
        )
    else:
        out.append(
            f"Main cause: {culprit} ({terms[culprit]:.2f} ms per round, {terms[culprit] / t0:.2f}× T0)."
        )
    return out
