"""Quantization and speculation, four measurements on the same prompts.

Per prompt, side by side (one round of each in turn, :mod:`specledger.engine.interleave`, so the machine's
drift hits every setting alike), with ``Q`` the quantized target (:func:`quantized_engine`; on the bundled GGUF
``gguf``: the file's own Q4_1/Q8_0 blocks kept quantized on the native kernel, what a CPU user deploys; else int8):

  (1) fp32 plain      the unquantized target, plain decoding         -- the one baseline
  (2) Q plain         the quantized target, plain decoding           -- quant only
  (3) fp32 + drafter  speculation, verified by the fp32 target       -- spec only
  (4) Q + drafter     speculation, verified by the quantized target  -- combined

Every speed-up is taken against (1) from totals, S = (Σ tokens / Σ seconds)_setting /
(Σ tokens / Σ seconds)_(1). The product S_(2) · S_(3) is shown beside the *measured* S_(4),
never in its place (:mod:`specledger.ledger.fourway`): quantization changes the very cost
speculation trades on, so the gains do not multiply. :func:`round_terms` says why, term by term: the
plain step gets cheaper (fewer weight bytes), while a verify pass's extra rows cost arithmetic that the
weight stream no longer hides (the verify premium grows at fewer bytes per row), and a drafter's fixed
cost becomes a larger share of a step.

Correctness is judged against the target that actually verifies: (3) must reproduce (1)
token for token, (4) must reproduce (2). The quantized target is a different model, so (2) vs (1)
is a *quality* question, reported separately from task scores ("quantization effect on quality").

The drafter (``sweep``'s default): each target's best of ngram and suffix at γ 2 and 4
(:data:`DEFAULT_CANDIDATES`), picked by committed tokens/s on half of the prompts (:func:`split_for_selection`),
never on the table's own: the quantized target's best can differ from fp32's, its verify premium being higher.
``quant-self`` drafts with an int8 copy of the target; on an int8 target that draft *is* the target (nothing
left to quantize), so (4) would measure a drafter
that costs a full target step per candidate and is always accepted -- not a meaningful
"combined" setting. It is allowed (``drafter="quant-self"``) and flagged in the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from specledger.bench.experiment import (
    Progress,
    Prompt,
    check_fresh,
    drafter_factory,
    encode_prompts,
    experiment_header,
    greedy_prompt_fields,
    identical,
    quality_scores,
    setting_figures,
    tag,
)
from specledger.engine.drafters.catalog import NGRAM, PLAIN, QUANT_SELF, SUFFIX
from specledger.engine.interleave import SideBySide
from specledger.engine.protocol import StreamArgs, TargetEngine
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


def quantized_engine(engine: TargetEngine, quant: str = "auto") -> tuple[TargetEngine, str]:
    """The quantized target and its short name for the four-way: ``gguf`` (the target's GGUF file with its own
    blocks kept quantized, engine/quant_gguf.py: what a CPU user deploys), ``q8_0`` / ``q4_0`` / ``q4_1`` (every
    linear quantized to that block format), or ``int8`` (per-channel, engine/int8.py). ``auto``: ``gguf`` when the
    target was loaded from a .gguf file and the native kernel is built, else ``int8``."""
    import copy

    from specledger.engine import kernels
    from specledger.engine.decode import Engine

    source = str(getattr(getattr(engine, "loaded", None), "source", "") or "")
    is_gguf = source.lower().endswith(".gguf")
    if quant == "auto":
        quant = "gguf" if is_gguf and kernels.lib() is not None else "int8"
    require(quant in ("gguf", "int8", "q8_0", "q4_0", "q4_1"),
            f"unknown quantized target {quant!r}; use auto, gguf, q8_0, q4_0, q4_1 or int8")
    require(not str(engine.dtype or "").startswith(("gguf", "q")),
            f"the four-way needs the float32 target as its baseline, not {engine.dtype}; drop --dtype")
    if quant == "int8":
        return int8_engine(engine), "int8"
    from specledger.engine import quant_gguf

    model = copy.deepcopy(engine.model)
    if quant == "gguf":
        require(is_gguf, "the four-way's gguf target keeps a GGUF file's own blocks; the target came from "
                         f"{source or 'no file'}: pass a .gguf --target")
        label = quant_gguf.load_quantized(model, source).label
    else:
        quant_gguf.quantize_model(model, quant.upper())
        label = quant
    q = Engine(model, engine.tokenizer, sorted(engine.eos_token_ids), engine.max_context, name=engine.name,
               dtype=label)
    q.loaded = engine.loaded
    return q, quant


def float_engine(engine: TargetEngine) -> TargetEngine:
    """The four-way's float32 baseline: ``engine`` itself, or, for an engine on quantized weights (``specledger
    run``'s default on a GGUF), the same target loaded again in float32 from its file."""
    if not str(engine.dtype or "").startswith(("gguf", "q", "float32+int8")):
        return engine
    from specledger.engine.build import build_engine

    source = getattr(getattr(engine, "loaded", None), "source", None)
    require(source is not None, f"the four-way needs the float32 target; {engine.dtype} has no file to load it from")
    return build_engine(str(source), "float32")


def settings_for(quant: str) -> tuple[tuple[str, str, str, bool], ...]:
    """(key, label, target, speculative) of the four settings with quantized target ``quant``."""
    return (
        ("fp32-plain", "fp32 plain (baseline)", "fp32", False),
        (f"{quant}-plain", f"{quant} plain (quant only)", quant, False),
        ("fp32-spec", "fp32 + drafter (spec only)", "fp32", True),
        (f"{quant}-spec", f"{quant} + drafter (combined)", quant, True),
    )


def verifiers_for(quant: str) -> dict[str, str | None]:
    """Which plain setting each setting must reproduce token for token (None: a plain setting itself)."""
    return {"fp32-plain": None, f"{quant}-plain": None, "fp32-spec": "fp32-plain", f"{quant}-spec": f"{quant}-plain"}


SETTINGS = settings_for("int8")  # (key, label, target, speculative)
VERIFIER = verifiers_for("int8")


class RoundTermsDict(TypedDict, total=False):
    """Why a speculative setting gains what it gains over its own plain decoding, term by term (means over rounds;
    empty without rounds on either side)."""

    t_step_ms: float  # plain decoding's round (one token)
    t_draft_ms: float
    t_verify_ms: float
    t_other_ms: float
    verify_rows: float  # rows of a verify pass: proposed + 1
    tokens_per_round: float
    verify_premium: float  # t_verify / t_step
    draft_share: float  # t_draft / t_step
    predicted_speedup_vs_own_plain: float
    weight_bytes: int
    bytes_per_verified_row: float


class _SelectionKeys(TypedDict):
    prompts: list[str]
    candidates: list[str]
    rule: str


class SelectionDict(_SelectionKeys, total=False):
    """How each target's drafter was picked: on which prompts, among which candidates, by which rule; measured
    (several candidates and selection prompts): each candidate's committed tokens/s per target and the picks."""

    tokens_per_s: dict[str, dict[str, float]]
    picks: dict[str, str]


def round_terms(spec: Sequence[RequestRecord], plain: Sequence[RequestRecord], weight_bytes: int) -> RoundTermsDict:
    """Why a speculative setting gains what it gains over its own plain decoding, term by term (means over rounds):

    S_spec/plain ~= L / ((t_draft + t_verify + t_other) / t_step), t_step = plain's mean round (one token), L the
    tokens committed per round; ``verify_premium = t_verify / t_step`` (a verify pass of ``rows = proposed + 1`` rows
    against a one-row step), ``bytes_per_row = weight_bytes / rows`` (the weight stream each verified row shares)."""
    from specledger.analysis.metrics import all_rounds

    sr, pr = all_rounds(spec), all_rounds(plain)
    if not sr or not pr:
        return {}
    step = float(np.mean([r.t_round for r in pr]))
    draft = float(np.mean([r.t_draft for r in sr]))
    verify = float(np.mean([r.t_verify for r in sr]))
    other = float(np.mean([r.t_other for r in sr]))
    rows = float(np.mean([r.proposed + 1 for r in sr]))
    per_round = float(np.mean([r.committed for r in sr]))
    return {
        "t_step_ms": step * 1e3, "t_draft_ms": draft * 1e3, "t_verify_ms": verify * 1e3, "t_other_ms": other * 1e3,
        "verify_rows": rows, "tokens_per_round": per_round,
        "verify_premium": verify / step, "draft_share": draft / step,
        "predicted_speedup_vs_own_plain": per_round / ((draft + verify + other) / step),
        "weight_bytes": int(weight_bytes), "bytes_per_verified_row": weight_bytes / rows,
    }


def drafter_note(drafter: str) -> str:
    if drafter == QUANT_SELF.name:
        return ("quant-self drafts with an int8 copy of the target; on the int8 target that copy is the "
                "target itself, so the combined setting pays a full target step per candidate for 100% "
                "acceptance. The four-way defaults to ngram for this reason.")
    return (f"{drafter} drafts independently of the target's precision, so spec-only and combined use the "
            "same proposer and differ only in the verifying target (quant-self would be degenerate on int8).")


def four_way_summary(by_setting: dict[str, list[RequestRecord]], prompt_ids: Sequence[str],
                     n_resamples: int = 1000, seed: int = 0, quant: str = "int8",
                     weight_bytes: dict[str, int] | None = None, drafters: dict[str, str] | None = None
                     ) -> dict[str, Any]:
    """Figures of the four settings, the four-way arithmetic, correctness and the quantization quality effect;
    ``drafters``: {target: the drafter label its speculative setting ran} (named in the setting's label)."""
    from specledger.ledger.fourway import compare_quant_and_spec
    from specledger.quality.stats import compare_quality

    base = by_setting["fp32-plain"]
    settings = []
    verifiers = verifiers_for(quant)
    for key, label, target, spec in settings_for(quant):
        if spec and drafters and target in drafters:
            label = label.replace("drafter", drafters[target])
        recs = by_setting[key]
        row = {"key": key, "setting": label, "target": target, "speculative": spec,
               **setting_figures(recs, base, n_resamples, seed)}
        verifier = verifiers[key]
        row["verifier"] = verifier.replace("-", " ") if verifier else None
        row["correctness"] = identical(recs, by_setting[verifier]) if verifier else None
        if key == "fp32-plain":  # the reference itself: S = 1 by definition, no interval
            row["speedup"], row["speedup_ci"] = 1.0, [None, None]
        scores = [s for s in quality_scores(recs, prompt_ids) if s is not None]
        row["quality_mean"] = float(np.mean(scores)) if scores else None
        settings.append(row)
    tps = {row["key"]: row["tokens_per_s"] for row in settings}
    qp, qs = f"{quant}-plain", f"{quant}-spec"
    four = compare_quant_and_spec(tps["fp32-plain"], tps[qp], tps["fp32-spec"], tps[qs])
    quality = compare_quality(quality_scores(base, prompt_ids), quality_scores(by_setting[qp], prompt_ids),
                              n_bootstrap=2000, seed=seed)
    changed = identical(by_setting[qp], base)
    wb = weight_bytes or {}
    terms = {"fp32": round_terms(by_setting["fp32-spec"], base, wb.get("fp32", 0)),
             quant: round_terms(by_setting[qs], by_setting[qp], wb.get(quant, 0))}
    return {
        "quant_target": quant,
        "quality_reference": (f"the {quant} target is the correctness reference for its own speculation ({qs} must "
                              f"reproduce {qp}); its distance from fp32 is reported as quality, not correctness"),
        "terms": terms,
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
            f"spec_{quant}_vs_{quant}_plain": settings[3]["correctness"],
        },
        f"{quant}_output_vs_fp32": changed,
        f"quality_{quant}_vs_fp32": quality,
        "quant_output_vs_fp32": changed,  # the same two under names that do not depend on the quantized target
        "quality_quant_vs_fp32": quality,
    }


def statements(result: dict[str, Any]) -> list[str]:
    """The findings in sentences, with the numbers."""
    qn = result.get("quant_target", "int8")
    fw = result["four_way"]
    c = result["correctness"]
    q = result[f"quality_{qn}_vs_fp32"]
    ch = result[f"{qn}_output_vs_fp32"]
    cq = c[f"spec_{qn}_vs_{qn}_plain"]
    sel = result.get("selection") or {}
    out = []
    if sel.get("picks"):
        picks = sel["picks"]
        out.append(f"Each target speculates with its own best drafter, picked on {len(sel['prompts'])} prompts held "
                   f"apart from the table's: fp32 {picks.get('fp32')}, {qn} {picks.get(qn)} (of "
                   f"{', '.join(sel['candidates'])}).")
    out += [
        f"Quant only S = {fw['quant_speedup']:.3f}, spec only S = {fw['spec_speedup']:.3f}; their product "
        f"{fw['product_of_single_speedups']:.3f} vs the measured combined S = {fw['combined_speedup']:.3f} "
        f"(interaction {fw['interaction']:.3f}; < 1 means the gains overlap).",
        f"Speculation on the {qn} target adds {fw['spec_speedup_on_quantized']:.3f}x over {qn} plain.",
        f"Correctness vs the verifying target: fp32 + drafter {c['spec_fp32_vs_fp32_plain']['identical']}/"
        f"{c['spec_fp32_vs_fp32_plain']['of']} identical to fp32 plain; {qn} + drafter "
        f"{cq['identical']}/{cq['of']} identical to {qn} plain.",
        f"Quantization changes the output itself on {ch['of'] - ch['identical']}/{ch['of']} prompts "
        "(a different model, judged by quality, not correctness).",
    ]
    terms = result.get("terms") or {}
    tf, tq = terms.get("fp32") or {}, terms.get(qn) or {}
    if tf and tq:
        out.append(
            f"Why they do not multiply, per round: a plain step costs {tf['t_step_ms']:.2f} ms (fp32) vs "
            f"{tq['t_step_ms']:.2f} ms ({qn}); a verify pass of ~{tf['verify_rows']:.1f} rows costs "
            f"{tf['verify_premium']:.2f}x a step in fp32 ({tf['bytes_per_verified_row'] / 1e6:.0f} MB of weights per "
            f"row) but {tq['verify_premium']:.2f}x on {qn} ({tq['bytes_per_verified_row'] / 1e6:.0f} MB per row: the "
            f"rows' arithmetic is no longer hidden under the weight stream); drafting costs {tf['draft_share']:.2f} "
            f"vs {tq['draft_share']:.2f} steps. With {tf['tokens_per_round']:.2f} vs {tq['tokens_per_round']:.2f} "
            f"tokens per round that predicts {tf['predicted_speedup_vs_own_plain']:.2f}x vs "
            f"{tq['predicted_speedup_vs_own_plain']:.2f}x over each target's own plain decoding.")
    if q["n_pairs"]:
        lo, hi = q["ci95"]
        out.append(f"Quantization effect on quality: mean task score {q['base_mean']:.3f} (fp32) -> "
                   f"{q['spec_mean']:.3f} ({qn}), difference {q['mean_difference']:+.3f} "
                   f"(95% CI {lo:+.3f} to {hi:+.3f}, {q['n_pairs']} scored prompts).")
    else:
        out.append("Quantization effect on quality: not assessed (no prompt with an automatic task metric).")
    return out


def _warm_up(runs: Sequence[tuple[Any, Callable[[], Any], int]], prompt: Prompt, max_tokens: int) -> None:
    """One short request per (engine, drafter, gamma), discarded: first-call allocations out of the timings."""
    for eng, make, gamma in runs:
        eng.generate(list(prompt.ids), drafter=make(), gamma=gamma, max_tokens=min(max_tokens, 8))


#: the four-way's default candidates: each target's best of these speculates (picked on prompts of their own)
DEFAULT_CANDIDATES: tuple[tuple[str, int], ...] = ((NGRAM.name, 2), (NGRAM.name, 4), (SUFFIX.name, 2), (SUFFIX.name, 4))


def candidate_label(drafter: str, gamma: int) -> str:
    return f"{drafter} γ={gamma}"


def prompts_per_category(n: int, candidates: Sequence[tuple[str, int]]) -> int:
    """Prompts per category to load for a four-way with table prompts ``n`` per category: twice that when the
    drafters are picked (:func:`split_for_selection` gives half to the pick), else ``n``."""
    return 2 * n if len(candidates) > 1 else n


def split_for_selection(prompts: Sequence[Prompt]) -> tuple[list[Prompt], list[Prompt]]:
    """(table prompts, selection prompts): within each category, alternately one to the table and one to the
    selection, the table first -- so a drafter is never picked on the prompts its four-way figures come from.
    A category of one prompt gives it to the table."""
    table: list[Prompt] = []
    selection: list[Prompt] = []
    seen: dict[str, int] = {}
    for p in prompts:
        i = seen.get(p.category, 0)
        seen[p.category] = i + 1
        (table if i % 2 == 0 else selection).append(p)
    return table, selection


def pick_drafters(engines: dict[str, TargetEngine], makers: dict[str, dict[str, Callable[[], Any]]],
                  candidates: Sequence[tuple[str, int]], prompts: Sequence[Prompt], max_tokens: int, params: Any,
                  out: Path, progress: Progress | None = None) -> tuple[dict[str, tuple[str, int]], SelectionDict]:
    """Each target's best candidate by committed tokens / second (totals over ``prompts``, the candidates side by
    side per prompt, one round of each in turn): ({target: (drafter, gamma)}, the selection's figures). With one
    candidate, or no selection prompt, the first candidate, unmeasured."""
    cands = list(candidates)
    if len(cands) == 1 or not prompts:
        return {t: cands[0] for t in engines}, {"prompts": [], "candidates": [candidate_label(*c) for c in cands],
                                               "rule": "fixed" if len(cands) == 1 else "no selection prompt: first"}
    side_by_side = SideBySide()
    figures: dict[str, dict[str, float]] = {}
    picks: dict[str, tuple[str, int]] = {}
    done, total = 0, len(engines) * len(prompts) * len(cands)
    for target, eng in engines.items():
        totals = {c: [0, 0.0] for c in cands}
        for p in prompts:
            if progress:
                progress(done, total, f"quant4: {target}'s drafter, {len(cands)} side by side")
            done += len(cands)
            records = side_by_side.run([
                (eng, p.ids, StreamArgs(drafter=makers[target][c[0]](), gamma=c[1], params=params,
                                        max_tokens=max_tokens,
                                        request_id=f"quant4|select|{p.id}|{target}|{c[0]}:{c[1]}")) for c in cands])
            for c, rec in zip(cands, records):
                tag(rec, p, QUANT_EXPERIMENT, f"select-{target}", target=target, drafter=c[0], gamma=c[1])
                totals[c][0] += rec.output_tokens
                totals[c][1] += rec.total_time
            RunDir(out).append(records)
        tps = {c: (n / t if t > 0 else 0.0) for c, (n, t) in totals.items()}
        picks[target] = max(cands, key=lambda c: (tps[c], -cands.index(c)))
        figures[target] = {candidate_label(*c): tps[c] for c in cands}
    return picks, {"prompts": [p.id for p in prompts], "candidates": [candidate_label(*c) for c in cands],
                   "rule": "each target's highest committed tokens/s over the selection prompts (held apart from "
                           "the table's)", "tokens_per_s": figures,
                   "picks": {t: candidate_label(*c) for t, c in picks.items()}}


def run_quantization(
    engine: TargetEngine,
    items: Sequence[Any],
    drafter: str = NGRAM.name,
    gamma: int = 4,
    max_tokens: int = 96,
    out_dir: str | Path = ".",
    seed: int = 0,
    n_resamples: int = 1000,
    progress: Progress | None = None,
    layers: str | None = None,
    draft_path: str | None = None,
    quant: str = "auto",
    candidates: Sequence[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """Run the four settings per prompt (interleaved), append tagged traces to ``out_dir/traces.jsonl``
    (``extra.experiment = "quant4"``, ``extra.target`` = fp32 | int8) and write ``quantization.json``.

    ``candidates`` ((drafter, gamma) pairs; default ``((drafter, gamma),)``): with several, each target speculates
    with its own best (:func:`pick_drafters`), picked on half the prompts (:func:`split_for_selection`); the
    four-way table is measured on the other half."""
    from specledger.engine.sampling import SamplingParams

    cands = list(candidates) if candidates else [(drafter, gamma)]
    for d, g in cands:
        require(isinstance(g, int) and g >= 1, f"--gamma must be an integer >= 1, got {g!r}")
        require(d != PLAIN.name, "the four-way needs a drafter; use --drafter ngram (default)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_fresh(out, QUANT_EXPERIMENT)
    prompts, skipped = encode_prompts(engine, items, max_tokens)
    table, selection = split_for_selection(prompts) if len(cands) > 1 else (prompts, [])
    q_engine, qn = quantized_engine(engine, quant)
    engines = {"fp32": engine, qn: q_engine}
    makers = {t: {d: drafter_factory(d, eng, layers, draft_path) for d in dict.fromkeys(d for d, _ in cands)}
              for t, eng in engines.items()}  # one per drafter: a neural drafter is built (calibrated) once
    params = SamplingParams(temperature=0.0, seed=seed)
    picks, picked = pick_drafters(engines, makers, cands, selection, max_tokens, params, out, progress)
    settings = settings_for(qn)
    plain = drafter_factory(PLAIN.name, engine)
    runs = {key: (engines[target], makers[target][picks[target][0]] if spec else plain,
                  picks[target][1] if spec else 0)
            for key, _, target, spec in settings}
    _warm_up(list(runs.values()), table[0], max_tokens)

    by_setting: dict[str, list[RequestRecord]] = {key: [] for key, *_ in settings}
    total, done = len(table) * len(settings), 0
    side_by_side = SideBySide()
    for p in table:  # a prompt's four settings side by side, one round of each in turn
        if progress:
            progress(done, total, f"quant4 {p.category}: {len(settings)} settings side by side")
        records = side_by_side.run([
            (runs[key][0], p.ids, StreamArgs(drafter=runs[key][1](), gamma=runs[key][2], params=params,
                                             max_tokens=max_tokens, request_id=f"quant4|{p.id}|{key}"))
            for key, *_ in settings])
        for (key, _, target, _), rec in zip(settings, records):
            tag(rec, p, QUANT_EXPERIMENT, key, target=target)
            by_setting[key].append(rec)
        RunDir(out).append(records)
        done += len(settings)
    if progress:
        progress(done, total, "quant4 done")
    prompts = table
    drafter, gamma = picks["fp32"]

    result: dict[str, Any] = {
        **experiment_header(QUANT_EXPERIMENT, engine),
        "drafter": drafter,
        "gamma": gamma,
        "drafters": {t: {"drafter": c[0], "gamma": c[1], "label": candidate_label(*c)} for t, c in picks.items()},
        "selection": picked,
        "max_tokens": max_tokens,
        **greedy_prompt_fields(prompts, skipped),
        "drafter_note": " ".join(dict.fromkeys(drafter_note(d) for d, _ in picks.values())),
        "quant_dtype": q_engine.dtype,
        **four_way_summary(by_setting, [p.id for p in prompts], n_resamples, seed, qn,
                           {"fp32": engine.model.weight_bytes(), qn: q_engine.model.weight_bytes()},
                           {t: candidate_label(*c) for t, c in picks.items()}),
    }
    result["statements"] = statements(result)
    return RunDir(out).write_experiment(QUANT_JSON, result)
