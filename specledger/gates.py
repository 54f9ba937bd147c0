"""The four deployment gates (correctness, quality, latency, capacity) and the per-category verdict.

Each gate is ``pass``, ``fail`` or ``not assessed`` (shown honestly, never guessed) with an
evidence string:

- correctness: greedy (T = 0) outputs token-identical to plain decoding on every shared prompt;
  under sampling, the tokens after the first speculative round over many samples of one prompt,
  speculative vs plain, with its power stated (:mod:`specledger.correctness`); "not assessed
  (power X %)" when the sample is too small.
- quality: mean task score (``extra["quality"]``) at most ``quality_tolerance`` below the baseline's.
- latency: TTFT P99, TPOT P50, chunk ITL P99 and the longest stall within the SLO.
- capacity: paired tokens/s ≥ the baseline's; peak memory within ``max_memory_mb`` if both are known.

Verdict per (category, temperature): the fastest scenario with no failed gate and a speed-up CI
lower bound above ``min_ci_low``; otherwise "off". ``not assessed`` blocks only with ``require_assessed``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from specledger.analysis.scenario import by_prompt, shared_prompts
from specledger.engine.trace import RequestRecord
from specledger.errors import SpecLedgerError

PASS, FAIL, NOT_ASSESSED = "pass", "fail", "not assessed"
GATES = ("correctness", "quality", "latency", "capacity")


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

    def to_dict(self) -> dict[str, Any]:
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


@dataclass(frozen=True)
class GateResult:
    name: str
    status: str  # PASS | FAIL | NOT_ASSESSED
    evidence: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


# ----------------------------------------------------------------------------- correctness


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _text_only(r: RequestRecord) -> bool:
    """Records without token ids (an endpoint probed without a tokenizer) are compared by text."""
    return bool(isinstance(r.extra, dict) and r.extra.get("text_only"))


def greedy_correctness(spec: Sequence[RequestRecord], base: Sequence[RequestRecord]) -> GateResult:
    """Pass iff every speculative output is token-identical to the plain output of the same prompt
    (text-identical where either side is ``extra["text_only"]``)."""
    prompts = shared_prompts(spec, base)
    if not prompts:
        return GateResult(
            "correctness", NOT_ASSESSED, "no prompt was run by both this setting and plain decoding"
        )
    sp, bp = by_prompt(spec), by_prompt(base)
    bad = []
    by_text = False
    for pid in prompts:
        ref = bp[pid][0]
        for r in sp[pid]:
            if _text_only(r) or _text_only(ref):
                by_text = True
                if r.text != ref.text:
                    bad.append((pid, f"character {_first_difference(r.text, ref.text)}"))
            elif list(r.token_ids) != list(ref.token_ids):
                bad.append((pid, f"token {_first_difference(r.token_ids, ref.token_ids)}"))
    if not bad:
        unit = "text" if by_text else "token"
        return GateResult(
            "correctness", PASS, f"{len(prompts)}/{len(prompts)} prompts {unit}-identical to plain (greedy)"
        )
    pid, pos = bad[0]
    return GateResult(
        "correctness",
        FAIL,
        f"{len(bad)} output(s) on {len({b[0] for b in bad})}/{len(prompts)} prompts differ from plain; "
        f"first: prompt {pid} at {pos}",
    )


def sampled_correctness(
    spec: Sequence[RequestRecord], base: Sequence[RequestRecord], min_prompts: int = 20, alpha: float = 0.01
) -> GateResult:
    """Under sampling outputs differ request by request; test the distributions of the tokens after
    the first speculative round over many samples of the same prompt (:mod:`specledger.correctness`).
    Too few samples for 95 % power: "not assessed (power X %)", never "pass". ``min_prompts`` is
    kept for callers; the test's unit is samples of one prompt, not prompts."""
    from specledger.correctness import sampled_test

    res = sampled_test(spec, base, alpha)
    return GateResult("correctness", res["status"], ("sampling: " if res["status"] != NOT_ASSESSED else "")
                      + res["evidence"])


def correctness_gate(
    spec: Sequence[RequestRecord], base: Sequence[RequestRecord], temperature: float, slo: SLO = SLO()
) -> GateResult:
    if temperature == 0:
        return greedy_correctness(spec, base)
    return sampled_correctness(spec, base, slo.min_sampled_prompts, slo.alpha)


# ----------------------------------------------------------------------------- quality


def _score(r: RequestRecord) -> float | None:
    value = r.extra.get("quality") if isinstance(r.extra, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _cut(records: Sequence[RequestRecord]) -> bool:
    """Every reply of the prompt was cut at the token budget before an answer/function could finish
    (``extra["quality_complete"]`` False; records without the flag count as complete)."""
    return bool(records) and all(isinstance(r.extra, dict) and r.extra.get("quality_complete") is False
                                 for r in records)


def quality_gate(
    spec: Sequence[RequestRecord], base: Sequence[RequestRecord], tolerance: float = 0.02
) -> GateResult:
    """Mean task score on prompts scored on both sides; pass iff spec ≥ plain − tolerance.

    Prompts whose replies were all cut at the token budget before the metric had anything to read
    (no whole function, no stated answer: ``extra["quality_complete"]`` False) are left out; when
    that leaves none, "not assessed: output cut at N tokens ...", never a pass on 0.000 vs 0.000."""
    sp, bp = by_prompt(spec), by_prompt(base)
    pairs, cut, cut_at = [], 0, 0
    for pid in shared_prompts(spec, base):
        s = [x for r in sp[pid] if (x := _score(r)) is not None]
        b = [x for r in bp[pid] if (x := _score(r)) is not None]
        if not (s and b):
            continue
        if _cut(sp[pid] + bp[pid]):
            cut += 1
            cut_at = max([cut_at] + [r.output_tokens for r in sp[pid] + bp[pid]])
            continue
        pairs.append((sum(s) / len(s), sum(b) / len(b)))
    if not pairs:
        if cut:
            return GateResult("quality", NOT_ASSESSED,
                              f"output cut at {cut_at} tokens before an answer/function could finish on "
                              f"{cut}/{cut} scored prompts; raise the category's max tokens")
        return GateResult("quality", NOT_ASSESSED, "no task scores recorded on shared prompts")
    ms = sum(p[0] for p in pairs) / len(pairs)
    mb = sum(p[1] for p in pairs) / len(pairs)
    status = PASS if ms >= mb - tolerance else FAIL
    return GateResult(
        "quality",
        status,
        f"mean score {ms:.3f} vs plain {mb:.3f} ({ms - mb:+.3f}, tolerance {tolerance:g}) on {len(pairs)} prompts"
        + (f" ({cut} more cut at {cut_at} tokens before an answer could finish, left out)" if cut else ""),
    )


# ----------------------------------------------------------------------------- latency / capacity


def latency_gate(latency: dict[str, Any], slo: SLO = SLO()) -> GateResult:
    """TTFT P99, TPOT P50, chunk ITL P99 and longest stall (ms) against the SLO."""
    checks = [
        ("TTFT P99", latency["ttft_ms"]["p99"], slo.ttft_p99_ms),
        ("TPOT P50", latency["tpot_ms"]["p50"], slo.tpot_p50_ms),
        ("ITL P99", latency["itl_chunk_ms"]["p99"], slo.itl_p99_ms),
        ("stall", latency["longest_stall_ms"], slo.stall_ms),
    ]
    known = [(n, v, lim) for n, v, lim in checks if v is not None]
    if not known:
        return GateResult("latency", NOT_ASSESSED, "no latency samples")
    over = [(n, v, lim) for n, v, lim in known if v > lim]
    parts = [f"{n} {v:.1f}{'>' if v > lim else '≤'}{lim:g} ms" for n, v, lim in known]
    return GateResult("latency", FAIL if over else PASS, ", ".join(parts))


def capacity_gate(
    tokens_per_s: float | None,
    baseline_tokens_per_s: float | None,
    memory_bytes: float | None,
    slo: SLO = SLO(),
) -> GateResult:
    """Paired throughput at least the baseline's; peak memory within ``max_memory_mb`` when both are known."""
    if tokens_per_s is None or baseline_tokens_per_s is None:
        return GateResult("capacity", NOT_ASSESSED, "no paired baseline throughput")
    ok = tokens_per_s >= baseline_tokens_per_s
    evidence = f"{tokens_per_s:.1f} tok/s vs plain {baseline_tokens_per_s:.1f} tok/s"
    if memory_bytes is not None:
        mb = memory_bytes / 2**20
        if slo.max_memory_mb is not None:
            ok = ok and mb <= slo.max_memory_mb
            evidence += f"; peak memory {mb:.0f} MiB {'≤' if mb <= slo.max_memory_mb else '>'} {slo.max_memory_mb:g} MiB"
        else:
            evidence += f"; peak memory {mb:.0f} MiB (no limit set)"
    return GateResult("capacity", PASS if ok else FAIL, evidence)


# ----------------------------------------------------------------------------- at loads > 1


def load_latency_gate(latency: dict[str, Any], slo: SLO = SLO()) -> GateResult:
    """At a load > 1: TTFT P99, TPOT P50 and P99, token-ITL P99 and the longest stall (ms) against the SLO."""
    checks = [
        ("TTFT P99", latency["ttft_ms"]["p99"], slo.ttft_p99_ms),
        ("TPOT P50", latency["tpot_ms"]["p50"], slo.tpot_p50_ms),
        ("TPOT P99", latency["tpot_ms"]["p99"], slo.tpot_p99_ms),
        ("token-ITL P99", latency["itl_token_ms"]["p99"], slo.itl_p99_ms),
        ("stall", latency["longest_stall_ms"], slo.stall_ms),
    ]
    known = [(n, v, lim) for n, v, lim in checks if v is not None]
    if not known:
        return GateResult("latency", NOT_ASSESSED, "no latency samples")
    over = [n for n, v, lim in known if v > lim]
    parts = [f"{n} {v:.1f}{'>' if v > lim else '≤'}{lim:g} ms" for n, v, lim in known]
    return GateResult("latency", FAIL if over else PASS, ", ".join(parts))


def meets_slo(r: RequestRecord, slo: SLO = SLO()) -> bool:
    """One request meets every per-request SLO (DistServe's goodput unit): TTFT, TPOT (against the
    P99 target) and its longest stall."""
    from specledger.analysis.metrics import chunk_gaps, tpot

    if r.ttft * 1e3 > slo.ttft_p99_ms:
        return False
    per_token = tpot(r.ttft, r.total_time, r.output_tokens)
    if per_token is not None and per_token * 1e3 > slo.tpot_p99_ms:
        return False
    gaps = chunk_gaps(r.token_times, r.chunks) if r.token_times else []
    return not gaps or max(gaps) * 1e3 <= slo.stall_ms


def _point(records: Sequence[RequestRecord], key: str) -> float | None:
    values = {float(r.extra[key]) for r in records if isinstance(r.extra.get(key), (int, float))}
    return sum(values) if values else None  # one point per setting and load: one value


def goodput(records: Sequence[RequestRecord], slo: SLO = SLO()) -> tuple[float | None, int, int]:
    """(requests meeting every SLO per second of their point's wall time, met, of)."""
    wall = _point(records, "point_wall_s")
    met = sum(meets_slo(r, slo) for r in records)
    return (met / wall if wall else None), met, len(records)


def cpu_per_1k_tokens(records: Sequence[RequestRecord]) -> float | None:
    """CPU-seconds per 1k committed tokens of the point(s) the records come from."""
    cpu, tokens = _point(records, "point_cpu_s"), _point(records, "point_tokens")
    return 1e3 * cpu / tokens if cpu is not None and tokens else None


def kv_capacity(records: Sequence[RequestRecord], gamma: int, meta: dict[str, Any], slo: SLO = SLO()
                ) -> tuple[int | None, str]:
    """The largest concurrency whose KV fits the memory budget (``slo.max_memory_mb``, else the machine's
    memory) after the weights: per request (context · (m_KV + draft m_KV) + B·γ·m_KV's share γ · m_KV),
    context = the longest prompt + output of the records. (None, why) when m_KV is unknown."""
    m_kv = meta.get("kv_bytes_per_token")
    budget = slo.max_memory_mb * 2**20 if slo.max_memory_mb is not None else meta.get("memory_total_bytes")
    if not isinstance(m_kv, (int, float)) or not m_kv or not isinstance(budget, (int, float)) or not records:
        return None, "KV capacity not assessed (no m_KV or memory budget in run.json)"
    draft_kv = max((float(r.extra.get("draft_kv_bytes_per_token") or 0) for r in records), default=0.0)
    draft_w = max((float(r.extra.get("draft_weight_bytes") or 0) for r in records), default=0.0)
    weights = float(meta.get("weight_bytes") or 0) + draft_w
    context = max(r.prompt_tokens + r.output_tokens for r in records)
    per_request = context * (m_kv + draft_kv) + max(int(gamma or 0), 0) * m_kv
    fits = max(int((budget - weights) // per_request), 0)
    where = f"{slo.max_memory_mb:g} MiB SLO" if slo.max_memory_mb is not None else "machine memory"
    return fits, (f"KV fits {fits:,} concurrent ({context} tokens × {(m_kv + draft_kv) / 1024:.1f} KiB"
                  + (f" + γ·m_KV {gamma * m_kv / 1024:.1f} KiB" if gamma else "")
                  + f" per request, {budget / 2**30:.1f} GiB {where} less {weights / 2**20:.0f} MiB weights)")


def load_capacity_gate(spec: Sequence[RequestRecord], base: Sequence[RequestRecord], gamma: int, load: int,
                       meta: dict[str, Any], slo: SLO = SLO()) -> GateResult:
    """At a load > 1: goodput (requests/s meeting every SLO, DistServe) at least plain's at the same
    load; KV capacity (candidate reservation B·γ·m_KV included) at least the load; CPU-seconds per 1k
    committed tokens, within ``slo.max_cpu_s_per_1k_tokens`` when set."""
    g, met, of = goodput(spec, slo)
    bg, bmet, bof = goodput(base, slo)
    if g is None or bg is None:
        return GateResult("capacity", NOT_ASSESSED, "no paired plain point at this load")
    fails, parts = [], [f"goodput {g:.2f} req/s ({met}/{of} met the SLO) {'≥' if g >= bg else '<'} "
                        f"plain {bg:.2f} ({bmet}/{bof})"]
    if g < bg:
        fails.append("goodput")
    fits, text = kv_capacity(spec, gamma, meta, slo)
    parts.append(text + (f" {'≥' if fits >= load else '<'} load {load}" if fits is not None else ""))
    if fits is not None and fits < load:
        fails.append("KV")
    cpu, bcpu = cpu_per_1k_tokens(spec), cpu_per_1k_tokens(base)
    if cpu is not None:
        lim = slo.max_cpu_s_per_1k_tokens
        parts.append(f"{cpu:.1f} CPU-s per 1k tokens (plain {bcpu:.1f})" if bcpu is not None
                     else f"{cpu:.1f} CPU-s per 1k tokens")
        if lim is not None:
            parts[-1] += f" {'≤' if cpu <= lim else '>'} {lim:g}"
            if cpu > lim:
                fails.append("CPU cost")
    return GateResult("capacity", FAIL if fails else PASS, "; ".join(parts))


def evaluate_gates(
    scenario: dict[str, Any], spec: Sequence[RequestRecord], base: Sequence[RequestRecord], slo: SLO = SLO()
) -> dict[str, GateResult]:
    """All four gates of one scenario (``scenario`` is an :func:`~specledger.analysis.analyze_scenario` dict)."""
    return {
        "correctness": correctness_gate(spec, base, float(scenario["temperature"]), slo),
        "quality": quality_gate(spec, base, slo.quality_tolerance),
        "latency": latency_gate(scenario["latency"], slo),
        "capacity": capacity_gate(
            scenario.get("paired_tokens_per_s"),
            scenario.get("baseline_tokens_per_s"),
            scenario.get("memory_bytes"),
            slo,
        ),
    }


# ----------------------------------------------------------------------------- verdict


def _blocking(gates: dict[str, dict[str, str]], slo: SLO) -> list[str]:
    bad = {FAIL, NOT_ASSESSED} if slo.require_assessed else {FAIL}
    return [name for name in GATES if gates.get(name, {}).get("status", NOT_ASSESSED) in bad]


#: categories that are controls, never deployed: they show what the drafters do on input without structure
CONTROL_CATEGORIES = frozenset({"random"})
#: memory rank of a drafter's own state (weights, KV): model-free < shared weights < int8 copy < separate model
DRAFTER_MEMORY_RANK = {"ngram": 0, "suffix": 1, "layerskip": 2, "quant-self": 3, "model": 4}


def repeated_ngram_fraction(token_ids: Sequence[int], n: int = 4) -> float | None:
    """Share of an output's n-grams that already occurred earlier in it (None when shorter than n + 1)."""
    grams = [tuple(token_ids[i : i + n]) for i in range(len(token_ids) - n + 1)]
    if len(grams) < 2:
        return None
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def control_repetition(records: Sequence[RequestRecord], n: int = 4) -> dict[tuple[str, float], float]:
    """Mean repeated-n-gram fraction of plain decoding's outputs per control (category, temperature)."""
    acc: dict[tuple[str, float], list[float]] = defaultdict(list)
    for r in records:
        if r.category in CONTROL_CATEGORIES and (r.drafter or "none") == "none":
            if (f := repeated_ngram_fraction(r.token_ids, n)) is not None:
                acc[(r.category, float(r.temperature))].append(f)
    return {k: sum(v) / len(v) for k, v in acc.items()}


def _memory_key(s: dict[str, Any]) -> tuple:
    g = s["gamma"] if isinstance(s["gamma"], (int, float)) else math.inf
    return (DRAFTER_MEMORY_RANK.get(s["drafter"], 5), g)


def _half_width(s: dict[str, Any]) -> float | None:
    lo, hi = s["speedup_ci"]
    return None if lo is None or hi is None else (hi - lo) / 2


def prompts_to_separate(a: dict[str, Any], b: dict[str, Any] | None = None, threshold: float = 1.0) -> int | None:
    """Paired prompts that would make the 95 % intervals of ``a`` and ``b`` (or ``a`` and ``threshold``)
    stop overlapping, if the half-widths shrink as 1/sqrt(n) and the point estimates stay put."""
    n = max(int(a.get("paired_prompts") or 1), 1)
    ha = _half_width(a)
    if ha is None:
        return None
    if b is None:
        gap, width = abs(a["speedup"] - threshold), ha
    else:
        hb = _half_width(b)
        if hb is None:
            return None
        gap, width = abs(a["speedup"] - b["speedup"]), ha + hb
    if not (math.isfinite(gap) and math.isfinite(width)) or gap <= 0:  # a NaN speed-up separates nothing
        return None
    return max(n + 1, math.ceil(n * (width / gap) ** 2))


def _name(s: dict[str, Any]) -> str:
    return f"{s['drafter']} γ {s['gamma']}"


def verdicts(
    scenarios: Sequence[dict[str, Any]],
    slo: SLO = SLO(),
    controls: dict[tuple[str, float], float] | None = None,
) -> list[dict[str, Any]]:
    """One decision per (category, temperature) from scenario dicts carrying ``gates`` (as dicts).

    Among the settings with no blocking gate and CI low > ``slo.min_ci_low``, take the fastest; every
    setting whose interval overlaps its interval is as good as far as the data can tell ("ngram γ 2 ≈
    γ 4"): pick among them by the stated rule (the cheaper in memory: model-free drafter before
    shared-weight, int8 and separate-model drafters, then the smaller γ), and mark the decision
    unresolved with the prompts it would take to separate them. Control categories
    (:data:`CONTROL_CATEGORIES`) are never deployed: their entry is ``decision = "control"``.
    """
    controls = controls or {}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in scenarios:
        groups[(s["category"], s["temperature"])].append(s)
    out = []
    for (cat, temp), items in groups.items():
        measured = [s for s in items if s.get("speedup") is not None]
        eligible = [
            s
            for s in measured
            if not _blocking(s["gates"], slo) and (s["speedup_ci"][0] or -math.inf) > slo.min_ci_low
        ]
        base = {"category": cat, "temperature": temp, "resolved": True, "tied_with": [], "prompts_needed": None}
        if cat in CONTROL_CATEGORIES:
            rep = controls.get((cat, float(temp)))
            fastest = max(measured, key=lambda s: s["speedup"]) if measured else None
            seen = (f"; its fastest setting, {_name(fastest)}, measured S = {fastest['speedup']:.2f}"
                    if fastest else "")
            rep_text = (f"plain decoding's replies to random tokens repeat themselves: {100 * rep:.0f} % of their "
                        "4-grams occurred earlier in the same reply, which the n-gram and suffix drafters copy"
                        if rep is not None else "no plain output long enough to measure its repetition")
            out.append({**base, "decision": "control", "drafter": None, "gamma": None, "label": "control",
                        "speedup": None, "speedup_ci": [None, None], "repeated_ngram_fraction": rep,
                        "reason": (f"Control, never deployed: random token ids have no structure to predict, so "
                                   f"any speed-up here comes from the model's own output, not the workload; "
                                   f"{rep_text}{seen}.")})
            continue
        if eligible:
            fastest = max(eligible, key=lambda s: s["speedup"])
            flo = fastest["speedup_ci"][0]
            tied = [s for s in eligible if s is fastest or (s["speedup_ci"][1] is not None and flo is not None
                                                            and s["speedup_ci"][1] >= flo)]
            best = min(tied, key=lambda s: (*_memory_key(s), -s["speedup"]))
            lo, hi = best["speedup_ci"]
            caveat = [n for n in GATES if best["gates"][n]["status"] == NOT_ASSESSED]
            others = [s for s in tied if s is not best]
            reason = (
                f"{best['drafter']} γ={best['gamma']} passes the gates: "
                f"S = {best['speedup']:.2f} (95% CI {lo:.2f}–{hi:.2f})"
                + (f"; {', '.join(caveat)} not assessed" if caveat else "")
            )
            entry = {**base, "decision": "deploy", "drafter": best["drafter"], "gamma": best["gamma"],
                     "label": best["label"], "speedup": best["speedup"], "speedup_ci": best["speedup_ci"]}
            if others:
                need = [prompts_to_separate(best, o) for o in others]
                known = [x for x in need if x is not None]
                entry.update(resolved=False, tied_with=[o["label"] for o in others],
                             prompts_needed=max(known) if known else None)
                ties = " ≈ ".join([_name(best)] + [_name(o) for o in others])
                reason += (f". Not yet resolved: {ties} (their 95% intervals overlap); chosen by the rule "
                           "'cheaper in memory, then smaller γ'; "
                           + (f"≈ {entry['prompts_needed']} paired prompts per category would separate them"
                              if known else "more prompts are needed to separate them"))
            out.append({**entry, "reason": reason + "."})
            continue
        entry = {**base, "decision": "off", "drafter": None, "gamma": None, "label": "off", "speedup": None,
                 "speedup_ci": [None, None], "reason": _off_reason(measured, slo)}
        passing = [s for s in measured if not _blocking(s["gates"], slo)]
        if passing:
            top = max(passing, key=lambda s: s["speedup"])
            if top["speedup"] > slo.min_ci_low and top["speedup_ci"][0] is not None:
                need = prompts_to_separate(top, threshold=slo.min_ci_low)
                entry.update(resolved=False, prompts_needed=need)
                entry["reason"] += (f" Not yet resolved: {_name(top)} measured S = {top['speedup']:.2f} but its "
                                    f"interval reaches {slo.min_ci_low:g}"
                                    + (f"; ≈ {need} paired prompts would settle it." if need else "."))
        out.append(entry)
    return out


def _off_reason(measured: Sequence[dict[str, Any]], slo: SLO) -> str:
    if not measured:
        return "Off: no speculative setting was measured against plain decoding on the same prompts."
    fastest = max(measured, key=lambda s: s["speedup"])
    lo = fastest["speedup_ci"][0]
    blocked = _blocking(fastest["gates"], slo)
    name = f"{fastest['drafter']} γ={fastest['gamma']} (S = {fastest['speedup']:.2f})"
    if blocked:
        ok = [s for s in measured if not _blocking(s["gates"], slo)]
        tail = (
            f"; the best setting that passes, {ok[0]['drafter']} γ={ok[0]['gamma']}, has a CI lower bound of "
            f"{ok[0]['speedup_ci'][0] if ok[0]['speedup_ci'][0] is not None else float('nan'):.2f} ≤ {slo.min_ci_low:g}"
            if (ok := sorted(ok, key=lambda s: -s["speedup"]))
            else ""
        )
        return f"Off: the fastest setting, {name}, fails the {' and '.join(blocked)} gate{'s' if len(blocked) > 1 else ''}{tail}."
    if lo is None:
        return (f"Off: the fastest setting, {name}, has no confidence interval (one prompt cannot be resampled); "
                "measure more prompts (--n 2 or more) before deploying.")
    return f"Off: the fastest setting, {name}, has a speed-up CI lower bound of {lo:.2f}, not above {slo.min_ci_low:g}."
