"""Races of two simulated settings: per-prompt figures drawn with numpy, raced by the real loop
(:func:`specledger.mainjob.race.race`: its look schedule, step, drops and per-category cap) and decided by the
real rule (:func:`specledger.gates.verdicts.verdicts`, with the paired intervals of :mod:`specledger.analysis.paired`).

The spread is the measured one (docs/decisions.md): a setting's per-prompt speed-up over plain spreads
:data:`SD_S` = 26 % between prompts (held-out prompts, ngram γ=4 against plain, sd of u); two good settings'
per-prompt ratio :data:`SD_PAIR` = 7 % (the middle of the 5-10 % measured from the prompts themselves). Per prompt
i, with a prompt effect ``c_i`` both settings share and an own effect ``d_{x,i}``::

    log S_{x,i} = log s_x + σ_S²/2 + c_i + d_{x,i},   c_i ~ N(0, σ_S² − σ_P²/2),   d_{x,i} ~ N(0, σ_P²/2)

and plain's time per prompt ``τ_i`` (lognormal: prompts differ in length) gives setting x's time ``τ_i / S_{x,i}``
for the same :data:`TOKENS` tokens. The ``+σ_S²/2`` makes ``E[1/S_{x,i}] = 1/s_x``, so the ratio of totals the
rule estimates is exactly ``s_x`` against plain and ``s_a / s_b`` between the settings: a race of ``s_a == s_b``
is one between two settings of equal speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from specledger.gates.result import GATES
from specledger.gates.slo import SLO
from specledger.gates.verdicts import verdicts
from specledger.mainjob.race import MAX_PROMPTS_PER_CATEGORY, RaceLog, Setting, race

#: per-prompt SD of log S against plain (docs/decisions.md: "the per-prompt S of one setting spreads 26 %")
SD_S = 0.26
#: per-prompt SD of the log ratio of two settings (docs/decisions.md: 5-10 % from the prompts themselves)
SD_PAIR = 0.07
#: output tokens per prompt, every setting
TOKENS = 40.0
#: the two settings: ``B`` is the cheaper (the rule's first), ``A`` the one that may be faster
A, B = Setting("suffix", 4), Setting("ngram", 2)


@dataclass(frozen=True)
class Outcome:
    """How one race ended: the decision's resolution (winner / equivalent / off / open), the setting it
    deploys (None for off), and the category's prompts when it stopped."""

    resolution: str
    setting: str | None
    prompts: int


def draw(s_a: float, s_b: float, races: int, seed: int, n_max: int = MAX_PROMPTS_PER_CATEGORY,
         sd_s: float = SD_S, sd_pair: float = SD_PAIR) -> dict[str, np.ndarray]:
    """Seconds per prompt of plain, A and B for ``races`` races of ``n_max`` prompts (module doc), vectorised."""
    rng = np.random.default_rng(seed)
    shape = (races, n_max)
    tau = 2.0 * np.exp(rng.normal(0.0, 0.5, shape))
    c = rng.normal(0.0, math.sqrt(sd_s**2 - sd_pair**2 / 2), shape)
    own = rng.normal(0.0, sd_pair / math.sqrt(2), (2, *shape))
    log_s = np.array([math.log(s_a), math.log(s_b)])[:, None, None] + sd_s**2 / 2 + c + own
    return {"plain": tau, A.name: tau / np.exp(log_s[0]), B.name: tau / np.exp(log_s[1])}


def _scenario(setting: Setting, seconds: list[float], plain: list[float], ran: list[int],
              with_plain: set[int]) -> dict:
    """The scenario dict the rule reads (:func:`specledger.analysis.run.analyze_scenario`'s ``per_prompt``)."""
    shared = [i for i in ran if i in with_plain]
    tok = [TOKENS] * len(shared)
    speedup = (sum(plain[i] for i in shared) / sum(seconds[i] for i in shared)) if shared else None
    return {"category": "sim", "temperature": 0.0, "drafter": setting.drafter, "gamma": setting.gamma,
            "tree_budget": 0, "label": f"sim T=0 {setting.name}", "speedup": speedup,
            "gates": {g: {"status": "pass"} for g in GATES},
            "per_prompt": {"prompts": [str(i) for i in shared], "tokens": tok,
                           "seconds": [seconds[i] for i in shared], "base_tokens": tok,
                           "base_seconds": [plain[i] for i in shared],
                           "own": {"prompts": [str(i) for i in ran], "tokens": [TOKENS] * len(ran),
                                   "seconds": [seconds[i] for i in ran]}}}


def one_race(data: dict[str, np.ndarray], r: int, slo: SLO = SLO(), initial: int = 2,
             max_per_category: int = MAX_PROMPTS_PER_CATEGORY) -> Outcome:
    """Race ``r`` of ``data``: ``initial`` prompts of plain, A and B, then :func:`race` with its default step,
    deciding by :func:`verdicts` after every round, until resolved or ``max_per_category`` prompts."""
    ran = {A.name: list(range(initial)), B.name: list(range(initial))}
    with_plain = set(range(initial))
    handed = [initial]
    row = {k: v[r].tolist() for k, v in data.items()}

    def decide() -> list[dict]:
        return verdicts([_scenario(s, row[s.name], row["plain"], ran[s.name], with_plain) for s in (A, B)], slo)

    def more(_cat: str, k: int) -> list[str]:
        ids = [str(i) for i in range(handed[0], min(handed[0] + k, data["plain"].shape[1]))]
        handed[0] += len(ids)
        return ids

    def run(_cat: str, _t: float, ids: list[str], keep: list[Setting], plain: bool) -> None:
        for s in keep:
            ran[s.name] += [int(i) for i in ids]
        if plain:
            with_plain.update(int(i) for i in ids)

    log = race(RaceLog(budget_s=math.inf), math.inf, decide, more, run, [A, B], lambda _c: handed[0],
               max_per_category=max_per_category, clock=lambda: 0.0)
    (v,) = log.final
    return Outcome(v.resolution if v.resolved else "open", v.setting if v.deploys else None, handed[0])


def races(s_a: float, s_b: float, n: int, seed: int, sd_s: float = SD_S, sd_pair: float = SD_PAIR) -> list[Outcome]:
    """``n`` races of settings at true speed-ups ``s_a`` and ``s_b`` (fixed ``seed``; spreads as :func:`draw`)."""
    data = draw(s_a, s_b, n, seed, sd_s=sd_s, sd_pair=sd_pair)
    return [one_race(data, r) for r in range(n)]


@cache
def per_look_t(n: int, alpha: float) -> float:
    """The rule before the confidence sequence: Student's t at ``1 − α`` per look (one-sided α per bound)."""
    from specledger.analysis.paired import t_quantile

    return t_quantile(1.0 - alpha, n - 1)


def with_multiplier(multiplier: Callable[..., float]) -> Callable[[], None]:
    """Swap the paired intervals' multiplier (e.g. :func:`per_look_t`, the old rule); returns the undo."""
    import specledger.analysis.paired as paired

    before = paired.cs_multiplier
    paired.cs_multiplier = multiplier

    def undo() -> None:
        paired.cs_multiplier = before

    return undo


def false_calls(outcomes: list[Outcome]) -> float:
    """Share of races of two equally fast settings (both paying) that ended "winner" (one called faster than the
    other) or "off" (speculation called not worth it)."""
    return sum(o.resolution in ("winner", "off") for o in outcomes) / len(outcomes)


__all__ = ["A", "B", "SD_PAIR", "SD_S", "TOKENS", "Outcome", "draw", "false_calls", "one_race", "per_look_t",
           "races", "with_multiplier"]
