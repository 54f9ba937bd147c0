"""The quality gate: mean task score (``extra["quality"]``) at most ``quality_tolerance`` below the baseline's,
on prompts scored on both sides whose replies were not all cut before an answer."""

from __future__ import annotations

import math
from collections.abc import Sequence

from specledger.analysis.scenario import by_prompt, shared_prompts
from specledger.gates.result import FAIL, NOT_ASSESSED, PASS, GateResult
from specledger.records import RequestRecord


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
    if all(a == 0 and b == 0 for a, b in pairs):  # 0.000 vs 0.000 is no evidence of equal quality
        return GateResult("quality", NOT_ASSESSED,
                          f"the task metric scored 0 on all {len(pairs)} prompts on both sides: nothing to compare "
                          "(raise the category's max tokens, or check the reference answers)")
    status = PASS if ms >= mb - tolerance else FAIL
    return GateResult(
        "quality",
        status,
        f"mean score {ms:.3f} vs plain {mb:.3f} ({ms - mb:+.3f}, tolerance {tolerance:g}) on {len(pairs)} prompts"
        + (f" ({cut} more cut at {cut_at} tokens before an answer could finish, left out)" if cut else ""),
    )


# ----------------------------------------------------------------------------- latency / capacity
