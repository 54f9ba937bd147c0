"""The ledger of one request (``specledger generate``): its rounds, and its speed-up over the plain
decode of the same prompt. Pure: records in, a JSON-ready dict out (times in ms)."""

from __future__ import annotations

from typing import TypedDict

from specledger.analysis.metrics import round_stats
from specledger.ledger.speedup import speedup_or_nan
from specledger.records import GammaSpec, RequestRecord

# "E[L]" is no identifier: the always-present keys in the functional form
_RequestLedgerKeys = TypedDict("_RequestLedgerKeys", {
    "drafter": str, "gamma": GammaSpec, "output_tokens": int, "stop_reason": str, "rounds": int,
    "truncated_rounds": int, "E[L]": float, "conditional_acceptance": list[float | None], "k_histogram": list[int],
    "t_draft_ms": float, "t_verify_ms": float, "t_other_ms": float, "t_round_ms": float, "ttft_ms": float,
    "tokens_per_s": float | None})


class RequestLedgerDict(_RequestLedgerKeys, total=False):
    """One request's ledger (E[L] of its full rounds, a_j, K histogram, the mean round split in ms); against a
    plain decode of the same prompt also plain's tokens/s, its step time T0, the predicted and measured
    speed-ups and whether the outputs are identical."""

    plain_tokens_per_s: float
    T0_ms: float
    predicted_speedup: float | None
    speedup: float
    identical_to_plain: bool


def request_ledger(spec: RequestRecord, plain: RequestRecord | None = None) -> RequestLedgerDict:
    """E[L], the conditional acceptances a_j, the mean round-time split and the K histogram of ``spec``;
    with ``plain`` also the speed-up, measured as (committed tokens / time of ``spec``) / (the same
    of ``plain``), and the predicted one, the ledger's S = T0 · E[L] / mean round time
    (:func:`specledger.ledger.speedup.speedup_or_nan`; T0: plain's mean step time)."""
    st = round_stats([spec])
    out: RequestLedgerDict = {
        "drafter": spec.drafter,
        "gamma": spec.gamma,
        "output_tokens": spec.output_tokens,
        "stop_reason": spec.stop_reason,
        "rounds": st["rounds"],
        "truncated_rounds": st["truncated_rounds"],
        "E[L]": st["el_full"],
        "conditional_acceptance": [c["a"] for c in st["conditional_acceptance"]],
        "k_histogram": st["k_histogram"],
        "t_draft_ms": st["t_draft_ms"],
        "t_verify_ms": st["t_verify_ms"],
        "t_other_ms": st["t_other_ms"],
        "t_round_ms": st["t_round_ms"],
        "ttft_ms": spec.ttft * 1e3,
        "tokens_per_s": spec.output_tokens / spec.total_time if spec.total_time > 0 else None,
    }
    if plain is not None:
        base = round_stats([plain])
        t0 = base["t_round_ms"]
        out["plain_tokens_per_s"] = plain.output_tokens / plain.total_time
        out["T0_ms"] = t0
        out["predicted_speedup"] = speedup_or_nan(t0, st["el_full"], st["t_round_ms"]) if st["full_rounds"] else None
        out["speedup"] = out["tokens_per_s"] / out["plain_tokens_per_s"]
        out["identical_to_plain"] = spec.token_ids == plain.token_ids
    return out
