"""One recommendation for the traffic as a whole: the setting best for the workload's mix of categories.

A server that carries every category's traffic runs one setting. Its speed-up on the mix is a ratio of
weighted per-request totals: with category shares ``w_c`` (each category's share of the requests, or a mix
the user gives) and, per category, the mean committed tokens ``κ_c`` and seconds ``τ_c`` per request,

    S_mix(x) = (Σ_c w_c κ_c^x / Σ_c w_c τ_c^x) / (Σ_c w_c κ_c^0 / Σ_c w_c τ_c^0)

(plain decoding 0), and two settings compare as ``S_mix(x) / S_mix(y)`` on the prompts both ran in each
category: the per-prompt ratios of each category weighted by its share, with a stratified interval
(:func:`specledger.analysis.paired.stratified_ratio`). The decision is made by the same rule as every category's
(:func:`specledger.gates.verdicts.decide_group`: the equivalence margin, the tie rule, the same wording) on
those intervals; a setting's gates on the mix are its gates in every category of positive share (one that
fails anywhere fails the mix: the one server serves that category too). The per-category decisions stand
beside it: the mix answers "one setting for all of it", they answer "the best per category"."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from specledger.analysis.paired import RatioInterval, stratified_ratio
from specledger.errors import SpecLedgerError
from specledger.gates.candidates import Candidate, Gates, PairedTotals, PromptBlocks, PromptTotals
from specledger.gates.decision import DecisionGroup, MixSetting, VerdictDict
from specledger.gates.result import FAIL, GATES, NOT_ASSESSED, PASS, GateOutcome
from specledger.gates.slo import SLO
from specledger.gates.verdict_rules import CONTROL_CATEGORIES, setting_name
from specledger.gates.verdicts import decide_group
from specledger.workloads.context_buckets import split_key

#: the category name of the mix's decision
MIX_CATEGORY = "all traffic"


def parse_mix(text: str | None) -> dict[str, float] | None:
    """``"code=0.5,agent=0.5"`` -> shares (normalised to sum 1); None for None; a one-line error otherwise."""
    if text is None or not text.strip():
        return None
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            share = float(value)
        except ValueError:
            share = math.nan
        if not sep or not name.strip() or not math.isfinite(share) or share < 0:
            raise SpecLedgerError(f"--mix {text!r}: give CATEGORY=SHARE pairs, e.g. code=0.5,agent=0.5")
        out[name.strip()] = out.get(name.strip(), 0.0) + share
    total = sum(out.values())
    if total <= 0:
        raise SpecLedgerError(f"--mix {text!r}: the shares add up to 0")
    return {k: v / total for k, v in out.items()}


def _per_bucket(cats: Sequence[str], shares: Mapping[str, float] | None) -> Mapping[str, float] | None:
    """``shares`` with a category's share split equally among its context buckets' decision keys
    (``long`` -> ``long@1-2k``, ``long@2-4k``; :mod:`specledger.mainjob.buckets`) where ``cats`` holds those."""
    if not shares:
        return shares
    keys: dict[str, list[str]] = {}
    for c in cats:
        base, bucket = split_key(c)
        if bucket is not None and base in shares and c not in shares:
            keys.setdefault(base, []).append(c)
    out = {k: v for k, v in shares.items() if k not in keys}
    for base, split in keys.items():
        out.update({c: float(shares[base]) / len(split) for c in split})
    return out


def mix_weights(categories: Sequence[str], counts: Mapping[str, float] | None = None,
                given: Mapping[str, float] | None = None, strict: bool = True) -> dict[str, float]:
    """Each category's share: ``given`` (a category it does not name gets 0; one it names that was not measured
    is an error where ``strict``, else left out), else the share of ``counts`` (requests per category in the
    workload), else equal shares."""
    cats = [c for c in dict.fromkeys(categories) if c not in CONTROL_CATEGORIES]
    given, counts = _per_bucket(cats, given), _per_bucket(cats, counts)
    if given:
        unknown = sorted(set(given) - set(cats))
        if unknown and strict:
            raise SpecLedgerError(f"--mix names {', '.join(unknown)}, not measured here (the workload's "
                                  f"categories: {', '.join(cats)}); give shares of those only")
        raw = {c: float(given.get(c, 0.0)) for c in cats}
    elif counts and any(float(counts.get(c, 0)) > 0 for c in cats):
        raw = {c: float(counts.get(c, 0.0)) for c in cats}
    else:
        raw = {c: 1.0 for c in cats}
    total = sum(raw.values()) or 1.0
    return {c: v / total for c, v in raw.items()}


def _block(pp: PromptTotals) -> dict[str, tuple[float, float]]:
    """prompt -> (tokens, seconds) of a per-prompt block."""
    return dict(zip(pp.get("prompts") or [], zip(pp.get("tokens") or [], pp.get("seconds") or [])))


def _plain_block(pp: PairedTotals) -> dict[str, tuple[float, float]]:
    """prompt -> (tokens, seconds) of plain's side of a setting's per-prompt block."""
    return _block({"prompts": pp.get("prompts") or [], "tokens": pp.get("base_tokens") or [],
                   "seconds": pp.get("base_seconds") or []})


def _strata(a: PromptBlocks, b: PromptBlocks, weights: Mapping[str, float]) -> list[tuple[float, list[list[float]]]]:
    """Per category of positive weight: (w_c, [tok_a, t_a, tok_b, t_b] on the prompts both sides ran)."""
    out = []
    for cat, w in weights.items():
        if w <= 0:
            continue
        pa, pb = a.get(cat) or {}, b.get(cat) or {}
        shared = sorted(set(pa) & set(pb))
        out.append((w, [[pa[p][0] for p in shared], [pa[p][1] for p in shared],
                        [pb[p][0] for p in shared], [pb[p][1] for p in shared]]))
    return out


def _ratio(a: PromptBlocks, b: PromptBlocks, weights: Mapping[str, float], alpha: float) -> RatioInterval:
    """S_mix(a) / S_mix(b) (or S_mix(a) against plain when ``b`` is plain's blocks), stratified."""
    return stratified_ratio(_strata(a, b, weights), (1, -1, -1, 1), alpha)


def _mix_gates(per_cat: Mapping[str, Candidate], weights: Mapping[str, float]) -> Gates:
    """A setting's gates on the mix: fail when it fails in a category of positive share, pass when it passes in
    every one, else not assessed; the evidence names the categories."""
    out: Gates = {}
    for name in GATES:
        rows: dict[str, GateOutcome] = {c: (s.get("gates") or {}).get(name) or {} for c, s in per_cat.items()
                                        if weights.get(c, 0) > 0}
        failed = [c for c, g in rows.items() if g.get("status") == FAIL]
        status = FAIL if failed else PASS if rows and all(g.get("status") == PASS for g in rows.values()) \
            else NOT_ASSESSED
        evidence = ("; ".join(f"{c}: {rows[c].get('evidence', '')}" for c in failed) if failed
                    else f"{status} in every category" if status == PASS else "not assessed in some category")
        marginal = sorted({m for g in rows.values() for m in g.get("marginal") or []})
        out[name] = {"status": status, "evidence": evidence}
        if marginal:
            out[name]["marginal"] = marginal
    return out


def _mix_scenario(label: str, per_cat: Mapping[str, Candidate], weights: Mapping[str, float],
                  alpha: float) -> Candidate | None:
    """One setting over the mix: its blocks per category (vs plain, and its own), S_mix and its gates; None
    when it was not measured against plain in every category of positive share."""
    if any(weights[c] > 0 and not ((per_cat.get(c) or {}).get("per_prompt") or {}).get("prompts") for c in weights):
        return None
    first = next(iter(per_cat.values()))
    spec = {c: _block(s["per_prompt"]) for c, s in per_cat.items()}
    plain = {c: _plain_block(s["per_prompt"]) for c, s in per_cat.items()}
    own = {c: _block(s["per_prompt"].get("own") or s["per_prompt"]) for c, s in per_cat.items()}
    iv = _ratio(spec, plain, weights, alpha)
    if not math.isfinite(iv.ratio):
        return None
    totals = {"requests": sum(float((s.get("totals") or {}).get("requests") or 0) for s in per_cat.values()),
              "tokens": sum(float((s.get("totals") or {}).get("tokens") or 0) for s in per_cat.values())}
    return {"category": MIX_CATEGORY, "temperature": first["temperature"], "drafter": first["drafter"],
            "gamma": first["gamma"], "tree_budget": first.get("tree_budget") or 0, "label": label,
            "speedup": iv.ratio, "speedup_ci": [iv.lo, iv.hi], "paired_prompts": iv.n, "totals": totals,
            "gates": _mix_gates(per_cat, weights), "mix_blocks": {"spec": spec, "plain": plain, "own": own},
            "mix_vs_plain": iv, "per_category_speedup": {c: s.get("speedup") for c, s in per_cat.items()}}


def mix_decisions(scenarios: Sequence[Candidate], slo: SLO = SLO(),
                  counts: Mapping[str, float] | None = None,
                  given: Mapping[str, float] | None = None) -> list[VerdictDict]:
    """The mix's decision per temperature from the load-1 scenarios (each with ``per_prompt`` and ``gates``),
    as :func:`~specledger.gates.verdicts.decide_group` writes a category's, with ``category`` = "all traffic",
    ``weights`` (the shares used) and, per setting, its S on the mix and in each category (``settings``)."""
    by_t: dict[float, dict[str, dict[str, Candidate]]] = defaultdict(lambda: defaultdict(dict))
    for s in scenarios:
        if s.get("category") in CONTROL_CATEGORIES or not s.get("per_prompt"):
            continue
        by_t[float(s["temperature"])][setting_name(s)][str(s["category"])] = s
    out = []
    for temp, settings in sorted(by_t.items()):
        cats = sorted({c for per_cat in settings.values() for c in per_cat})
        weights = mix_weights(cats, counts, given, strict=False)
        if len([c for c, w in weights.items() if w > 0]) < 2:
            continue  # one category: its own decision is the mix's
        items = [m for label, per_cat in settings.items()
                 if (m := _mix_scenario(label, per_cat, weights, slo.decision_alpha)) is not None]
        if not items:
            continue
        def vs_plain(s: Candidate, alpha: float) -> RatioInterval:
            return s["mix_vs_plain"]

        def compare(a: Candidate, b: Candidate, _ia: RatioInterval, _ib: RatioInterval, alpha: float,
                    weights: Mapping[str, float] = weights) -> RatioInterval:
            return _ratio(a["mix_blocks"]["own"], b["mix_blocks"]["own"], weights, alpha)

        verdict = decide_group(items, slo, DecisionGroup(MIX_CATEGORY, temp), vs_plain=vs_plain, compare=compare)
        verdict.weights = weights
        verdict.settings = [MixSetting(s["label"], s["speedup"], (s["mix_vs_plain"].lo, s["mix_vs_plain"].hi),
                                       s["paired_prompts"], s["per_category_speedup"]) for s in items]
        out.append(verdict.to_dict())
    return out


__all__ = ["MIX_CATEGORY", "mix_decisions", "mix_weights", "parse_mix"]
