"""The correctness gate: greedy (T = 0) outputs token-identical to plain decoding on every shared prompt;
under sampling, the tokens after the first speculative round over many samples of one prompt,
speculative vs plain, with its power stated (:mod:`specledger.gates.sampled_stats`); "not assessed (power X %)"
when the sample is too small."""

from __future__ import annotations

from collections.abc import Sequence

from specledger.analysis.scenario import by_prompt, shared_prompts
from specledger.gates.result import FAIL, NOT_ASSESSED, PASS, GateResult
from specledger.gates.slo import SLO
from specledger.records import RequestRecord


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
    the first speculative round over many samples of the same prompt (:mod:`specledger.gates.sampled_stats`).
    Too few samples for 95 % power: "not assessed (power X %)", never "pass". ``min_prompts`` is
    kept for callers; the test's unit is samples of one prompt, not prompts."""
    from specledger.gates.sampled_stats import sampled_test

    res = sampled_test(spec, base, alpha)
    return GateResult("correctness", res["status"], ("sampling: " if res["status"] != NOT_ASSESSED else "")
                      + res["evidence"])


def correctness_gate(
    spec: Sequence[RequestRecord], base: Sequence[RequestRecord], temperature: float, slo: SLO = SLO()
) -> GateResult:
    if temperature == 0:
        return greedy_correctness(spec, base)
    return sampled_correctness(spec, base, slo.min_sampled_prompts, slo.alpha)
