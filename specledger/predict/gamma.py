"""The optimal γ a run's end-to-end model predicts, per (category, temperature, drafter).

S(γ) for γ = 0..Γ is :func:`specledger.predict.predict.gamma_curve`: the run's monotone cost model
(fitted over every solo round of that temperature) priced over each request's expected rounds under
its own acceptance chain, prefill and boundary rounds included, so a round never costs less than a
plain step and S(γ) is an end-to-end speed-up. Γ = min(16, max(8, 2·largest γ run)); positions
beyond the measured ones follow the acceptance model's stated assumption.

It is the one forecast model of a run, the one the leave-one-γ-out self-check scores
(:mod:`specledger.predict.check`): the same cost model, acceptance chains, exact replay and each prompt's
window levels (:func:`~specledger.predict.predict.window_levels`), over the prompts where the run measured
plain decoding -- those the measured S it is drawn beside is paired on. The curve is fitted on every γ (in
sample); the check's figure for a γ is fitted without it (held out): the only difference between the two.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from specledger.cost.costmodel import fit_cost_model
from specledger.cost.surface import CostSurface
from specledger.engine.drafters.catalog import PLAIN
from specledger.predict.acceptance import AcceptanceModel
from specledger.predict.predict import gamma_curve, window_levels
from specledger.predict.replay import Replayer
from specledger.predict.results import GammaCurveDict
from specledger.records import RequestRecord


def infer_max_tokens(records: Iterable[RequestRecord]) -> int | None:
    """The run's output budget as its records show it: the longest output cut by length (None if none was)."""
    cut = [r.output_tokens for r in records if r.stop_reason == "length"]
    return max(cut) if cut else None


def plain_prompts(records: Iterable[RequestRecord]) -> dict[str, set[str]]:
    """Category -> the prompt ids the records measured plain decoding on (the prompts a measured S is paired on)."""
    out: dict[str, set[str]] = defaultdict(set)
    for r in records:
        if r.drafter == PLAIN.name:
            out[r.category or "default"].add(r.prompt_id or r.request_id)
    return out


def end_to_end_curves(records: Iterable[RequestRecord], surface: CostSurface | None = None,
                      replay: Replayer | None = None) -> dict[tuple[str, float, str], GammaCurveDict]:
    """{(category, temperature, drafter): {"curve": predicted S(γ), "prompts": how many it is priced on}} over
    solo, static-γ records (the module doc's one model): the forward priced on the run's measured verify
    ``surface`` when given and at each prompt's window levels, greedy model-free rounds replayed exactly by
    ``replay``, on the prompts where plain decoding was measured."""
    by_temp: dict[float, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if isinstance(r.gamma, int) and all(rd.batch_size <= 1 for rd in r.rounds):
            by_temp[float(r.temperature)].append(r)
    out: dict[tuple[str, float, str], GammaCurveDict] = {}
    for temp, recs in by_temp.items():
        if not any(r.drafter == PLAIN.name for r in recs) or not any(r.drafter != PLAIN.name for r in recs):
            continue
        cost = fit_cost_model(recs, n_boot=0, surface=surface)
        acc = AcceptanceModel.from_records(recs)
        max_tokens = infer_max_tokens(recs)
        window, paired = window_levels(cost, recs), plain_prompts(recs)
        for cat in acc.categories():
            for drafter in acc.drafters():
                chains = [c for c in acc.requests(cat, drafter) if c.prompt_id in paired[cat]]
                if not chains:
                    continue
                for c in chains:
                    c.max_tokens = max_tokens if c.max_tokens is None else c.max_tokens
                top = max(g for c in chains for g in c.gammas)
                curve = gamma_curve(cost, acc, cat, drafter, min(16, max(8, 2 * top)), chains,
                                    replay=replay if temp == 0 else None, window=window)  # greedy replay
                out[(cat, temp, drafter)] = {"curve": curve, "prompts": len(chains)}
    return out
