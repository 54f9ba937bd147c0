"""Quantization and speculation, four measurements on the same prompts.

Per prompt, side by side (one round of each in turn, :mod:`specledger.engine.interleave`, so the machine's
drift hits every setting alike):

  (1) fp32 plain      the unquantized target, plain decoding         -- the one baseline
  (2) int8 plain      the weight-only int8 target, plain decoding    -- quant only
  (3) fp32 + drafter  speculation, verified by the fp32 target       -- spec only
  (4) int8 + drafter  speculation, verified by the int8 target       -- combined

Every speed-up is taken against (1) from totals, S = (Σ tokens / Σ seconds)_setting /
(Σ tokens / Σ seconds)_(1). The product S_(2) · S_(3) is shown beside the *measured* S_(4),
never in its place (:mod:`specledger.ledger.fourway`): quantization changes the very cost
speculation trades on, so the gains do not multiply.

Correctness is judged against the target that actually verifies: (3) must reproduce (1)
token for token, (4) must reproduce (2). The int8 target is a different model, so (2) vs (1)
is a *quality* question, reported separately from task scores ("quantization effect on quality").

Default drafter: ``ngram``. ``quant-self`` drafts with an int8 copy of the target; on an int8
target that draft *is* the target (nothing left to quantize), so (4) would measure a drafter
that costs a full target step per candidate and is always accepted -- not a meaningful
"combined" setting. It is allowed (``drafter="quant-self"``) and flagged in the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specledger.bench.experiment import (
    Progress,
    Prompt,
    check_fresh,
    drafter_factory,
    encode_prompts,
    identical,
    quality_scores,
    setting_figures,
    tag,
)
from specledger.engine.interleave import SideBySide
from specledger.engine.protocol import TargetEngine
from specledger.errors import require
from specledger.records import RequestRecord
from specledger.rundir import QUANT_JSON, RunDir

QUANT_EXPERIMENT = "quant4"


# ----------------------------------------------------------------------------- the experiment
def int8_engine(engine: TargetEngine) -> TargetEngine:
    """An Engine over ``quantize_int8(engine.model)`` sharing tokenizer, EOS ids, context and chat template."""
    from specledger.engine.decode import Engine
    from specledger.engine.int8 import quantize_int8

    q = Engine(quantize_int8(engine.model), engine.tokenizer, sorted(engine.eos_token_ids), engine.max_context,
               name=engine.name, dtype=f"{engine.dtype or 'float32'}+int8")
    q.loaded = engine.loaded
    return q


SETTINGS = (  # (key, label, target, speculative)
    ("fp32-plain", "fp32 plain (baseline)", "fp32", False),
    ("int8-plain", "int8 plain (quant only)", "int8", False),
    ("fp32-spec", "fp32 + drafter (spec only)", "fp32", True),
    ("int8-spec", "int8 + drafter (combined)", "int8", True),
)
VERIFIER = {"fp32-plain": None, "int8-plain": None, "fp32-spec": "fp32-plain", "int8-spec": "int8-plain"}


def drafter_note(drafter: str) -> str:
    if drafter == "quant-self":
        return ("quant-self drafts with an int8 copy of the target; on the int8 target that copy is the "
                "target itself, so the combined setting pays a full target step per candidate for 100% "
                "acceptance. The four-way defaults to ngram for this reason.")
    return (f"{drafter} drafts independently of the target's precision, so spec-only and combined use the "
            "same proposer and differ only in the verifying target (quant-self would be degenerate on int8).")


def four_way_summary(by_setting: dict[str, list[RequestRecord]], prompt_ids: Sequence[str],
                     n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Figures of the four settings, the four-way arithmetic, correctness and the int8 quality effect."""
    from specledger.ledger.fourway import compare_quant_and_spec
    from specledger.quality.stats import compare_quality

    base = by_setting["fp32-plain"]
    settings = []
    for key, label, target, spec in SETTINGS:
        recs = by_setting[key]
        row = {"key": key, "setting": label, "target": target, "speculative": spec,
               **setting_figures(recs, base, n_resamples, seed)}
        verifier = VERIFIER[key]
        row["verifier"] = verifier.replace("-", " ") if verifier else None
        row["correctness"] = identical(recs, by_setting[verifier]) if verifier else None
        if key == "fp32-plain":  # the reference itself: S = 1 by definition, no interval
            row["speedup"], row["speedup_ci"] = 1.0, [None, None]
        scores = [s for s in quality_scores(recs, prompt_ids) if s is not None]
        row["quality_mean"] = float(np.mean(scores)) if scores else None
        settings.append(row)
    tps = {row["key"]: row["tokens_per_s"] for row in settings}
    four = compare_quant_and_spec(tps["fp32-plain"], tps["int8-plain"], tps["fp32-spec"], tps["int8-spec"])
    quality = compare_quality(quality_scores(base, prompt_ids), quality_scores(by_setting["int8-plain"], prompt_ids),
                              n_bootstrap=2000, seed=seed)
    changed = identical(by_setting["int8-plain"], base)
    return {
        "settings": settings,
        "four_way": {
            "quant_speedup": four.quant_speedup,
            "spec_speedup": four.spec_speedup,
            "combined_speedup": four.combined_speedup,
            "product_of_single_speedups": four.product_of_single_speedups,
            "interaction": four.interaction,
            "spec_speedup_on_quantized": four.spec_speedup_on_quantized,
        },
        "correctness": {
            "spec_fp32_vs_fp32_plain": settings[2]["correctness"],
            "spec_int8_vs_int8_plain": settings[3]["correctness"],
        },
        "int8_output_vs_fp32": changed,
        "quality_int8_vs_fp32": quality,
    }


def statements(result: dict[str, Any]) -> list[str]:
    """The findings in sentences, with the numbers."""
    fw = result["four_way"]
    c = result["correctness"]
    q = result["quality_int8_vs_fp32"]
    ch = result["int8_output_vs_fp32"]
    out = [
        f"Quant only S = {fw['quant_speedup']:.3f}, spec only S = {fw['spec_speedup']:.3f}; their product "
        f"{fw['product_of_single_speedups']:.3f} vs the measured combined S = {fw['combined_speedup']:.3f} "
        f"(interaction {fw['interaction']:.3f}; < 1 means the gains overlap).",
        f"Speculation on the int8 target adds {fw['spec_speedup_on_quantized']:.3f}x over int8 plain.",
        f"Correctness vs the verifying target: fp32 + drafter {c['spec_fp32_vs_fp32_plain']['identical']}/"
        f"{c['spec_fp32_vs_fp32_plain']['of']} identical to fp32 plain; int8 + drafter "
        f"{c['spec_int8_vs_int8_plain']['identical']}/{c['spec_int8_vs_int8_plain']['of']} identical to int8 plain.",
        f"Quantization changes the output itself on {ch['of'] - ch['identical']}/{ch['of']} prompts "
        "(a different model, judged by quality, not correctness).",
    ]
    if q["n_pairs"]:
        lo, hi = q["ci95"]
        out.append(f"Quantization effect on quality: mean task score {q['base_mean']:.3f} (fp32) -> "
                   f"{q['spec_mean']:.3f} (int8), difference {q['mean_difference']:+.3f} "
                   f"(95% CI {lo:+.3f} to {hi:+.3f}, {q['n_pairs']} scored prompts).")
    else:
        out.append("Quantization effect on quality: not assessed (no prompt with an automatic task metric).")
    return out


def _warm_up(runs: Sequence[tuple[Any, Callable[[], Any], int]], prompt: Prompt, max_tokens: int) -> None:
    """One short request per (engine, drafter, gamma), discarded: first-call allocations out of the timings."""
    for eng, make, gamma in runs:
        eng.generate(list(prompt.ids), drafter=make(), gamma=gamma, max_tokens=min(max_tokens, 8))


def run_quantization(
    engine: TargetEngine,
    items: Sequence[Any],
    drafter: str = "ngram",
    gamma: int = 4,
    max_tokens: int = 96,
    out_dir: str | Path = ".",
    seed: int = 0,
    n_resamples: int = 1000,
    progress: Progress | None = None,
    layers: str | None = None,
    draft_path: str | None = None,
) -> dict[str, Any]:
    """Run the four settings per prompt (interleaved), append tagged traces to ``out_dir/traces.jsonl``
    (``extra.experiment = "quant4"``, ``extra.target`` = fp32 | int8) and write ``quantization.json``."""
    from specledger.engine.sampling import SamplingParams

    require(isinstance(gamma, int) and gamma >= 1, f"--gamma must be an integer >= 1, got {gamma!r}")
    require(drafter != "none", "the four-way needs a drafter; use --drafter ngram (default)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_fresh(out, QUANT_EXPERIMENT)
    prompts, skipped = encode_prompts(engine, items, max_tokens)
    q_engine = int8_engine(engine)
    engines = {"fp32": engine, "int8": q_engine}
    makers = {
        "fp32": drafter_factory(drafter, engine, layers, draft_path),
        "int8": drafter_factory(drafter, q_engine, layers, draft_path),
    }
    plain = drafter_factory("none", engine)
    runs = {key: (engines[target], makers[target] if spec else plain, gamma if spec else 0)
            for key, _, target, spec in SETTINGS}
    _warm_up(list(runs.values()), prompts[0], max_tokens)

    params = SamplingParams(temperature=0.0, seed=seed)
    by_setting: dict[str, list[RequestRecord]] = {key: [] for key, *_ in SETTINGS}
    total, done = len(prompts) * len(SETTINGS), 0
    side_by_side = SideBySide()
    for p in prompts:  # a prompt's four settings side by side, one round of each in turn
        if progress:
            progress(done, total, f"quant4 {p.category}: {len(SETTINGS)} settings side by side")
        records = side_by_side.run([
            (runs[key][0], p.ids, dict(drafter=runs[key][1](), gamma=runs[key][2], params=params,
                                       max_tokens=max_tokens, request_id=f"quant4|{p.id}|{key}"))
            for key, *_ in SETTINGS])
        for (key, _, target, _), rec in zip(SETTINGS, records):
            tag(rec, p, QUANT_EXPERIMENT, key, target=target)
            by_setting[key].append(rec)
        RunDir(out).append(records)
        done += len(SETTINGS)
    if progress:
        progress(done, total, "quant4 done")

    result: dict[str, Any] = {
        "experiment": QUANT_EXPERIMENT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": engine.name,
        "dtype": engine.dtype,
        "drafter": drafter,
        "gamma": gamma,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "prompts": [p.id for p in prompts],
        "categories": sorted({p.category for p in prompts}),
        "skipped_prompts": skipped,
        "drafter_note": drafter_note(drafter),
        **four_way_summary(by_setting, [p.id for p in prompts], n_resamples, seed),
    }
    result["statements"] = statements(result)
    return RunDir(out).write_experiment(QUANT_JSON, result)
