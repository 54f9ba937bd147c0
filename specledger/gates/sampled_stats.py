"""Sampled correctness with power: does speculation change *what* is sampled?

Under sampling, speculative outputs differ from plain ones request by request; only their
distributions must match. The first output token comes from the prefill (the same forward with or
without speculation), so a test on it, or on output length, cannot see a broken rejection
sampler. This test looks where speculation acts: the tokens *after* the first speculative round.

Data: many samples of the same prompt, speculative and plain (different seeds), each at least
``positions + 1`` tokens long (:func:`specledger.bench.sampled_pairs.sample_pairs` draws them with the batch
engine and scores them with the target; this module is the statistics alone, torch-free).

Test: for every prompt and every output position j = 1..k-1 (position 0 is the prefill's token), a
chi-square test of homogeneity on the 2 x C table of tokens at j (spec vs plain; tokens seen fewer
than ``MIN_CELL`` times in total are pooled into one "other" column). The gate fails when the
smallest p-value is below alpha / m (Bonferroni over the m tables, valid whatever their dependence).

Power: the probability of failing when the distributions at a position differ by Cohen's
w = ``W_REF`` (the effect size of the 2 x C table), from the noncentral chi-square with
lambda = n_total * w^2 at each table's df and the Bonferroni level; the gate reports the smallest
over its tables. Below ``POWER_TARGET`` the gate says "not assessed (power X %)", never "pass".
The mutation tests (tests/test_correctness_power.py) check that at the default sample size the
test fails three wrong acceptance rules (accept-always, p/q swapped, residual not renormalised) in
at least 95 % of trials, and passes the correct rule at the stated alpha.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

#: samples per side of one prompt in the correctness check
DEFAULT_SAMPLES = 300
#: output tokens per sample (positions 1..DEFAULT_TOKENS-1 are tested)
DEFAULT_TOKENS = 16
#: gamma of the correctness check: one candidate per round makes every round's verification count
DEFAULT_GAMMA = 1
#: tokens seen fewer times than this (both sides together) are pooled into "other"
MIN_CELL = 5
#: the per-position effect size (Cohen's w) the stated power refers to
W_REF = 0.3
#: the standardized mean of the log-probability statistic the stated power refers to
D_REF = 0.3
#: the power below which the gate does not assess
POWER_TARGET = 0.95


@dataclass(frozen=True)
class TableTest:
    prompt_id: str
    position: int
    n_spec: int
    n_base: int
    df: int
    stat: float
    p: float


def _table(spec_tokens: Sequence[int], base_tokens: Sequence[int]) -> list[list[int]]:
    cs, cb = Counter(spec_tokens), Counter(base_tokens)
    total = cs + cb
    common = sorted(t for t, c in total.items() if c >= MIN_CELL)
    rows = [[cs[t] for t in common], [cb[t] for t in common]]
    rows[0].append(len(spec_tokens) - sum(rows[0]))
    rows[1].append(len(base_tokens) - sum(rows[1]))
    cols = [i for i in range(len(rows[0])) if rows[0][i] + rows[1][i] > 0]
    return [[r[i] for i in cols] for r in rows]


def chi2_homogeneity(spec_tokens: Sequence[int], base_tokens: Sequence[int]) -> tuple[float, int, float]:
    """(statistic, df, p) of the 2 x C homogeneity test (no continuity correction); (0, 0, 1) when one column."""
    from scipy.stats import chi2

    table = _table(spec_tokens, base_tokens)
    if not table[0] or len(table[0]) < 2:
        return 0.0, 0, 1.0
    n = sum(map(sum, table))
    row = [sum(r) for r in table]
    col = [table[0][i] + table[1][i] for i in range(len(table[0]))]
    stat = 0.0
    for i in range(2):
        for j in range(len(col)):
            e = row[i] * col[j] / n
            if e > 0:
                stat += (table[i][j] - e) ** 2 / e
    df = len(col) - 1
    return stat, df, float(chi2.sf(stat, df))


def power(n_total: int, df: int, level: float, w: float = W_REF) -> float:
    """Power of a chi-square test with ``df`` at ``level`` against effect size ``w`` with ``n_total`` observations."""
    from scipy.stats import chi2, ncx2

    if n_total <= 0 or df <= 0:
        return 0.0
    crit = chi2.isf(level, df)
    return float(ncx2.sf(crit, df, n_total * w * w))


def samples_needed(df: int, level: float, w: float = W_REF, target: float = POWER_TARGET) -> int:
    """The smallest total number of observations giving ``target`` power (doubling, then bisection)."""
    df = max(df, 1)
    hi = 2
    while power(hi, df, level, w) < target:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if power(mid, df, level, w) < target else (lo, mid)
    return hi


def _sequences(records: Sequence[Any]) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = defaultdict(list)
    for r in records:
        if getattr(r, "token_ids", None):
            out[r.prompt_id].append(list(r.token_ids))
    return out


def logprob_test(spec: Sequence[Any], start: int = 1) -> tuple[float, float, int] | None:
    """One-sample test that the speculative samples' tokens come from the target: per sample
    Z = sum_{j >= start} (log p_j(x_j) + H_j), with p_j the target's (processed) distribution at
    position j given the sample's own prefix and H_j its entropy; E[Z] = 0 exactly when every x_j
    is drawn from p_j. Returns (p-value of the two-sided t-test, standardized mean d, n), or None
    when the records carry no ``target_logprobs`` / ``target_entropy`` (see :func:`score_records`)."""
    from scipy.stats import ttest_1samp

    z = []
    for r in spec:
        lp, h = r.extra.get("target_logprobs"), r.extra.get("target_entropy")
        if lp and h and len(lp) > start:
            z.append(sum(lp[start:]) + sum(h[start:]))
    if len(z) < 3:
        return None
    mean = sum(z) / len(z)
    sd = math.sqrt(sum((x - mean) ** 2 for x in z) / (len(z) - 1))
    if sd == 0:
        return (1.0 if mean == 0 else 0.0), 0.0, len(z)
    return float(ttest_1samp(z, 0.0).pvalue), mean / sd, len(z)


def t_power(n: int, level: float, d: float = D_REF) -> float:
    """Power of a two-sided one-sample t-test (normal approximation) against a standardized mean ``d``."""
    from scipy.stats import norm

    if n <= 1:
        return 0.0
    return float(norm.sf(norm.isf(level / 2) - abs(d) * math.sqrt(n)))


class SampledTest(TypedDict):
    """The sampled correctness test's outcome (:func:`sampled_test`)."""

    status: str  # "pass" | "fail" | "not assessed"
    p_min: float | None  # the smallest p-value of its tests (None: no test)
    power: float  # the smaller of the two tests' powers against d = D_REF and w = W_REF (0.8 = 80 %)
    tests: int  # tests run
    n: int  # smallest per-side sample
    evidence: str  # one line


def sampled_test(
    spec: Sequence[Any], base: Sequence[Any], alpha: float = 0.01, max_position: int = DEFAULT_TOKENS - 1
) -> SampledTest:
    """The correctness test over every prompt sampled ≥ 2 times on both sides: the log-probability test
    (:func:`logprob_test`, at alpha/2, when the records are scored) and the position tables (at
    alpha/2 shared by Bonferroni; all of alpha when there is no log-probability test).

    Returns ``status`` ("pass" | "fail" | "not assessed"), ``p_min``, ``power`` (the smaller of the
    two tests' powers against d = D_REF and w = W_REF), ``tests``, ``n`` (smallest per-side sample)
    and ``evidence`` (one line)."""
    sp, bp = _sequences(spec), _sequences(base)
    by_pid: dict[str, list[Any]] = defaultdict(list)
    for r in spec:
        by_pid[r.prompt_id].append(r)
    tests: list[TableTest] = []
    lp_tests: list[tuple[str, float, float, int]] = []
    for pid in sorted(set(sp) & set(bp)):
        s_seqs, b_seqs = sp[pid], bp[pid]
        if len(s_seqs) < 2 or len(b_seqs) < 2:
            continue
        if (lp := logprob_test(by_pid[pid])) is not None:
            lp_tests.append((pid, *lp))
        for j in range(1, max_position + 1):
            s_tok = [s[j] for s in s_seqs if len(s) > j]
            b_tok = [b[j] for b in b_seqs if len(b) > j]
            if len(s_tok) < 2 or len(b_tok) < 2:
                continue
            stat, df, p = chi2_homogeneity(s_tok, b_tok)
            tests.append(TableTest(pid, j, len(s_tok), len(b_tok), df, stat, p))
    if not tests:
        n_max = max((min(len(sp[p]), len(bp[p])) for p in set(sp) & set(bp)), default=0)
        return {
            "status": "not assessed", "p_min": None, "power": 0.0, "tests": 0, "n": n_max,
            "evidence": (
                f"not assessed (power 0 %): sampling, at most {n_max} sample(s) per side of one prompt; the test "
                f"needs many samples of the same prompt ({DEFAULT_SAMPLES} per side by default)"
            ),
        }
    informative = [t for t in tests if t.df > 0]
    table_alpha = alpha / 2 if lp_tests else alpha
    table_level = table_alpha / max(len(informative), 1)
    lp_level = alpha / 2 / max(len(lp_tests), 1)
    pw_tables = min((power(t.n_spec + t.n_base, t.df, table_level) for t in informative), default=0.0)
    pw_lp = min((t_power(n, lp_level) for *_, n in lp_tests), default=None)
    pw = min(pw_tables, pw_lp) if pw_lp is not None else pw_tables
    worst = min(tests, key=lambda t: t.p)
    n = min(min(t.n_spec, t.n_base) for t in tests)
    where = (f"{len(tests)} position tables (positions 1..{max(t.position for t in tests)}) over "
             f"{len({t.prompt_id for t in tests})} prompt(s), ≥ {n} samples per side")
    head = f"position tables: min p = {worst.p:.3g} (prompt {worst.prompt_id}, position {worst.position}), " \
           f"fail below {table_level:.2g}"
    failed = worst.p < table_level
    if lp_tests:
        lp_worst = min(lp_tests, key=lambda t: t[1])
        head = (f"target log-prob: p = {lp_worst[1]:.3g} (mean/sd {lp_worst[2]:+.2f}), fail below {lp_level:.2g}; "
                + head)
        failed = failed or lp_worst[1] < lp_level
    pw_text = f"power {100 * pw:.0f} % (d = {D_REF:g}, w = {W_REF:g})"
    if failed:
        status = "fail"
        evidence = f"tokens after the first round are not distributed as plain: {head}; {where}"
    elif pw < POWER_TARGET or not informative:
        status = "not assessed"
        df_max = max((t.df for t in informative), default=1)
        need = max(math.ceil(samples_needed(df_max, table_level) / 2),
                   math.ceil(((_z(lp_level / 2) + _z(1 - POWER_TARGET)) / D_REF) ** 2) if lp_tests else 0)
        evidence = (f"not assessed ({pw_text}): {where}; {head}; "
                    f"need ≈ {need} samples per side for {100 * POWER_TARGET:.0f} % power")
    else:
        status = "pass"
        evidence = f"no difference after the first round: {head}; {where}; {pw_text}"
    return {"status": status, "p_min": min([worst.p] + [t[1] for t in lp_tests]), "power": pw,
            "tests": len(tests) + len(lp_tests), "n": n, "evidence": evidence}


def _z(tail: float) -> float:
    from scipy.stats import norm

    return float(norm.isf(tail))
