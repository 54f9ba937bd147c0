"""The rules each engine's own config code enforces, re-implemented (pure Python): every config
:mod:`specledger.gates.engine_configs` writes passes its validator before it is emitted, and a form the
engine rejects raises :class:`SpecLedgerError` with one line. Also what a ``llama-server --help`` says
it accepts (:func:`help_flags`), so flags can be checked against the very binary that will run them.

The schema each validator follows (:data:`SCHEMA_VERSIONS`, printed with every config):

- vLLM: the value of ``vllm serve --speculative-config`` (``vllm/config/speculative.py``
  ``SpeculativeConfig``), with ``num_speculative_tokens_per_batch_size`` from dynamic speculative
  decoding (``vllm/v1/spec_decode/dynamic/utils.py`` ``validate_and_normalize_dynamic_sd_schedule``;
  documented from vLLM 0.24.0, ``docs/features/speculative_decoding/dynamic_speculative_decoding.md``).
- TensorRT-LLM: ``speculative_config`` of ``--extra_llm_api_options`` (``tensorrt_llm/llmapi/llm_args.py``
  ``DecodingBaseConfig``; ``draft_len_schedule`` keys as upper ends since PR #10860, March 2026).
- SGLang: launch flags of ``python -m sglang.launch_server`` (``python/sglang/srt/server_args.py``, 0.5.9).
- llama.cpp: ``llama-server`` flags of the llama.cpp vendored in llama-cpp-python 0.3.36 (``common/arg.cpp``,
  ``common/speculative.cpp``): ``--spec-type`` names, ``--spec-draft-n-max/-n-min`` for draft models,
  ``--spec-ngram-simple-size-n/-m`` for ngram-simple (``size-m`` is its draft length); the older
  ``--draft-max``, ``--draft-min``, ``--spec-ngram-size-n/-m`` are removed there (the server exits).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specledger.errors import SpecLedgerError

#: the engine version (and source) whose schema each writer and validator follows
SCHEMA_VERSIONS = {
    "vllm": "vLLM >= 0.24.0 (vllm/config/speculative.py SpeculativeConfig, dynamic speculative decoding)",
    "trtllm": "TensorRT-LLM after PR #10860 (tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig.draft_len_schedule)",
    "sglang": "SGLang 0.5.9 (python/sglang/srt/server_args.py)",
    "llama_cpp": "llama.cpp as vendored in llama-cpp-python 0.3.36 (common/arg.cpp; scripts/build_llama_server.sh)",
}

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
#: common/speculative.cpp's type names (``--spec-type`` takes a comma-separated list of them)
LLAMA_CPP_SPEC_TYPES = frozenset({"none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash",
                                  "draft-dspark", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
                                  "ngram-cache"})
#: the types that run a draft model (``-md``)
LLAMA_CPP_DRAFT_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})
#: flags that llama-server 0.3.36 still lists but rejects ("the argument has been removed"), and what replaced them
LLAMA_CPP_REMOVED = {"--draft": "--spec-draft-n-max", "--draft-n": "--spec-draft-n-max",
                     "--draft-max": "--spec-draft-n-max", "--draft-min": "--spec-draft-n-min",
                     "--draft-n-min": "--spec-draft-n-min", "--spec-ngram-size-n": "--spec-ngram-simple-size-n",
                     "--spec-ngram-size-m": "--spec-ngram-simple-size-m",
                     "--spec-ngram-min-hits": "--spec-ngram-simple-min-hits"}
LLAMA_CPP_DRAFT_FLAGS = ("-md", "--spec-draft-model", "--model-draft")
#: integer flags and their ranges (common/arg.cpp)
LLAMA_CPP_RANGES = {"--spec-draft-n-max": (1, None), "--spec-draft-n-min": (0, None), "--parallel": (1, None),
                    "-np": (1, None), "--spec-ngram-simple-size-n": (1, 1024), "--spec-ngram-simple-size-m": (1, 1024),
                    "--spec-ngram-map-k-size-n": (1, 1024), "--spec-ngram-map-k-size-m": (1, 1024),
                    "--spec-ngram-mod-n-max": (0, 1024), "--spec-ngram-mod-n-min": (0, 1024)}


def _fail(msg: str) -> None:
    raise SpecLedgerError(msg)


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# -------------------------------------------------------------------------------------------- vLLM
def _vllm_schedule(sched: Any, n: int) -> None:
    """``num_speculative_tokens_per_batch_size``: vLLM's rules plus specledger's two (contiguous, k <= n)."""
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
    prev = 0
    for a, b, _ in sorted(rows):
        if a <= prev:
            _fail("vLLM num_speculative_tokens_per_batch_size: ranges overlap")
        if a != prev + 1:
            _fail(f"vLLM num_speculative_tokens_per_batch_size: batch sizes {prev + 1}–{a - 1} are in no range"
                  if prev else "vLLM num_speculative_tokens_per_batch_size: the first range must start at 1")
        prev = b


def validate_vllm(cfg: Mapping[str, Any]) -> None:
    """The value of ``vllm serve --speculative-config`` (a JSON object, never wrapped in
    ``{"speculative_config": ...}``): ``method`` one of ``SpeculativeMethod``; ``num_speculative_tokens``
    an integer > 0; ngram ``1 <= prompt_lookup_min <= prompt_lookup_max``; draft_model / eagle / eagle3 /
    medusa / mlp_speculator / dflash need ``model``; ``num_speculative_tokens_per_batch_size`` a non-empty
    list of ``[start, end, k]``, ``0 < start <= end``, ``k >= 0``, sorted, no overlap, the first at 1 --
    plus specledger's two: contiguous, and every k <= ``num_speculative_tokens`` (vLLM fills gaps with the
    previous k and clamps k silently)."""
    if not isinstance(cfg, Mapping):
        _fail("vLLM --speculative-config must be a JSON object")
    if set(cfg) == {"speculative_config"}:
        _fail('vLLM --speculative-config takes the config itself, not {"speculative_config": ...}')
    extra = sorted(set(cfg) - VLLM_KEYS)
    if extra:
        _fail(f"vLLM --speculative-config: unknown key(s) {', '.join(extra)}")
    method = cfg.get("method")
    if method not in VLLM_METHODS:
        _fail(f"vLLM --speculative-config: method {method!r} is not a vLLM speculative method")
    n = cfg.get("num_speculative_tokens")
    if not _int(n) or n <= 0:
        _fail(f"vLLM --speculative-config: num_speculative_tokens must be an integer > 0, got {n!r}")
    if method in ("ngram", "ngram_gpu"):
        lo, hi = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
        lo, hi = (lo if lo is not None else hi), (hi if hi is not None else lo)
        if lo is not None and (not _int(lo) or not _int(hi) or lo < 1 or lo > hi):
            _fail(f"vLLM ngram: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {lo!r}, {hi!r}")
    if method in ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "dflash") and not cfg.get("model"):
        _fail(f"vLLM method {method} needs model (the draft / head checkpoint)")
    if cfg.get("num_speculative_tokens_per_batch_size") is not None:
        _vllm_schedule(cfg["num_speculative_tokens_per_batch_size"], n)


# ------------------------------------------------------------------------------------ TensorRT-LLM
def _key_int(key: Any) -> int:
    if _int(key):
        return key
    if isinstance(key, str) and key.isdigit():
        return int(key)
    _fail(f"TensorRT-LLM draft_len_schedule: key {key!r} is not a batch size")
    return 0


def validate_trtllm(cfg: Mapping[str, Any]) -> None:
    """TensorRT-LLM rules (``validate_draft_len_schedule_and_sort``): keys >= 1 (digit strings allowed, as
    JSON writes them), values >= 0, key 1 present and equal to ``max_draft_len``, the smallest key equal
    to it, no value above it; not with ``max_concurrency``. Accepts the dict or ``{"speculative_config":
    dict}`` (the ``--extra_llm_api_options`` YAML form)."""
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


# ------------------------------------------------------------------------------- command-line flags
def flag_pairs(flags: Sequence[str], engine: str) -> dict[str, str]:
    """``["--a", "1", "--b", "x"]`` -> ``{"--a": "1", "--b": "x"}``; every flag takes one value, once."""
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
        if i + 1 >= len(flags) or flags[i + 1].startswith("--"):
            _fail(f"{engine} flags: {flag} needs a value")
        out[flag] = flags[i + 1]
        i += 2
    return out


def _pos(pairs: Mapping[str, str], flag: str, engine: str, low: int = 1, high: int | None = None) -> int | None:
    if flag not in pairs:
        return None
    val = pairs[flag]
    ok = val.lstrip("-").isdigit() and int(val) >= low and (high is None or int(val) <= high)
    if not ok:
        _fail(f"{engine} {flag} must be an integer >= {low}" + (f" and <= {high}" if high else "") + f", got {val!r}")
    return int(val)


def validate_sglang(flags: Sequence[str]) -> None:
    """SGLang launch-flag rules (``ServerArgs._handle_speculative_decoding``): the algorithm is known;
    EAGLE/EAGLE3/NEXTN/STANDALONE take top-k and draft tokens only with ``--speculative-num-steps``, with
    top-k 1 the draft-token count is ``num_steps + 1``; STANDALONE needs a draft model; NGRAM's match
    window min <= max."""
    p = flag_pairs(flags, "SGLang")
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
    """``llama-server`` speculative flags of the llama.cpp in :data:`SCHEMA_VERSIONS`: no removed flag
    (:data:`LLAMA_CPP_REMOVED`: the server exits on one); every ``--spec-type`` name known; a draft type
    (``draft-simple``, ``draft-eagle3``, ...) with ``-md``; speculation on (a type other than none, or
    ``-md``); the integer flags in their ranges; ``--spec-draft-n-min <= --spec-draft-n-max``."""
    p = flag_pairs(flags, "llama.cpp")
    for flag in p:
        if flag in LLAMA_CPP_REMOVED:
            _fail(f"llama.cpp {flag} has been removed from llama-server; use {LLAMA_CPP_REMOVED[flag]}")
    types = [t for t in (p.get("--spec-type") or "").split(",") if t]
    unknown = [t for t in types if t not in LLAMA_CPP_SPEC_TYPES]
    if unknown:
        _fail(f"llama.cpp --spec-type {unknown[0]!r} is not one of {', '.join(sorted(LLAMA_CPP_SPEC_TYPES))}")
    draft = next((p[f] for f in LLAMA_CPP_DRAFT_FLAGS if p.get(f)), None)
    if any(t in LLAMA_CPP_DRAFT_TYPES for t in types) and not draft:
        _fail(f"llama.cpp --spec-type {','.join(types)} needs -md DRAFT.gguf")
    if set(types) <= {"none"} and not draft:
        _fail("llama.cpp: speculative decoding needs -md DRAFT.gguf or a --spec-type other than none")
    for flag, (low, high) in LLAMA_CPP_RANGES.items():
        _pos(p, flag, "llama.cpp", low, high)
    top, low = _pos(p, "--spec-draft-n-max", "llama.cpp"), _pos(p, "--spec-draft-n-min", "llama.cpp", 0)
    if top is not None and low is not None and low > top:
        _fail(f"llama.cpp --spec-draft-n-min {low} > --spec-draft-n-max {top}")


# ------------------------------------------------------------------------- what a binary accepts
_FLAG = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_-]*")
_HEAD = re.compile(r"^ {0,8}(-{1,2}[A-Za-z0-9][A-Za-z0-9_-]*(?:\s*,\s*-{1,2}[A-Za-z0-9][A-Za-z0-9_-]*)*)")
REMOVED_MARK = "has been removed"


def help_flags(text: str) -> frozenset[str]:
    """The flags a ``--help`` text offers: every spelling at the start of an option line (``-np, --parallel
    N``; a line indented past 8 spaces continues a description, and a flag named there is not offered),
    less those whose description says the argument "has been removed" (llama.cpp keeps removed flags in
    its help only to reject them)."""
    found: set[str] = set()
    current: list[str] = []
    for line in text.splitlines():
        head = _HEAD.match(line)
        if head:
            current = _FLAG.findall(head.group(1))
            found.update(current)
        if REMOVED_MARK in line:
            found.difference_update(current)
    return frozenset(found)


def unknown_flags(flags: Iterable[str], known: frozenset[str]) -> list[str]:
    """The flags in an argv (words starting with ``-`` that are not negative numbers; ``--a=b`` read as
    ``--a``) that ``known`` (:func:`help_flags`) lacks, in order."""
    out = []
    for word in flags:
        name = word.split("=", 1)[0]
        if name.startswith("-") and not name.lstrip("-").replace(".", "").isdigit() and name not in known:
            out.append(name)
    return out
