"""Engine configs from a per-load schedule: the one writer of every vLLM, TensorRT-LLM, SGLang and
llama.cpp snippet specledger prints (pure Python, no torch).

Input: ``{load: (drafter, gamma) or None}`` -- the setting decided at each measured (or simulated)
load, ``None`` (or gamma 0) meaning off there -- plus the largest load to cover (``max_load``).

One drafter per deployment: every engine loads one drafter at start-up, so loads whose setting uses
another drafter (or a γ policy rather than a number) are off (k = 0) in the configs, and the note says
so. :func:`pick_drafter` keeps the drafter of the preferred (target) load, else of the lowest load
that deploys one.

Loads between measured points (the rule every engine config below follows): with measured loads
``c_1 < ... < c_n``, the measurement at ``c_i`` decides every batch size in ``(c_(i-1), c_i]``
(``c_0 = 0``): a range is decided by its *larger* end, the conservative end when the speed-up falls
with load (it does on every measured curve: more requests per step leave less idle compute for the
draft); batch sizes above ``c_n`` are off (k = 0) -- nothing was measured there. Adjacent ranges of
equal k are merged. ``k(b) = k(min{c_i : c_i >= b})`` for ``b <= c_n``, else 0.

What each engine enforces, and which version's schema each config follows, is in
:mod:`specledger.gates.engine_validators` (:data:`~specledger.gates.engine_validators.SCHEMA_VERSIONS`); every
emitted config passes its validator. The forms: vLLM the JSON value ``vllm serve --speculative-config``
takes (``method``, ``num_speculative_tokens``, ``num_speculative_tokens_per_batch_size`` as
``[[start, end, k], ...]``); TensorRT-LLM ``{"speculative_config": {...}}`` as its
``--extra_llm_api_options`` file holds it (``draft_len_schedule`` ``{range end: k}`` plus key 1, read
"batch <= key", 0 above the largest); SGLang and llama.cpp the server's argv words (one draft length per
server, ``--max-running-requests`` / ``--parallel`` cap the loads where speculation paid).

llama.cpp (``llama-server`` of llama-cpp-python 0.3.36's llama.cpp): the n-gram drafter is
``--spec-type ngram-simple --spec-ngram-simple-size-n N --spec-ngram-simple-size-m γ`` (``size-m`` is
ngram-simple's draft length), a draft model ``--spec-type draft-simple -md FILE --spec-draft-n-max γ``,
the head ``--spec-type draft-eagle3 -md FILE --spec-draft-n-max γ`` (an EAGLE-3 GGUF). No suffix-tree,
layer-skip or self-quantised drafter there. Given the flags a binary's ``--help`` offers
(``llama_flags``), a config using a flag that binary lacks is not emitted and the note names the flag.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specledger.engine.drafters import catalog
from specledger.engine.drafters.catalog import HEAD, MODEL, NGRAM, PLAIN, SUFFIX, EngineMethod
from specledger.errors import SpecLedgerError
from specledger.gates.engine_validators import (  # noqa: F401  (re-exported: the validators' one home is there)
    LLAMA_CPP_SPEC_TYPES,
    SCHEMA_VERSIONS,
    SGLANG_ALGORITHMS,
    TRT_DECODING_TYPES,
    VLLM_KEYS,
    VLLM_METHODS,
    help_flags,
    unknown_flags,
    validate_llama_cpp,
    validate_sglang,
    validate_trtllm,
    validate_vllm,
)

#: batch sizes a config covers by default (vLLM V1 and SGLang defaults stay below it)
DEFAULT_MAX_LOAD = 1024
#: where a draft model or head checkpoint path goes when the caller does not know it
DRAFT_PLACEHOLDER = "DRAFT_MODEL_PATH"

Schedule = Mapping[int, "tuple[str, Any] | None"]


def _method(drafter: str, engine: str) -> EngineMethod:
    """``drafter``'s method in ``engine`` (a key of :data:`WRITERS`) from its catalog entry; an unknown
    drafter (a probe label) has none and no reason to state."""
    spec = catalog.find(drafter)
    return spec.serving.of(engine) if spec is not None else EngineMethod()


@dataclass(frozen=True)
class DrafterDetails:
    """What a config needs beyond (drafter, γ). ``model``: the draft model (``model``) or EAGLE
    checkpoint (``head``) path, else :data:`DRAFT_PLACEHOLDER`; ``eagle3``: the head checkpoint is
    EAGLE-3 (specledger's own head reads the final hidden state: EAGLE-1 style); ``tree_budget`` /
    ``tree_topk``: head token trees (0: chains); ``ngram_min``/``ngram_max``: the n-gram drafter's
    match lengths (specledger's are 1..3)."""

    model: str | None = None
    eagle3: bool = False
    tree_budget: int = 0
    tree_topk: int | None = None
    ngram_min: int = 1
    ngram_max: int = 3


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def pick_drafter(schedule: Schedule, prefer_load: int | None = None) -> str | None:
    """The deployment's one drafter: the preferred load's if it deploys one, else the lowest load's."""
    on = {int(c): s for c, s in schedule.items() if s and s[0] and s[0] != PLAIN.name and s[1]}
    if prefer_load is not None and prefer_load in on:
        return on[prefer_load][0]
    return on[min(on)][0] if on else None


def gamma_by_load(schedule: Schedule, drafter: str | None) -> dict[int, int]:
    """``{load: k}`` over every scheduled load: γ where the setting uses ``drafter`` with an integer
    γ > 0, else 0 (off, another drafter, or a γ policy no engine can express)."""
    out = {}
    for c in sorted(int(c) for c in schedule):
        s = schedule[c]
        out[c] = int(s[1]) if s and s[0] == drafter and _int(s[1]) and s[1] > 0 else 0
    return out


def batch_ranges(k_by_load: Mapping[int, int], max_load: int | None = None) -> list[list[int]]:
    """``{c_i: k_i}`` -> ``[[start, end, k], ...]`` covering ``1..max_load`` (default
    ``max(DEFAULT_MAX_LOAD, c_n + 1)``): ``(c_(i-1), c_i]`` takes ``k_i``, batch sizes above ``c_n``
    take 0, adjacent equal k merged. Contiguous from 1 (the module docstring's rule)."""
    loads = sorted(int(c) for c in k_by_load)
    if not loads or loads[0] < 1:
        raise SpecLedgerError("a batch-size schedule needs at least one load >= 1")
    top = max(DEFAULT_MAX_LOAD, loads[-1] + 1) if max_load is None else int(max_load)
    if top < 1:
        raise SpecLedgerError(f"max_load must be >= 1, got {max_load}")
    rows: list[list[int]] = []
    start = 1
    for c in loads + [top]:
        end = min(c, top)
        if end >= start:
            k = int(k_by_load[c]) if c in k_by_load and c <= loads[-1] else 0
            if rows and rows[-1][2] == k:
                rows[-1][1] = end
            else:
                rows.append([start, end, k])
            start = end + 1
        if start > top:
            break
    return rows


# ----------------------------------------------------------------------------------------- writers
def vllm_config(drafter: str, ranges: list[list[int]], details: DrafterDetails) -> tuple[dict | None, str]:
    """The value of ``vllm serve --speculative-config`` (or None) and its note; ``num_speculative_tokens``
    is the largest k."""
    way = _method(drafter, "vllm")
    if way.lacking:
        return None, f"vLLM has no speculative method for {drafter} ({way.lacking}); no vLLM config."
    if way.method is None:
        return None, f"no vLLM method for drafter {drafter!r}."
    top = max(k for _, _, k in ranges)
    cfg: dict[str, Any] = {"num_speculative_tokens": top, "method": way.name_for(details.eagle3)}
    note = ""
    if drafter == NGRAM.name:
        cfg.update(prompt_lookup_max=details.ngram_max, prompt_lookup_min=details.ngram_min)
    elif drafter == SUFFIX.name:
        note = "vLLM suffix decoding needs arctic-inference and treats num_speculative_tokens as a cap. "
    else:  # a draft model or head: its checkpoint
        cfg["model"] = details.model or DRAFT_PLACEHOLDER
    if drafter == HEAD.name:
        note = ("the head maps to vLLM's EAGLE: point model at an EAGLE checkpoint for this target "
                "(specledger's head file is not in vLLM's format). ")
        if details.tree_budget:
            note += f"vLLM drafts a chain of {top} here, not the measured {details.tree_budget}-node tree. "
    if cfg.get("model") == DRAFT_PLACEHOLDER:
        note += f"Replace {DRAFT_PLACEHOLDER}. "
    cfg["num_speculative_tokens_per_batch_size"] = [list(r) for r in ranges]
    if ranges[-1][2]:
        note += f"vLLM keeps k={ranges[-1][2]} above batch {ranges[-1][1]}: set --max-num-seqs {ranges[-1][1]}. "
    note += ("pass it as --speculative-config '<this JSON>'; num_speculative_tokens_per_batch_size needs vLLM "
             ">= 0.24.0 (dynamic speculative decoding, PR #32374; its docs run it with VLLM_USE_V2_MODEL_RUNNER=0), "
             "ignored when data_parallel_size > 1.")
    return cfg, note


def trtllm_config(drafter: str, ranges: list[list[int]], details: DrafterDetails) -> tuple[dict | None, str]:
    """TensorRT-LLM ``speculative_config`` (``extra_llm_api_options``) with ``draft_len_schedule``
    ``{range end: k}`` (+ key 1), or None when the schedule's largest k is not at the smallest batch."""
    way = _method(drafter, "trtllm")
    if way.method is None:
        return None, f"TensorRT-LLM has no drafter for {drafter} ({way.lacking or drafter}); no TensorRT-LLM config."
    top = max(k for _, _, k in ranges)
    if ranges[0][2] != top:
        return None, (f"TensorRT-LLM needs the largest draft length at the smallest batch (draft_len_schedule["
                      f"smallest] == max_draft_len); this schedule uses k={ranges[0][2]} at 1 and {top} later: "
                      "no TensorRT-LLM config.")
    last_on = max(i for i, r in enumerate(ranges) if r[2])
    sched = {1: ranges[0][2]}
    sched.update({end: k for _, end, k in ranges[: last_on + 1]})
    cfg: dict[str, Any] = {"decoding_type": way.method, "max_draft_len": top, "draft_len_schedule": sched}
    note = ("draft_len_schedule keys are upper ends (batch <= key), 0 above the largest "
            "(older releases read them as lower thresholds: check yours). ")
    if drafter == NGRAM.name:
        cfg["max_matching_ngram_size"] = details.ngram_max
    else:
        cfg["speculative_model"] = details.model or DRAFT_PLACEHOLDER
        if cfg["speculative_model"] == DRAFT_PLACEHOLDER:
            note += f"Replace {DRAFT_PLACEHOLDER}. "
    if drafter == HEAD.name:
        note += "Eagle3 needs an EAGLE-3 checkpoint for this target (specledger's head file is not one)."
    return cfg, note.strip()


def _fixed_gamma(ranges: list[list[int]]) -> tuple[int, int]:
    """(γ, cap): the k of the first range that is on, and the last batch size of the on-run from 1."""
    first = next(r for r in ranges if r[2])
    cap = 0
    for start, end, k in ranges:
        if k == 0 or start != cap + 1:
            break
        cap = end
    return first[2], cap


def sglang_flags(drafter: str, ranges: list[list[int]], details: DrafterDetails) -> tuple[list[str] | None, str]:
    """SGLang launch flags (fixed draft length per server) and the ``--max-running-requests`` cap advice."""
    way = _method(drafter, "sglang")
    if way.lacking:
        return None, f"SGLang has no algorithm for {drafter} ({way.lacking}); no SGLang flags."
    gamma, cap = _fixed_gamma(ranges)
    algo = way.name_for(details.eagle3)
    if algo is None:
        return None, f"no SGLang algorithm for drafter {drafter!r}."
    if drafter == NGRAM.name:
        flags = ["--speculative-algorithm", algo, "--speculative-num-draft-tokens", str(gamma + 1),
                 "--speculative-ngram-max-bfs-breadth", "1",
                 "--speculative-ngram-min-match-window-size", str(details.ngram_min),
                 "--speculative-ngram-max-match-window-size", str(details.ngram_max)]
    else:  # a draft model or head
        topk = details.tree_topk if drafter == HEAD.name and details.tree_budget and details.tree_topk else 1
        tokens = details.tree_budget + 1 if topk > 1 else gamma + 1
        flags = ["--speculative-algorithm", algo, "--speculative-draft-model-path", details.model or DRAFT_PLACEHOLDER,
                 "--speculative-num-steps", str(gamma), "--speculative-eagle-topk", str(topk),
                 "--speculative-num-draft-tokens", str(tokens)]
    note = f"draft length fixed per server (γ={gamma}; the draft-token count includes the last verified token). "
    if cap:
        flags += ["--max-running-requests", str(cap)]
        note += f"--max-running-requests {cap} keeps it to loads 1–{cap}, where speculation paid; serve more plainly."
    else:
        note += "Off at batch size 1: run it only where the load stays in its on-range."
    if DRAFT_PLACEHOLDER in flags:
        note += f" Replace {DRAFT_PLACEHOLDER}."
    return flags, note


def llama_cpp_flags(drafter: str, ranges: list[list[int]], details: DrafterDetails) -> tuple[list[str] | None, str]:
    """``llama-server`` flags (module docstring): ngram-simple, a GGUF draft model (draft-simple) or an
    EAGLE-3 GGUF head (draft-eagle3); one draft length per server, ``--parallel`` capping the on-loads."""
    gamma, cap = _fixed_gamma(ranges)
    way = _method(drafter, "llama_cpp")
    if way.method is None:
        why = way.lacking or drafter
        return None, f"llama.cpp llama-server has no drafter for {drafter} ({why}); no llama.cpp flags."
    if drafter == NGRAM.name:
        flags = ["--spec-type", way.method, "--spec-ngram-simple-size-n", str(details.ngram_max),
                 "--spec-ngram-simple-size-m", str(gamma)]
        note = (f"ngram-simple matches one n-gram length "
                f"(specledger's backs off {details.ngram_max}→{details.ngram_min}); --spec-ngram-simple-size-m is "
                "its draft length. ")
    else:  # a draft model or head
        flags = ["--spec-type", way.method, "-md", details.model or DRAFT_PLACEHOLDER, "--spec-draft-n-max", str(gamma),
                 "--spec-draft-n-min", "0"]
        note = ("-md takes a GGUF draft model with the target's vocabulary. " if drafter == MODEL.name else
                "the head maps to llama.cpp's draft-eagle3: -md takes an EAGLE-3 GGUF for this target "
                "(specledger's head file is not one). ")
    flags += ["--parallel", str(cap)] if cap else []
    note += f"Draft length fixed per server (γ={gamma})"
    note += f"; --parallel {cap} keeps it to loads 1–{cap}, where speculation paid." if cap else "."
    if DRAFT_PLACEHOLDER in flags:
        note += f" Replace {DRAFT_PLACEHOLDER}."
    return flags, note


def check_llama_flags(flags: list[str] | None, note: str, known: frozenset[str] | None) -> tuple[list[str] | None, str]:
    """``(flags, note)`` unchanged when ``known`` is None (no binary at hand) or offers every flag, else
    ``(None, why)``: a flag this ``llama-server``'s ``--help`` lacks would stop it at start-up."""
    missing = unknown_flags(flags or [], known) if known is not None and flags else []
    if not missing:
        return flags, note
    return None, (f"this llama-server's --help lacks {', '.join(missing)}: no llama.cpp flags (they follow "
                  f"{SCHEMA_VERSIONS['llama_cpp']}; build it with scripts/build_llama_server.sh).")


WRITERS = (("vllm", vllm_config, validate_vllm), ("trtllm", trtllm_config, validate_trtllm),
           ("sglang", sglang_flags, validate_sglang), ("llama_cpp", llama_cpp_flags, validate_llama_cpp))
ENGINE_NAMES = {"vllm": "vLLM", "trtllm": "TensorRT-LLM", "sglang": "SGLang", "llama_cpp": "llama.cpp"}


def engine_configs(schedule: Schedule, max_load: int | None = None, *, drafter: str | None = None,
                   prefer_load: int | None = None, details: DrafterDetails | None = None,
                   llama_flags: frozenset[str] | None = None) -> dict[str, Any]:
    """Every engine's config for one deployment of ``schedule`` (module docstring: the rules).

    Returns ``drafter``, ``gamma`` (the draft length a one-γ server runs: the first on-range's k, as
    SGLang and llama.cpp get it; 0 when off), ``gamma_by_load``
    ({load: k}), ``ranges`` ([[start, end, k]]), ``vllm`` (the ``--speculative-config`` value or None),
    ``trtllm`` ({"speculative_config": ...} or None), ``sglang`` / ``llama_cpp`` (argv lists or None),
    ``versions`` (the engine version each schema follows), ``notes`` (per engine) and ``note`` (one text:
    why a config is missing, what to replace, which loads another drafter decided). Every emitted config
    passes its validator (checked here); ``llama_flags`` (the flags a llama-server's ``--help`` offers,
    :func:`specledger.gates.engine_validators.help_flags`) drops llama.cpp flags that binary lacks."""
    details = details or DrafterDetails()
    if not schedule:
        raise SpecLedgerError("an engine config needs a schedule with at least one load")
    drafter = drafter or pick_drafter(schedule, prefer_load)
    ks = gamma_by_load(schedule, drafter)
    ranges = batch_ranges(ks, max_load)
    on = any(k for _, _, k in ranges)
    out: dict[str, Any] = {"drafter": drafter, "gamma": _fixed_gamma(ranges)[0] if on else 0, "gamma_by_load": ks,
                           "ranges": ranges, "vllm": None, "trtllm": None, "sglang": None, "llama_cpp": None,
                           "versions": dict(SCHEMA_VERSIONS), "notes": {}, "note": ""}
    others = sorted({str(s[0]) for s in schedule.values() if s and s[0] and s[0] != drafter and s[1]})
    policies = sorted({f"{s[0]} γ={s[1]}" for s in schedule.values() if s and s[0] == drafter and not _int(s[1])})
    lead = ([f"one drafter per deployment: loads using {', '.join(others)} are off here"] if others else []) + \
        ([f"{', '.join(policies)} is a γ policy no engine runs: off here"] if policies else [])
    if drafter is None or not on:
        out["note"] = "; ".join(lead + ["speculation is off at every load: launch every engine without it"])
        return out
    for key, write, check in WRITERS:
        body, note = write(drafter, ranges, details)
        if key == "llama_cpp":
            body, note = check_llama_flags(body, note, llama_flags)
        if body is not None:
            check(body)
            out[key] = {"speculative_config": body} if key == "trtllm" else body
        out["notes"][key] = note
    out["note"] = " ".join([s + "." for s in lead] + [f"{ENGINE_NAMES[k]}: {v}" for k, v in out["notes"].items() if v])
    return out
