"""End-to-end prediction of a configuration that was not run: prefill + every round, boundary rounds included.

Per request (prompt tokens P, tokens the prefill emits e (1 on the engine: the first token), tokens
the rounds must commit N, the request's max_tokens M), the engine's loop is replayed in
expectation. With n tokens still to commit, the round starts at context c = P + e + (N − n), asks

    g(n) = min(γ, M − (e + N − n) − 1)                    (the engine never asks past max_tokens)

candidates, the drafter proposes p ≤ g with Pr(p ≥ i) = Π_{k≤i} f_k, the target accepts K ≤ p with
Pr(K ≥ j | p) = Π_{k≤j} a_k, and the round commits min(K + 1, n) tokens (the boundary round is cut).
Its cost is T_d(g, c) + T_s(p + 1, 1, c) + T_o(L, c, e + N − n). Every cost part is linear in its coefficients,
so the recursion

    V(n) = x(n) + Σ_l Pr(L = l) · V(n − min(l, n)),   V(0) = 0

runs on *feature vectors* x (forward, draft and other features of the round): the expected time
is coef · V(N), for any cost model (the interval re-prices V with draws of the coefficients
instead of re-running the recursion). The request's total is T = T_p(P) + T_b(P) + coef · V(N).

Plain decoding is the same recursion at γ = 0. A category's predicted speed-up is
S = (Σ N_spec / Σ T_spec) / (Σ N_plain / Σ T_plain) over its requests (same prompts; greedy output does
not depend on the drafter), both sides priced by the one cost model: a speed-up is a ratio of two
times taken in the same phase of the machine (the main job runs a prompt's settings side by side,
:mod:`specledger.engine.interleave`), so the forecast compares like with like -- dividing a modelled
speculative time by a plain time measured in another phase would carry that phase's drift into S.
Tokens/s is S times the run's *measured* plain tokens/s of those prompts where the run has it at the
forecast's output budget (the machine's own speed), else Σ (e + N) / Σ T_spec. The interval is the
5-95 % range over a bootstrap of requests combined with draws of the cost model's coefficients.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specledger.cost.costmodel import DRAFT_TERMS, FORWARD_TERMS, OTHER_TERMS, CostModel, forward_features
from specledger.cost.levels import fit_row_levels, through_levels
from specledger.predict.acceptance import AcceptanceModel, RequestChain
from specledger.predict.replay import REPLAY_ASSUMPTION, Replayer
from specledger.predict.results import GammaPointDict, Prediction
from specledger.records import RequestRecord, RoundRecord

N_D, N_O = len(DRAFT_TERMS), len(OTHER_TERMS)


def round_distribution(gamma: int, a: Sequence[float], f: Sequence[float]) -> np.ndarray:
    """joint[p, k] = Pr(proposed = p, K = k) for a round asking ``gamma`` (a, f: conditional chains)."""
    joint = np.zeros((gamma + 1, gamma + 1))
    surv_p = 1.0
    for p in range(gamma + 1):
        nxt = surv_p * f[p] if p < gamma else 0.0  # Pr(proposed >= p + 1)
        pr_p = surv_p - nxt
        surv_k = 1.0
        for k in range(p + 1):
            nk = surv_k * a[k] if k < p else 0.0
            joint[p, k] = pr_p * (surv_k - nk)
            surv_k = nk
        surv_p = nxt
    return joint


ForwardX = Callable[[int, float], np.ndarray]  # (rows, context) -> forward features of one solo round


def legacy_forward(rows: int, context: float) -> np.ndarray:
    """The linear form's forward features of a solo round (no measured surface)."""
    x = forward_features(rows, 1, context)
    return np.array([x[t] for t in FORWARD_TERMS])


def expected_features(
    gamma: int,
    a: Sequence[float],
    f: Sequence[float],
    prompt_tokens: int,
    round_tokens: int,
    prefill_tokens: int = 1,
    max_tokens: int | None = None,
    forward: ForwardX = legacy_forward,
    after_full: tuple[Sequence[float], Sequence[float]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Expected summed (forward, draft, other) feature vectors over a request's rounds, and the expected
    number of rounds (see module docstring). ``a`` and ``f`` need ``gamma`` positions.

    Per state the features are exact expectations at a fixed context: forward Σ_p Pr(p)·forward(p + 1, c)
    (the measured surface, or the linear form's features), draft [1, g, c, g·c] (0 when g = 0),
    other [1, E[L], c, output so far].

    ``after_full`` = (a, f) after a full round (all proposed accepted; :meth:`AcceptanceModel.state_chains`):
    then ``a, f`` hold after any other round and the first, and the expectation runs over a two-state chain,
    v[n, s] = x_s + Σ_k Pr_s(K = k, not full)·v[n − L_k, 0] + Pr_s(K = k = P ≥ 1)·v[n − L_k, 1]."""
    n_tot = int(round_tokens)
    m = int(max_tokens) if max_tokens is not None else prefill_tokens + n_tot
    states = [(a, f)] if after_full is None else [(a, f), after_full]
    cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    n_f = len(forward(1, float(prompt_tokens)))
    v = np.zeros((n_tot + 1, len(states), n_f + N_D + N_O + 1))  # [forward | draft | other | rounds] per state
    ks = np.arange(max(gamma, 0) + 1)
    for n in range(1, n_tot + 1):
        done = prefill_tokens + n_tot - n
        c = float(prompt_tokens + done)
        g = max(min(gamma, m - done - 1), 0)
        lc = np.minimum(ks[: g + 1] + 1, n)
        for s, (a_s, f_s) in enumerate(states):
            if (s, g) not in cache:
                joint = round_distribution(g, a_s, f_s)
                full = np.array([joint[k, k] if k >= 1 else 0.0 for k in range(g + 1)])  # P = K = k >= 1
                cache[(s, g)] = (joint.sum(axis=1), joint.sum(axis=0), full)
            pr_p, pr_k, full = cache[(s, g)]
            x = np.zeros(n_f + N_D + N_O + 1)
            x[:n_f] = sum(pr * forward(p + 1, c) for p, pr in enumerate(pr_p) if pr > 0)
            if g > 0:
                x[n_f:n_f + N_D] = (1.0, g, c, g * c)
            x[n_f + N_D:n_f + N_D + N_O] = (1.0, float(pr_k @ lc), c, float(done))
            x[-1] = 1.0
            if len(states) == 1:
                v[n, 0] = x + pr_k @ v[n - lc, 0]
            else:
                v[n, s] = x + (pr_k - full) @ v[n - lc, 0] + full @ v[n - lc, 1]
    out = v[n_tot, 0]
    return out[:n_f], out[n_f:n_f + N_D], out[n_f + N_D:n_f + N_D + N_O], float(out[-1])


@dataclass
class RequestPlan:
    """What one request will cost under a configuration: features to price with any cost model."""

    prompt_id: str
    prompt_tokens: int
    output_tokens: int
    round_tokens: int
    drafter: str
    forward: np.ndarray
    draft: np.ndarray
    other: np.ndarray
    rounds: float
    gamma: int = 0

    def seconds(self, cost: CostModel) -> float:
        """T = T_p(P) + T_b(P) + Σ rounds."""
        return cost.prefill_s(self.prompt_tokens) + cost.begin_s(self.drafter, self.prompt_tokens) + \
            self.round_seconds(cost)

    def round_seconds(self, cost: CostModel) -> float:
        """Expected seconds of all the request's rounds (draft + verify + other)."""
        t = float(np.dot(cost.forward.coef, self.forward))
        dpart = cost.draft.get(self.drafter)
        if dpart is not None and self.drafter != "none":
            t += float(np.dot(dpart.coef, self.draft))
        opart = cost.other.get(self.drafter) or cost.other.get("none")
        if opart is not None:
            t += float(np.dot(opart.coef, self.other))
        return t


def solo_forward(cost: CostModel) -> ForwardX:
    """``cost``'s forward features of a solo round, memoised per (rows, context) (surface look-ups)."""
    memo: dict[tuple[int, float], np.ndarray] = {}

    def fwd(rows: int, context: float) -> np.ndarray:
        key = (rows, context)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = cost.forward_vector(rows, 1, context)
        return hit

    return fwd


#: a prompt's rows value counts toward its window level when it verified at least this many rounds there
WINDOW_MIN_ROUNDS = 5
WINDOW_SOURCE = ("window level: each prompt's forward priced at the level its own side-by-side group measured (other "
                 "settings of the same prompt, the same minutes of the machine) at each rows value it verified, on "
                 "the line through those levels at other rows")


def window_levels(cost: CostModel, records: Iterable[RequestRecord]) -> dict[str, ForwardX]:
    """Per prompt id, its forward features priced in the machine's phase in which that prompt's settings ran
    (side by side, :mod:`specledger.engine.interleave`). Per rows value R with at least
    :data:`WINDOW_MIN_ROUNDS` of the prompt's solo rounds, its window level

        κ_R = Σ measured t_verify / Σ modelled forward time f(R, c)

    and at other rows the line through the bracketing measured rows in f's coordinate
    (:func:`specledger.cost.levels.through_levels`: a one-row part and an extra-rows part, each at its own
    level). One level for the whole run cannot see that a shared machine's memory bandwidth and arithmetic
    move apart: in one window a 3-row verify cost 1.38 one-row steps, in the next 1.06 (``make run``,
    2026-12-02), so the speed-up of the very same setting moves with the window. A forecast of a prompt
    measured side by side is priced in its own window; the held-out setting's own rounds never enter
    (callers pass the training records)."""
    fwd = solo_forward(cost)
    coef = cost.forward.coef
    by_prompt: dict[str, list[tuple[int, float, float]]] = defaultdict(list)  # (rows, t_verify, modelled f)
    for r in records:
        if any(rd.batch_size > 1 for rd in r.rounds):
            continue
        by_prompt[r.prompt_id or r.request_id] += [
            (rd.proposed + 1, rd.t_verify, float(np.dot(coef, fwd(rd.proposed + 1, float(rd.context_len)))))
            for rd in r.rounds if rd.t_verify > 0]
    out: dict[str, ForwardX] = {}
    for pid, rounds in by_prompt.items():
        counts = Counter(rows for rows, _, _ in rounds)
        kappa = fit_row_levels([x for x in rounds if counts[x[0]] >= WINDOW_MIN_ROUNDS], level=1.0, k=0.0)
        if kappa:
            out[pid] = windowed(fwd, kappa, coef)
    return out


def windowed(forward: ForwardX, kappa: Mapping[int, float], coef: np.ndarray) -> ForwardX:
    """``forward`` priced at a window's levels ``kappa`` {rows: κ} (see :func:`window_levels`): the features
    scaled so that ``coef · x`` is the window's seconds."""
    def f(rows: int, context: float) -> float:
        return float(np.dot(coef, forward(rows, context)))

    def x(rows: int, context: float) -> np.ndarray:
        base = forward(rows, context)
        fr = float(np.dot(coef, base))
        return base * (through_levels(f, kappa, rows, context) / fr) if fr > 0 else base

    return x


def plan_from_rounds(prompt_id: str, prompt_tokens: int, output_tokens: int, drafter: str,
                     rounds: Sequence[RoundRecord], forward: ForwardX) -> RequestPlan:
    """The features of a request whose rounds are known (replayed, or a measured record's own):
    Σ over rounds of forward(proposed + 1, c), draft [1, g, c, g·c] where g > 0, other [1, L, c, output so far]."""
    n_f = len(forward(1, float(prompt_tokens)))
    vf, vd, vo = np.zeros(n_f), np.zeros(N_D), np.zeros(N_O)
    for rd in rounds:
        c = float(rd.context_len)
        vf += forward(rd.proposed + 1, c)
        if rd.gamma > 0:
            vd += (1.0, rd.gamma, c, rd.gamma * c)
        vo += (1.0, rd.committed, c, c - prompt_tokens)
    return RequestPlan(prompt_id, prompt_tokens, output_tokens, sum(rd.committed for rd in rounds),
                       drafter, vf, vd, vo, float(len(rounds)), max((rd.gamma for rd in rounds), default=0))


def plan_request(req: RequestChain, drafter: str, gamma: int, acc: AcceptanceModel | None = None,
                 max_tokens: int | None = None, pooled: Any = None, forward: ForwardX = legacy_forward) -> RequestPlan:
    """The expected features of ``req`` decoded by ``drafter`` at ``gamma`` (γ = 0: plain decoding).

    ``max_tokens`` other than the run's: a request cut by length at the run's budget is assumed to go
    on to the new budget; one that stopped at EOS is assumed to stop at the same token.
    """
    e = req.prefill_tokens
    n_out = req.output_tokens
    run_m = req.max_tokens if req.max_tokens is not None else n_out
    m = run_m
    if max_tokens is not None:
        m = int(max_tokens)
        if req.stop_reason == "length" or n_out >= run_m:
            n_out = m
        n_out = min(n_out, m)
    n_rounds_tok = max(n_out - e, 0)
    after_full = None
    if gamma > 0 and acc is not None:
        states = acc.state_chains(req, gamma) if acc.streak else None
        if states is not None:
            (a, f), after_full = states
        else:
            a, f = acc.request_chain(req, gamma, pooled)
    else:
        a, f = [0.0] * max(gamma, 1), [0.0] * max(gamma, 1)
    vf, vd, vo, r = expected_features(gamma, a, f, req.prompt_tokens, n_rounds_tok, e, m, forward, after_full)
    return RequestPlan(req.prompt_id, req.prompt_tokens, n_out, n_rounds_tok, drafter if gamma > 0 else "none",
                       vf, vd, vo, r, gamma)


def request_noise(cost: CostModel, records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    """Per drafter, every solo request's measured total time over the cost model's price of its own rounds,
    divided by their median: the machine's request-to-request noise that a measured speed-up carries
    (the model's bias is not in it; the point forecast stays the model's)."""
    fwd = solo_forward(cost)
    ratios: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if not r.rounds or any(rd.batch_size > 1 for rd in r.rounds):
            continue
        plan = plan_from_rounds(r.prompt_id, r.prompt_tokens, r.output_tokens, r.drafter, r.rounds, fwd)
        t = plan.seconds(cost)
        if t > 0 and r.total_time > 0:
            ratios[r.drafter].append(r.total_time / t)
    return {d: np.asarray(v) / float(np.median(v)) for d, v in ratios.items() if len(v) >= 3}


def term_sources(cost: CostModel, spec: Sequence[RequestPlan], replayed: bool) -> dict[str, str]:
    """Where each term of a forecast comes from: measured, interpolated, extrapolated or assumed."""
    gamma = max((p.gamma for p in spec), default=0)
    ctx = float(np.median([p.prompt_tokens for p in spec])) if spec else 0.0
    out: dict[str, str] = {}
    if cost.surface is not None:
        lk = cost.surface.lookup(gamma + 1, 1, ctx)
        out["verify"] = (f"{lk.source} (surface at {gamma + 1} rows, context {ctx:.0f}: ±{100 * lk.rel_sd:.0f} %), "
                         f"level fitted on the run's rounds")
    else:
        out["verify"] = "fitted linear form in rows (no measured surface: extrapolated beyond the run's γ's)"
    dg = (cost.meta.get("draft_gammas") or {}).get(spec[0].drafter if spec else "", [])
    if dg:
        out["draft"] = "fitted" if min(dg) <= gamma <= max(dg) else f"extrapolated (linear in γ from γ {dg})"
    else:
        out["draft"] = "fitted" if cost.draft else "assumed 0"
    out["other"] = "fitted on the run's rounds (per committed token and context)"
    out["prefill"] = "fitted on the run's requests"
    out["acceptance"] = "measured (exact replay)" if replayed else "measured chains; assumed beyond the measured depth"
    return out


def measured_baseline(records: Iterable[RequestRecord], max_tokens: int | None = None
                      ) -> dict[str, tuple[int, float]]:
    """prompt id -> (output tokens, seconds) of the plain decoding the run measured (repeats summed): the
    baseline a forecast divides by. Only records whose output budget is ``max_tokens`` (any, if None):
    a baseline measured at another length is not this forecast's baseline."""
    out: dict[str, tuple[int, float]] = {}
    for r in records:
        if r.drafter != "none" or r.total_time <= 0:
            continue
        budget = r.extra.get("max_tokens")
        if max_tokens is not None and (budget is None or int(budget) != max_tokens):
            continue
        pid = r.prompt_id or r.request_id
        n, t = out.get(pid, (0, 0.0))
        out[pid] = (n + r.output_tokens, t + r.total_time)
    return out


def _rate_ratio(tokens_s: np.ndarray, t_s: np.ndarray, tokens_p: np.ndarray, t_p: np.ndarray) -> float:
    """S = (Σ tokens_spec / Σ t_spec) / (Σ tokens_plain / Σ t_plain); NaN when a side has no time or tokens."""
    if t_s.sum() <= 0 or t_p.sum() <= 0 or tokens_p.sum() <= 0:
        return math.nan
    return float((tokens_s.sum() / t_s.sum()) / (tokens_p.sum() / t_p.sum()))


def predict_category(
    cost: CostModel,
    acc: AcceptanceModel,
    category: str,
    drafter: str,
    gamma: int,
    max_tokens: int | None = None,
    chains: Sequence[RequestChain] | None = None,
    n_boot: int = 200,
    seed: int = 0,
    replay: Replayer | None = None,
    noise: dict[str, np.ndarray] | None = None,
    baseline: Mapping[str, tuple[int, float]] | None = None,
    window: Mapping[str, ForwardX] | None = None,
) -> Prediction | None:
    """Predicted end-to-end S and tokens/s of ``drafter`` at ``gamma`` on the category's measured prompts.
    ``window``: per prompt id its forward features at its window's levels (:func:`window_levels`); both sides
    of that prompt are priced there.

    S = (Σ tokens_spec / Σ T_spec) / (Σ tokens_plain / Σ T_plain), both times from the cost model (see the
    module doc). ``baseline`` maps prompt id -> (output tokens, seconds) of the run's plain decoding of that
    prompt at the forecast's output budget; when it covers every prompt, the predicted tokens/s is S times
    that measured plain rate (the machine's speed is measured, the speed-up is forecast).

    Rounds: replayed exactly (:mod:`specledger.predict.replay`) where ``replay`` can (greedy, a drafter
    without a network, the run's max_tokens), else expected from the acceptance chains. The 5-95 %
    interval combines draws of the cost model's coefficients, the measured request-to-request noise
    (``noise``, :func:`request_noise`: each request's time times a drawn ratio, plain and speculative
    alike) and, for chain forecasts, a bootstrap over prompts (the chains are estimates; replayed
    rounds are not)."""
    reqs = list(chains) if chains is not None else acc.requests(category, drafter)
    if not reqs:
        return None
    fwd = solo_forward(cost)
    window = window or {}
    fwds = {r.prompt_id: window.get(r.prompt_id, fwd) for r in reqs}
    n_windowed = sum(r.prompt_id in window for r in reqs)
    replayed = replay.rounds(drafter, gamma) if replay is not None and gamma > 0 and \
        replay.can(drafter, max_tokens) else {}
    pooled = acc.pooled(category, drafter, max(gamma, 1))
    spec = [plan_from_rounds(r.prompt_id, r.prompt_tokens, replay.output_tokens(r.prompt_id), drafter,
                             replayed[r.prompt_id], fwds[r.prompt_id])
            if r.prompt_id in replayed
            else plan_request(r, drafter, gamma, acc, max_tokens, pooled, fwds[r.prompt_id]) for r in reqs]
    plain = [plan_request(r, "none", 0, None, max_tokens, forward=fwds[r.prompt_id]) for r in reqs]
    n_replayed = sum(r.prompt_id in replayed for r in reqs)
    tokens = np.array([p.output_tokens for p in spec], dtype=float)
    ts = np.array([p.seconds(cost) for p in spec])
    tokens_p = np.array([p.output_tokens for p in plain], dtype=float)
    tp = np.array([p.seconds(cost) for p in plain])
    anchored = baseline is not None and all(r.prompt_id in baseline for r in reqs)
    measured_n = np.array([baseline[r.prompt_id][0] for r in reqs], dtype=float) if anchored else None
    measured_t = np.array([baseline[r.prompt_id][1] for r in reqs]) if anchored else None

    def rate(s_: float, idx: np.ndarray, ts_: np.ndarray) -> float:
        """Predicted tokens/s: S x the measured plain rate (anchored), else the modelled speculative rate."""
        if measured_n is not None and measured_t is not None:
            return s_ * measured_n[idx].sum() / measured_t[idx].sum() if measured_t[idx].sum() > 0 else math.nan
        return float(tokens[idx].sum() / ts_.sum()) if ts_.sum() > 0 else math.nan

    s = _rate_ratio(tokens, ts, tokens_p, tp)
    tps = rate(s, np.arange(len(reqs)), ts)
    n_rounds = sum(p.rounds for p in spec)
    rng = np.random.default_rng(seed)
    noise = noise or {}
    eps_s, eps_p = noise.get(drafter), noise.get("none")
    s_draws, v_draws = [], []
    n = len(reqs)
    for _ in range(n_boot):
        idx = np.arange(n) if n_replayed == n else rng.integers(0, n, n)
        c = cost.perturbed(rng)
        ts_b = np.array([spec[i].seconds(c) for i in idx])
        tp_b = np.array([plain[i].seconds(c) for i in idx])
        if eps_s is not None:
            ts_b = ts_b * rng.choice(eps_s, n)
        if eps_p is not None:  # a re-measured baseline varies too
            tp_b = tp_b * rng.choice(eps_p, n)
        if ts_b.sum() > 0:
            s_draws.append(_rate_ratio(tokens[idx], ts_b, tokens_p[idx], tp_b))
            v_draws.append(rate(s_draws[-1], idx, ts_b))
    interval = [float(np.percentile(s_draws, 5)), float(np.percentile(s_draws, 95))] if s_draws else [s, s]
    v_int = [float(np.percentile(v_draws, 5)), float(np.percentile(v_draws, 95))] if v_draws else [tps, tps]
    assumption = acc.assumption if n_replayed < n else REPLAY_ASSUMPTION
    if 0 < n_replayed < n:
        assumption = f"{n_replayed} of {n} requests: {REPLAY_ASSUMPTION}; the rest: {acc.assumption}"
    return Prediction(
        category=category,
        drafter=drafter,
        gamma=gamma,
        predicted_speedup=s,
        predicted_tokens_per_s=tps,
        interval=interval,
        tokens_per_s_interval=v_int,
        requests=len(reqs),
        rounds_per_request=float(np.mean([p.rounds for p in spec])),
        assumption=assumption,
        cost_source=cost.source,
        extra={
            "predicted_plain_tokens_per_s": tps / s if s > 0 and math.isfinite(tps) else None,
            "baseline": "measured" if anchored else "predicted",
            "el": sum(p.round_tokens for p in spec) / n_rounds if n_rounds > 0 else None,
            "t_round_ms": 1e3 * sum(p.round_seconds(cost) for p in spec) / n_rounds if n_rounds > 0 else None,
            "acceptance_source": "replayed" if n_replayed == n else ("chains" if not n_replayed else "mixed"),
            "window_levels": n_windowed,
            "term_sources": {**term_sources(cost, spec, replayed=n_replayed == n),
                             **({"window": f"{n_windowed} of {n} prompts: {WINDOW_SOURCE}"} if n_windowed else {}),
                             "baseline": "cost model at 1 row per step (S); measured plain decoding of these "
                             "prompts sets tokens/s" if anchored else "predicted (cost model at 1 row per step)"},
        },
    )


def predict_run(cost: CostModel, acc: AcceptanceModel, drafter: str, gamma: int,
                max_tokens: int | None = None, categories: Sequence[str] | None = None,
                n_boot: int = 200, replay: Replayer | None = None,
                noise: dict[str, np.ndarray] | None = None,
                baseline: Mapping[str, tuple[int, float]] | None = None,
                window: Mapping[str, ForwardX] | None = None) -> list[Prediction]:
    """One prediction per category that has measured requests of ``drafter`` (``baseline``, ``window``: see
    :func:`predict_category`)."""
    out = []
    for cat in categories or acc.categories():
        p = predict_category(cost, acc, cat, drafter, gamma, max_tokens, n_boot=n_boot, replay=replay, noise=noise,
                             baseline=baseline, window=window)
        if p is not None:
            out.append(p)
    return out


def gamma_curve(cost: CostModel, acc: AcceptanceModel, category: str, drafter: str, max_gamma: int,
                chains: Sequence[RequestChain] | None = None, replay: Replayer | None = None,
                window: Mapping[str, ForwardX] | None = None) -> list[GammaPointDict]:
    """Predicted end-to-end S(γ) for γ = 0..max_gamma (γ = 0: plain decoding, S = 1), with E[L] per round and the
    mean round time; positions beyond measured ones follow ``acc.assumption``; ``window`` as in predict_category."""
    curve: list[GammaPointDict] = []
    for g in range(0, max_gamma + 1):
        p = predict_category(cost, acc, category, drafter, g, chains=chains, n_boot=0, replay=replay, window=window)
        if p is None:
            break
        curve.append({"gamma": g, "el": p.extra["el"], "t_round_ms": p.extra["t_round_ms"],
                      "speedup": p.predicted_speedup})
    return curve
