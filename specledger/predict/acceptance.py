"""Acceptance per request: conditional chains a_j, the drafter's fill, and what is assumed beyond.

For one prompt and drafter, pooled over every γ it ran (full rounds only; truncated rounds are
cut by a stop condition and say nothing about acceptance):

    a_j = #(K ≥ j) / #(K ≥ j−1)     among rounds with proposed ≥ j          (position j measured
                                                                            when ≥ 1 round reached it)
    f_i = #(proposed ≥ i) / #(proposed ≥ i−1)   among rounds that asked γ ≥ i   (conditional fill)
    q_i = Π_{k≤i} f_k = Pr(proposed ≥ i | asked ≥ i)                        (the contract's ``fill``)

Positions never measured (ASSUMPTION, also stated in every output): a_j for j beyond the
request's last measured position is the request's *own pooled deeper acceptance* — Σ passed / Σ at-risk
over its measured positions j ≥ 2 (all positions when it measured only the first) — shrunk toward the
same quantity pooled over the category's requests with ``PRIOR`` pseudo-rounds; the conditional fill f_i
beyond the measured positions is the request's pooled conditional fill over positions i ≥ 2 (once a
drafter proposes, does it go on?), shrunk the same way. Measured positions with few observations are
shrunk toward the pooled a_j of that position. (Model selection, on the bundled workloads' runs only --
never on a held-out check's prompts: with the streak states below, deeper acceptance from positions j ≥ 2
predicted the rounds per request of γ 8 from
γ 2,4, γ 1 from γ 4,8 and every leave-one-γ-out better than from all positions, and better than either
without the states; stated in the closing note of issue 18 with the figures.)

Streak (the round before): every count above is also kept for the rounds that follow a *full* round (one
that proposed ≥ 1 candidate and had all of them accepted). After such a round the drafter is inside text it
can copy, and the next first candidate is accepted far more often; the pooled chain averages the two states
in the proportions of the γ's the run used, which is why it flattens how S moves with γ (at a small γ most
rounds are full and follow full rounds, at a deep γ few are). :meth:`AcceptanceModel.state_chains` gives
(a, f) per state -- 0: after a round that was not full (and the first round), 1: after a full round -- each
estimated as above within its state (shrunk toward the category's pooled chain *of that state*; a state
nobody in the category reached uses the state-free chain), and the forecast runs a two-state chain over
rounds (:func:`specledger.predict.predict.expected_features`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from specledger.engine.drafters.catalog import PLAIN
from specledger.records import RequestRecord

PRIOR = 2.0  # pseudo-rounds of the pooled value added to every per-request estimate
DEEP_FROM = 1  # index of the first position (j = DEEP_FROM + 1) whose acceptance extends the chain
FILL_DEEP_FROM = 1  # the same for the conditional fill (i >= 2: once a drafter proposes, does it go on?)

ASSUMPTION = (
    "acceptance and fill depend on whether the previous round was full (all proposed accepted): two chains per "
    "request; a_j beyond a request's last measured position = that request's pooled acceptance over its "
    "measured positions j>=2 (within the state), shrunk toward the category's pooled value with 2 pseudo-rounds; the "
    "drafter's conditional fill beyond the measured positions = the request's pooled fill over positions i>=2 "
    "(model drafters always fill)"
)
STATES = (0, 1)  # the previous round was not full (or there was none) / was full


@dataclass
class RequestChain:
    """One measured request's acceptance: conditional a_j for positions 1..len(chain) (position j measured only
    when >= 1 round reached it), fill q_i = Pr(drafter proposed >= i | asked >= i), and its sizes."""

    category: str
    drafter: str
    chain: list[float]
    fill: list[float]
    prompt_tokens: int
    output_tokens: int
    weight: float = 1.0  # rounds observed (for pooling)
    prompt_id: str = ""
    at_risk: list[int] = field(default_factory=list)  # rounds at risk at position j
    passed: list[int] = field(default_factory=list)  # of those, K >= j
    fill_asked: list[int] = field(default_factory=list)  # rounds that asked >= i and proposed >= i-1
    fill_got: list[int] = field(default_factory=list)  # of those, proposed >= i
    gammas: list[int] = field(default_factory=list)  # static gammas pooled into this chain
    # the same four counts over the rounds that follow a full round (all proposed accepted, proposed >= 1)
    at_risk_full: list[int] = field(default_factory=list)
    passed_full: list[int] = field(default_factory=list)
    fill_asked_full: list[int] = field(default_factory=list)
    fill_got_full: list[int] = field(default_factory=list)
    prefill_tokens: int = 1  # output tokens emitted by the prefill (the engine's first token), not by rounds
    stop_reason: str = ""
    max_tokens: int | None = None

    def state_view(self, state: int) -> RequestChain:
        """This request's counts over the rounds of one streak ``state`` (1: after a full round, 0: the rest)."""
        def minus(total: list[int], part: list[int]) -> list[int]:
            return [t - (part[i] if i < len(part) else 0) for i, t in enumerate(total)]

        if state == 1:
            counts = (self.at_risk_full, self.passed_full, self.fill_asked_full, self.fill_got_full)
        else:
            counts = (minus(self.at_risk, self.at_risk_full), minus(self.passed, self.passed_full),
                      minus(self.fill_asked, self.fill_asked_full), minus(self.fill_got, self.fill_got_full))
        at, ps, fa, fg = (list(c) for c in counts)
        return replace(self, at_risk=at, passed=ps, fill_asked=fa, fill_got=fg, weight=float(at[0] if at else 0),
                       at_risk_full=[], passed_full=[], fill_asked_full=[], fill_got_full=[])

    @property
    def has_states(self) -> bool:
        """Whether the streak counts were kept (chains saved before them have none)."""
        return bool(self.at_risk_full or self.fill_asked_full)

    @property
    def round_tokens(self) -> int:
        """Tokens the rounds committed (output minus what the prefill emitted)."""
        return max(self.output_tokens - self.prefill_tokens, 0)


def _ratio(num: Sequence[int], den: Sequence[int], start: int) -> tuple[float, float]:
    n = sum(num[start:]) if len(num) > start else 0
    d = sum(den[start:]) if len(den) > start else 0
    return float(n), float(d)


class AcceptanceModel:
    """Per (category, drafter): the list of per-request chains (the spread between requests is kept, not only
    the mean). ``assumption`` states in words what is used for positions never measured."""

    assumption: str = ASSUMPTION
    streak: bool = True  # forecasts use the two-state chains (state_chains) when the counts are there

    def __init__(self, chains: Iterable[RequestChain] = ()) -> None:
        self._chains: dict[tuple[str, str], list[RequestChain]] = defaultdict(list)
        for c in chains:
            self._chains[(c.category, c.drafter)].append(c)
        self.assumption = ASSUMPTION

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def from_records(cls, records: Iterable[RequestRecord], exclude_gammas: Iterable[int] = ()) -> AcceptanceModel:
        """One chain per (category, drafter, prompt), pooled over its static-γ records (policies, plain
        decoding and token trees are skipped -- a tree's siblings are alternatives, not chain positions: see
        :mod:`specledger.predict.tree_forecast`; ``exclude_gammas`` leaves those γ's out, for honest
        held-out checks)."""
        skip = set(exclude_gammas)
        groups: dict[tuple[str, str, str], list[RequestRecord]] = defaultdict(list)
        for r in records:
            if r.drafter == PLAIN.name or not isinstance(r.gamma, int) or r.gamma <= 0 or r.gamma in skip \
                    or r.tree_budget:
                continue
            groups[(r.category or "default", r.drafter, r.prompt_id or r.request_id)].append(r)
        return cls(chain_from_records(recs) for recs in groups.values())

    # -- queries ----------------------------------------------------------------------------
    def requests(self, category: str, drafter: str) -> list[RequestChain]:
        return list(self._chains.get((category, drafter), []))

    def categories(self) -> list[str]:
        return sorted({c for c, _ in self._chains})

    def drafters(self) -> list[str]:
        return sorted({d for _, d in self._chains})

    def pooled(self, category: str, drafter: str, positions: int) -> tuple[list[float], list[float], float, float]:
        """Pooled (a_j, f_i) over the category's requests for j = 1..positions, and the pooled deeper-position
        acceptance and fill (the fallback for positions nobody measured)."""
        reqs = self.requests(category, drafter)
        at, ps, fa, fg = ([0.0] * positions for _ in range(4))
        for c in reqs:
            for j in range(min(positions, len(c.at_risk))):
                at[j] += c.at_risk[j]
                ps[j] += c.passed[j]
            for j in range(min(positions, len(c.fill_asked))):
                fa[j] += c.fill_asked[j]
                fg[j] += c.fill_got[j]
        deep_p = sum(sum(c.passed[DEEP_FROM:]) for c in reqs)
        deep_a = sum(sum(c.at_risk[DEEP_FROM:]) for c in reqs)
        if deep_a == 0:
            deep_p, deep_a = sum(sum(c.passed) for c in reqs), sum(sum(c.at_risk) for c in reqs)
        deep = deep_p / deep_a if deep_a else 0.0
        fdeep_g = sum(sum(c.fill_got[FILL_DEEP_FROM:]) for c in reqs)
        fdeep_a = sum(sum(c.fill_asked[FILL_DEEP_FROM:]) for c in reqs)
        if fdeep_a == 0:
            fdeep_g, fdeep_a = sum(sum(c.fill_got) for c in reqs), sum(sum(c.fill_asked) for c in reqs)
        fdeep = fdeep_g / fdeep_a if fdeep_a else 1.0
        a = [ps[j] / at[j] if at[j] else deep for j in range(positions)]
        f = [fg[j] / fa[j] if fa[j] else fdeep for j in range(positions)]
        return a, f, deep, fdeep

    def request_chain(self, req: RequestChain, positions: int,
                      pooled: tuple[list[float], list[float], float, float] | None = None
                      ) -> tuple[list[float], list[float]]:
        """(a_j, f_i) of one request for j = 1..positions under the stated assumption (see module docstring)."""
        pa, pf, deep, fdeep = pooled or self.pooled(req.category, req.drafter, positions)
        # the request's own deeper-position values, shrunk toward the pooled ones
        dp, da = _ratio(req.passed, req.at_risk, DEEP_FROM)
        if da == 0:
            dp, da = _ratio(req.passed, req.at_risk, 0)
        own_deep = (dp + PRIOR * deep) / (da + PRIOR)
        gp, ga = _ratio(req.fill_got, req.fill_asked, FILL_DEEP_FROM)
        if ga == 0:
            gp, ga = _ratio(req.fill_got, req.fill_asked, 0)
        own_fdeep = (gp + PRIOR * fdeep) / (ga + PRIOR)
        return (_shrunk(req.passed, req.at_risk, pa, own_deep, positions),
                _shrunk(req.fill_got, req.fill_asked, pf, own_fdeep, positions))

    def state_chains(self, req: RequestChain, positions: int) -> list[tuple[list[float], list[float]]] | None:
        """[(a, f) after a round that was not full, (a, f) after a full round] of one request (module docstring),
        or None when the chains carry no streak counts. A state that no request of the category reached takes
        the state-free chain."""
        reqs = self.requests(req.category, req.drafter)
        if not any(c.has_states for c in reqs):
            return None
        out = []
        for state in STATES:
            views = [c.state_view(state) for c in reqs]
            if not any(v.at_risk and v.at_risk[0] > 0 for v in views):
                out.append(self.request_chain(req, positions))
                continue
            model = AcceptanceModel(views)
            out.append(model.request_chain(req.state_view(state), positions,
                                           model.pooled(req.category, req.drafter, positions)))
        return out

    def extend(self, chain: list[float], positions: int) -> list[float]:
        """Apply the stated assumption to a bare chain (no counts): positions beyond it take the mean of
        its measured positions from ``DEEP_FROM + 1`` on (0 when empty)."""
        chain = [float(x) for x in chain[:positions]]
        if len(chain) >= positions:
            return chain
        deeper = chain[DEEP_FROM:] or chain
        fill_value = sum(deeper) / len(deeper) if deeper else 0.0
        return chain + [fill_value] * (positions - len(chain))

    # -- persistence ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"assumption": self.assumption,
                "requests": [asdict(c) for cs in self._chains.values() for c in cs]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AcceptanceModel:
        return cls(RequestChain(**c) for c in d.get("requests", []))


def chain_from_records(records: Sequence[RequestRecord]) -> RequestChain:
    """Pool the full rounds of one prompt's records (one drafter, any static γ's) into a RequestChain."""
    first = records[0]
    depth = max((rd.gamma for r in records for rd in r.rounds), default=0)
    at = [0] * depth
    ps = [0] * depth
    fa = [0] * depth
    fg = [0] * depth
    at1, ps1, fa1, fg1 = ([0] * depth for _ in range(4))  # the rounds that follow a full round
    n_rounds = 0
    for r in records:
        after_full = False  # a request's first round follows the prefill
        for rd in r.rounds:
            if rd.truncated:
                continue
            n_rounds += 1
            _tally(rd.proposed, rd.accepted, after_full, (at, ps), (at1, ps1))  # acceptance given reached
            _tally(rd.gamma, rd.proposed, after_full, (fa, fg), (fa1, fg1))  # the drafter's own fill
            after_full = rd.proposed >= 1 and rd.accepted >= rd.proposed
    last = max((j + 1 for j in range(depth) if at[j] > 0), default=0)
    chain = [ps[j] / at[j] for j in range(last)]
    lastf = max((i + 1 for i in range(depth) if fa[i] > 0), default=0)
    fill, q = [], 1.0
    for i in range(lastf):
        q *= fg[i] / fa[i]
        fill.append(q)
    out_tokens = [r.output_tokens for r in records]
    round_tokens = [sum(rd.committed for rd in r.rounds) for r in records]
    return RequestChain(
        category=first.category or "default",
        drafter=first.drafter,
        chain=chain,
        fill=fill,
        prompt_tokens=int(first.prompt_tokens),
        output_tokens=int(round(sum(out_tokens) / len(out_tokens))),
        weight=float(n_rounds),
        prompt_id=first.prompt_id or first.request_id,
        at_risk=at[:last],
        passed=ps[:last],
        fill_asked=fa[:lastf],
        fill_got=fg[:lastf],
        gammas=sorted({int(r.gamma) for r in records if isinstance(r.gamma, int)}),
        at_risk_full=at1[:last],
        passed_full=ps1[:last],
        fill_asked_full=fa1[:lastf],
        fill_got_full=fg1[:lastf],
        prefill_tokens=max(min(o - t for o, t in zip(out_tokens, round_tokens)), 0),
        stop_reason=first.stop_reason,
        max_tokens=first.extra.get("max_tokens") if isinstance(first.extra.get("max_tokens"), int) else None,
    )


def _tally(positions: int, level: int, after_full: bool, counts: tuple[list, list], after: tuple[list, list]) -> None:
    """For positions j = 1..``positions`` that ``level`` reached (level >= j - 1): one more reaching j and, if
    level >= j, one more passing it -- in ``counts`` always, in ``after`` too when the round follows a full one."""
    for j in range(1, positions + 1):
        if level >= j - 1:
            for reached, passed in (counts, after) if after_full else (counts,):
                reached[j - 1] += 1
                passed[j - 1] += int(level >= j)


def _shrunk(hits: list, trials: list, pooled: list, deep: float, positions: int) -> list[float]:
    """Per position j < ``positions``: (hits_j + PRIOR * prior_j) / (trials_j + PRIOR), prior_j the pooled rate at j
    (``deep`` beyond the pooled positions); ``deep`` itself where the request has no trial at j."""
    out = []
    for j in range(positions):
        n = trials[j] if j < len(trials) else 0
        prior = pooled[j] if j < len(pooled) else deep
        out.append((hits[j] + PRIOR * prior) / (n + PRIOR) if n > 0 else deep)
    return out
