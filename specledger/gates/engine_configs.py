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

What each engine enforces (read in its source; the validators re-implement it and raise
:class:`SpecLedgerError` with one line):

- vLLM (``vllm-project/vllm``): ``vllm/config/speculative.py`` ``SpeculativeConfig`` -- ``method`` is
  one of ``SpeculativeMethod`` (ngram, medusa, mlp_speculator, draft_model, suffix, custom_class,
  eagle, eagle3, mtp, dflash, dspark, ngram_gpu, extract_hidden_states; no layer-skip, no
  self-quantised draft); ``num_speculative_tokens`` > 0 (``Field(gt=0)``, ``_verify_args``); ngram:
  ``1 <= prompt_lookup_min <= prompt_lookup_max`` (``__post_init__``); draft_model / eagle / eagle3
  need ``model``. ``num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None``
  (dynamic speculative decoding, PR #32374 "[V1][Spec Decode] Add Dynamic SD"; absent from vLLM
  releases before it) is checked by ``vllm/v1/spec_decode/dynamic/utils.py``
  ``validate_and_normalize_dynamic_sd_schedule``: a non-empty list of 3-item
  ``[range_start, range_end, k]`` entries, ends > 0, ``start <= end``, ``k >= 0``, sorted by start
  with no overlap, the first starting at 1 (a dict such as ``{"1": 2, "16": 0}`` is rejected).
  ``build_dynamic_sd_schedule_lookup`` then fills gaps and the tail past the last range with the
  previous k and clamps every k to ``num_speculative_tokens``; so specledger adds two rules of its own
  (a schedule that means what it says): the ranges are contiguous and every k is
  ``<= num_speculative_tokens``.
- TensorRT-LLM (``NVIDIA/TensorRT-LLM``): ``tensorrt_llm/llmapi/llm_args.py``
  ``DecodingBaseConfig.validate_draft_len_schedule_and_sort`` -- keys ``>= 1``, values ``>= 0``,
  the smallest key's value equals ``max_draft_len`` and no value exceeds it; older releases
  required key 1 itself (``draft_len_schedule must include batch_size=1``), so specledger always
  writes key 1. ``draft_len_schedule`` and ``max_concurrency`` are mutually exclusive. Lookup
  (``tensorrt_llm/_torch/speculative/utils.py`` ``get_draft_len_for_batch_size``): a batch of size
  b uses the value of the first key ``>= b`` and 0 above the largest key -- exactly the
  ``(c_(i-1), c_i]`` rule above. (Releases before that change read keys as lower thresholds:
  check which your build has.) EAGLE configs need ``speculative_model`` and ``max_draft_len > 0``.
- SGLang (``sgl-project/sglang``): ``python/sglang/srt/server_args.py``
  ``ServerArgs._handle_speculative_decoding`` -- ``--speculative-algorithm`` in EAGLE, EAGLE3, NEXTN,
  STANDALONE, NGRAM, DFLASH; for EAGLE/EAGLE3/STANDALONE ``--speculative-eagle-topk`` and
  ``--speculative-num-draft-tokens`` only with ``--speculative-num-steps``, and with top-k 1 the
  draft-token count is ``num_steps + 1`` (SGLang rewrites any other value; specledger rejects it);
  NGRAM drafts ``--speculative-num-draft-tokens`` tokens (with bfs breadth 1, a chain). No
  per-batch-size schedule: the draft length is fixed per server.
- llama.cpp (``ggml-org/llama.cpp``): ``docs/speculative.md`` and ``common/arg.cpp`` --
  ``--spec-type`` in none, ngram-cache, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod (draftless);
  ``-md FILE`` a draft model; ``--draft-max N`` (default 16), ``--draft-min N <= N``; no
  per-batch-size schedule, no suffix-tree, layer-skip or EAGLE-head drafter in that release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specledger.errors import SpecLedgerError

#: batch sizes a config covers by default (vLLM V1 and SGLang defaults stay below it)
DEFAULT_MAX_LOAD = 1024
#: where a draft model or head checkpoint path goes when the caller does not know it
DRAFT_PLACEHOLDER = "DRAFT_MODEL_PATH"

Schedule = Mapping[int, "tuple[str, Any] | None"]

#: vllm/config/speculative.py ``SpeculativeMethod`` (+ the MTP aliases it rewrites to "mtp")
VLLM_METHODS = frozenset({"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle",
                          "eagle3", "extract_hidden_states", "mtp", "dflash", "dspark", "ngram_gpu"})
#: the SpeculativeConfig fields specledger may write (anything else is a typo here)
VLLM_KEYS = frozenset({"method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
                       "prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size", "quantization",
                       "max_model_len", "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
                       "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob"})
TRT_DECODING_TYPES = frozenset({"NGram", "DraftTarget", "Eagle", "Eagle3", "MTP", "Medusa", "Lookahead"})
SGLANG_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"})
LLAMA_CPP_SPEC_TYPES = frozenset({"none", "ngram-cache", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"})

_NO_ENGINE = {"layerskip": "layer-skip (early-exit) self-drafting",
              "quant-self": "the target's own int8 copy as the draft (specledger's in-process quantisation)"}


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
    on = {int(c): s for c, s in schedule.items() if s and s[0] and s[0] != "none" and s[1]}
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
    """vLLM ``speculative_config`` (or None) and its note; ``num_speculative_tokens`` is the largest k."""
    if drafter in _NO_ENGINE:
        return None, f"vLLM has no speculative method for {drafter} ({_NO_ENGINE[drafter]}); no vLLM config."
    top = max(k for _, _, k in ranges)
    cfg: dict[str, Any] = {"num_speculative_tokens": top}
    note = ""
    if drafter == "ngram":
        cfg.update(method="ngram", prompt_lookup_max=details.ngram_max, prompt_lookup_min=details.ngram_min)
    elif drafter == "suffix":
        cfg["method"] = "suffix"
        note = "vLLM suffix decoding needs arctic-inference and treats num_speculative_tokens as a cap. "
    elif drafter == "model":
        cfg.update(method="draft_model", model=details.model or DRAFT_PLACEHOLDER)
    elif drafter == "head":
        cfg.update(method="eagle3" if details.eagle3 else "eagle", model=details.model or DRAFT_PLACEHOLDER)
        note = ("the head maps to vLLM's EAGLE: point model at an EAGLE checkpoint for this target "
                "(specledger's head file is not in vLLM's format). ")
        if details.tree_budget:
            note += f"vLLM drafts a chain of {top} here, not the measured {details.tree_budget}-node tree. "
    else:
        return None, f"no vLLM method for drafter {drafter!r}."
    if cfg.get("model") == DRAFT_PLACEHOLDER:
        note += f"Replace {DRAFT_PLACEHOLDER}. "
    cfg["num_speculative_tokens_per_batch_size"] = [list(r) for r in ranges]
    if ranges[-1][2]:
        note += f"vLLM keeps k={ranges[-1][2]} above batch {ranges[-1][1]}: set --max-num-seqs {ranges[-1][1]}. "
    note += ("num_speculative_tokens_per_batch_size needs a vLLM with dynamic speculative decoding (PR #32374), "
             "ignored when data_parallel_size > 1.")
    return cfg, note


def trtllm_config(drafter: str, ranges: list[list[int]], details: DrafterDetails) -> tuple[dict | None, str]:
    """TensorRT-LLM ``speculative_config`` (``extra_llm_api_options``) with ``draft_len_schedule``
    ``{range end: k}`` (+ key 1), or None when the schedule's largest k is not at the smallest batch."""
    types = {"ngram": "NGram", "model": "DraftTarget", "head": "Eagle3"}
    if drafter not in types:
        why = _NO_ENGINE.get(drafter, "Arctic-style suffix trees" if drafter == "suffix" else drafter)
        return None, f"TensorRT-LLM has no drafter for {drafter} ({why}); no TensorRT-LLM config."
    top = max(k for _, _, k in ranges)
    if ranges[0][2] != top:
        return None, (f"TensorRT-LLM needs the largest draft length at the smallest batch (draft_len_schedule["
                      f"smallest] == max_draft_len); this schedule uses k={ranges[0][2]} at 1 and {top} later: "
                      "no TensorRT-LLM config.")
    last_on = max(i for i, r in enumerate(ranges) if r[2])
    sched = {1: ranges[0][2]}
    sched.update({end: k for _, end, k in ranges[: last_on + 1]})
    cfg: dict[str, Any] = {"decoding_type": types[drafter], "max_draft_len": top, "draft_len_schedule": sched}
    note = ("draft_len_schedule keys are upper ends (batch <= key), 0 above the largest "
            "(older releases read them as lower thresholds: check yours). ")
    if drafter == "ngram":
        cfg["max_matching_ngram_size"] = details.ngram_max
    else:
        cfg["speculative_model"] = details.model or DRAFT_PLACEHOLDER
        if cfg["speculative_model"] == DRAFT_PLACEHOLDER:
            note += f"Replace {DRAFT_PLACEHOLDER}. "
    if drafter == "head":
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
    if drafter in _NO_ENGINE or drafter == "suffix":
        why = _NO_ENGINE.get(drafter, "suffix-tree drafting")
        return None, f"SGLang has no algorithm for {drafter} ({why}); no SGLang flags."
    gamma, cap = _fixed_gamma(ranges)
    if drafter == "ngram":
        flags = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(gamma + 1),
                 "--speculative-ngram-max-bfs-breadth", "1",
                 "--speculative-ngram-min-match-window-size", str(details.ngram_min),
                 "--speculative-ngram-max-match-window-size", str(details.ngram_max)]
    elif drafter in ("model", "head"):
        algo = "STANDALONE" if drafter == "model" else ("EAGLE3" if details.eagle3 else "EAGLE")
        topk = details.tree_topk if drafter == "head" and details.tree_budget and details.tree_topk else 1
        tokens = details.tree_budget + 1 if topk > 1 else gamma + 1
        flags = ["--speculative-algorithm", algo, "--speculative-draft-model-path", details.model or DRAFT_PLACEHOLDER,
                 "--speculative-num-steps", str(gamma), "--speculative-eagle-topk", str(topk),
                 "--speculative-num-draft-tokens", str(tokens)]
    else:
        return None, f"no SGLang algorithm for drafter {drafter!r}."
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
    """``llama-server`` flags: ngram-simple or a GGUF draft model, draft length fixed per server."""
    gamma, cap = _fixed_gamma(ranges)
    if drafter == "ngram":
        flags = ["--spec-type", "ngram-simple", "--spec-ngram-size-n", str(details.ngram_max),
                 "--spec-ngram-size-m", str(gamma), "--draft-max", str(gamma), "--draft-min", "0"]
        note = (f"ngram-simple matches one n-gram length "
                f"(specledger's backs off {details.ngram_max}→{details.ngram_min}). ")
    elif drafter == "model":
        flags = ["-md", details.model or DRAFT_PLACEHOLDER, "--draft-max", str(gamma), "--draft-min", "0"]
        note = "-md takes a GGUF draft model with the target's vocabulary. "
    else:
        why = _NO_ENGINE.get(drafter, {"suffix": "suffix-tree drafting", "head": "an EAGLE head"}.get(drafter, drafter))
        return None, f"llama.cpp llama-server has no drafter for {drafter} ({why}); no llama.cpp flags."
    flags += ["--parallel", str(cap)] if cap else []
    note += f"Draft length fixed per server (γ={gamma})"
    note += f"; --parallel {cap} keeps it to loads 1–{cap}, where speculation paid." if cap else "."
    if DRAFT_PLACEHOLDER in flags:
        note += f" Replace {DRAFT_PLACEHOLDER}."
    return flags, note


def engine_configs(schedule: Schedule, max_load: int | None = None, *, drafter: str | None = None,
                   prefer_load: int | None = None, details: DrafterDetails | None = None) -> dict[str, Any]:
    """Every engine's config for one deployment of ``schedule`` (module docstring: the rules).

    Returns ``drafter``, ``gamma_by_load`` ({load: k}), ``ranges`` ([[start, end, k]]),
    ``vllm`` ({"speculative_config": ...} or None), ``trtllm`` ({"speculative_config": ...} or None),
    ``sglang`` / ``llama_cpp`` (argv lists or None), ``notes`` (per engine) and ``note`` (one text:
    why a config is missing, what to replace, which loads another drafter decided). Every emitted
    config passes its validator (checked here)."""
    details = details or DrafterDetails()
    if not schedule:
        raise SpecLedgerError("an engine config needs a schedule with at least one load")
    drafter = drafter or pick_drafter(schedule, prefer_load)
    ks = gamma_by_load(schedule, drafter)
    ranges = batch_ranges(ks, max_load)
    out: dict[str, Any] = {"drafter": drafter, "gamma_by_load": ks, "ranges": ranges, "vllm": None,
                           "trtllm": None, "sglang": None, "llama_cpp": None, "notes": {}, "note": ""}
    others = sorted({str(s[0]) for s in schedule.values() if s and s[0] and s[0] != drafter and s[1]})
    policies = sorted({f"{s[0]} γ={s[1]}" for s in schedule.values() if s and s[0] == drafter and not _int(s[1])})
    lead = ([f"one drafter per deployment: loads using {', '.join(others)} are off here"] if others else []) + \
        ([f"{', '.join(policies)} is a γ policy no engine runs: off here"] if policies else [])
    if drafter is None or not any(k for _, _, k in ranges):
        out["note"] = "; ".join(lead + ["speculation is off at every load: launch every engine without it"])
        return out
    for key, write, check in (("vllm", vllm_config, validate_vllm), ("trtllm", trtllm_config, validate_trtllm),
                              ("sglang", sglang_flags, validate_sglang), ("llama_cpp", llama_cpp_flags,
                                                                          validate_llama_cpp)):
        body, note = write(drafter, ranges, details)
        if body is not None:
            check(body)
            out[key] = {"speculative_config": body} if key in ("vllm", "trtllm") else body
        out["notes"][key] = note
    names = {"vllm": "vLLM", "trtllm": "TensorRT-LLM", "sglang": "SGLang", "llama_cpp": "llama.cpp"}
    out["note"] = " ".join([s + "." for s in lead] + [f"{names[k]}: {v}" for k, v in out["notes"].items() if v])
    return out


# -------------------------------------------------------------------------------------- validators
def _fail(msg: str) -> None:
    raise SpecLedgerError(msg)


def validate_vllm(cfg: Mapping[str, Any]) -> None:
    """vLLM ``speculative_config`` rules (module docstring; ``SpeculativeConfig.__post_init__`` /
    ``_verify_args`` and ``validate_and_normalize_dynamic_sd_schedule``), plus specledger's two:
    contiguous ranges and every k <= ``num_speculative_tokens``. Accepts the dict or
    ``{"speculative_config": dict}``."""
    if isinstance(cfg, Mapping) and set(cfg) == {"speculative_config"}:
        cfg = cfg["speculative_config"]
    if not isinstance(cfg, Mapping):
        _fail("vLLM speculative_config must be a JSON object")
    extra = sorted(set(cfg) - VLLM_KEYS)
    if extra:
        _fail(f"vLLM speculative_config: unknown key(s) {', '.join(extra)}")
    method = cfg.get("method")
    if method not in VLLM_METHODS:
        _fail(f"vLLM speculative_config: method {method!r} is not a vLLM speculative method")
    n = cfg.get("num_speculative_tokens")
    if not _int(n) or n <= 0:
        _fail(f"vLLM speculative_config: num_speculative_tokens must be an integer > 0, got {n!r}")
    if method in ("ngram", "ngram_gpu"):
        lo, hi = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
        lo, hi = (lo if lo is not None else hi), (hi if hi is not None else lo)
        if lo is not None and (not _int(lo) or not _int(hi) or lo < 1 or lo > hi):
            _fail(f"vLLM ngram: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {lo!r}, {hi!r}")
    if method in ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "dflash") and not cfg.get("model"):
        _fail(f"vLLM method {method} needs model (the draft / head checkpoint)")
    sched = cfg.get("num_speculative_tokens_per_batch_size")
    if sched is None:
        return
    if not isinstance(sched, list) or not sched:
        _fail("vLLM num_speculative_tokens_per_batch_size must be a non-empty list of [range_start, range_end, k]")
    rows = []
    for e in sched:
        if not isinstance(e, (list, tuple)) or len(e) != 3 or not all(_int(x) for x in e):
            _fail(f"vLLM num_speculative_tokens_per_batch_size: entry {e!r} is not [range_start, range_end, k]")
        a, b, k = e
        if a <= 0 or b <= 0 or a > b or k < 0:
            _fail(f"vLLM num_speculative_tokens_per_batch_size: entry {list(e)} needs 0 < start <= end and k >= 0")
        if k > n:
            _fail(f"vLLM num_speculative_tokens_per_batch_size: k={k} > num_speculative_tokens={n} (vLLM clamps it)")
        rows.append((a, b, k))
    rows.sort()
    prev = 0
    for a, b, _ in rows:
        if a <= prev:
            _fail("vLLM num_speculative_tokens_per_batch_size: ranges overlap")
        if a != prev + 1:
            _fail(f"vLLM num_speculative_tokens_per_batch_size: batch sizes {prev + 1}–{a - 1} are in no range"
                  if prev else "vLLM num_speculative_tokens_per_batch_size: the first range must start at 1")
        prev = b


def _key_int(key: Any) -> int:
    if _int(key):
        return key
    if isinstance(key, str) and key.isdigit():
        return int(key)
    _fail(f"TensorRT-LLM draft_len_schedule: key {key!r} is not a batch size")
    return 0


def validate_trtllm(cfg: Mapping[str, Any]) -> None:
    """TensorRT-LLM rules (module docstring; ``validate_draft_len_schedule_and_sort``): keys >= 1
    (digit strings allowed, as JSON writes them), values >= 0, key 1 present and equal to
    ``max_draft_len``, the smallest key equal to it, no value above it; not with ``max_concurrency``.
    Accepts the dict or ``{"speculative_config": dict}``."""
    if isinstance(cfg, Mapping) and set(cfg) == {"speculative_config"}:
        cfg = cfg["speculative_config"]
    if not isinstance(cfg, Mapping):
        _fail("TensorRT-LLM speculative_config must be a mapping")
    kind = cfg.get("decoding_type")
    if kind not in TRT_DECODING_TYPES:
        _fail(f"TensorRT-LLM decoding_type {kind!r} is not one of {', '.join(sorted(TRT_DECODING_TYPES))}")
    top = cfg.get("max_draft_len")
    if not _int(top) or top < 0 or (kind in ("Eagle", "Eagle3") and top == 0):
        _fail(f"TensorRT-LLM max_draft_len must be a non-negative integer (> 0 for Eagle), got {top!r}")
    if kind in ("DraftTarget", "Eagle", "Eagle3") and not cfg.get("speculative_model"):
        _fail(f"TensorRT-LLM {kind} needs speculative_model")
    sched = cfg.get("draft_len_schedule")
    if sched is None:
        return
    if cfg.get("max_concurrency") is not None:
        _fail("TensorRT-LLM: max_concurrency and draft_len_schedule are mutually exclusive")
    if not isinstance(sched, Mapping) or not sched:
        _fail("TensorRT-LLM draft_len_schedule must be a non-empty {batch size: draft length} mapping")
    table = {}
    for key, val in sched.items():
        b = _key_int(key)
        if b < 1:
            _fail(f"TensorRT-LLM draft_len_schedule: batch size threshold must be >= 1, got {b}")
        if not _int(val) or val < 0:
            _fail(f"TensorRT-LLM draft_len_schedule: draft length must be an integer >= 0, got {val!r}")
        if val > top:
            _fail(f"TensorRT-LLM draft_len_schedule: draft length {val} at {b} exceeds max_draft_len={top}")
        table[b] = val
    if 1 not in table:
        _fail("TensorRT-LLM draft_len_schedule must include batch size 1")
    if table[1] != top:
        _fail(f"TensorRT-LLM draft_len_schedule[1] = {table[1]} must equal max_draft_len = {top}")


def _pairs(flags: Sequence[str], engine: str, bare: frozenset[str] = frozenset()) -> dict[str, str]:
    if isinstance(flags, str) or not all(isinstance(f, str) for f in flags):
        _fail(f"{engine} flags must be a list of strings")
    out: dict[str, str] = {}
    i = 0
    while i < len(flags):
        flag = flags[i]
        if not flag.startswith("-"):
            _fail(f"{engine} flags: {flag!r} is not a flag")
        if flag in out:
            _fail(f"{engine} flags: {flag} given twice")
        if flag in bare:
            out[flag] = ""
            i += 1
            continue
        if i + 1 >= len(flags) or flags[i + 1].startswith("--"):
            _fail(f"{engine} flags: {flag} needs a value")
        out[flag] = flags[i + 1]
        i += 2
    return out


def _pos(pairs: Mapping[str, str], flag: str, engine: str, low: int = 1) -> int | None:
    if flag not in pairs:
        return None
    val = pairs[flag]
    if not val.lstrip("-").isdigit() or int(val) < low:
        _fail(f"{engine} {flag} must be an integer >= {low}, got {val!r}")
    return int(val)


def validate_sglang(flags: Sequence[str]) -> None:
    """SGLang launch-flag rules (module docstring; ``ServerArgs._handle_speculative_decoding``)."""
    p = _pairs(flags, "SGLang")
    algo = p.get("--speculative-algorithm")
    if algo not in SGLANG_ALGORITHMS:
        _fail(f"SGLang --speculative-algorithm {algo!r} is not one of {', '.join(sorted(SGLANG_ALGORITHMS))}")
    steps = _pos(p, "--speculative-num-steps", "SGLang")
    topk = _pos(p, "--speculative-eagle-topk", "SGLang")
    tokens = _pos(p, "--speculative-num-draft-tokens", "SGLang")
    _pos(p, "--max-running-requests", "SGLang")
    if algo in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"):
        if steps is None and (topk is not None or tokens is not None):
            _fail("SGLang: --speculative-eagle-topk / --speculative-num-draft-tokens need --speculative-num-steps")
        if algo == "STANDALONE" and not p.get("--speculative-draft-model-path"):
            _fail("SGLang STANDALONE needs --speculative-draft-model-path")
        if steps is not None and topk == 1 and tokens is not None and tokens != steps + 1:
            _fail(f"SGLang: with --speculative-eagle-topk 1, --speculative-num-draft-tokens must be "
                  f"num_steps + 1 = {steps + 1}, got {tokens}")
    if algo == "NGRAM":
        lo = _pos(p, "--speculative-ngram-min-match-window-size", "SGLang")
        hi = _pos(p, "--speculative-ngram-max-match-window-size", "SGLang")
        _pos(p, "--speculative-ngram-max-bfs-breadth", "SGLang")
        if lo is not None and hi is not None and lo > hi:
            _fail(f"SGLang NGRAM: min match window {lo} > max match window {hi}")


def validate_llama_cpp(flags: Sequence[str]) -> None:
    """``llama-server`` speculative-flag rules (module docstring; ``docs/speculative.md``)."""
    p = _pairs(flags, "llama.cpp")
    kind = p.get("--spec-type")
    draft = p.get("-md") or p.get("--model-draft")
    if kind is not None and kind not in LLAMA_CPP_SPEC_TYPES:
        _fail(f"llama.cpp --spec-type {kind!r} is not one of {', '.join(sorted(LLAMA_CPP_SPEC_TYPES))}")
    if (kind in (None, "none")) and not draft:
        _fail("llama.cpp: speculative decoding needs -md DRAFT.gguf or a --spec-type other than none")
    top = _pos(p, "--draft-max", "llama.cpp")
    low = _pos(p, "--draft-min", "llama.cpp", low=0)
    if top is not None and low is not None and low > top:
        _fail(f"llama.cpp --draft-min {low} > --draft-max {top}")
    for flag in ("--spec-ngram-size-n", "--spec-ngram-size-m", "--parallel"):
        _pos(p, flag, "llama.cpp")
