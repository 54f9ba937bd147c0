"""The roofline pricer: a model config and a hardware table -> a :class:`specledger.cost.pricer.StepPricer`.

For machines this one cannot reach, the simulator prices a step from first principles, labelled
as such ("roofline lower bound + assumed overheads (...)"), never as a measurement.

One packed forward over R rows (tokens) for B requests at mean context C:

    bytes  = W + B * C * m_KV + R * m_KV            weights once, every request's KV read, new KV written
    flops  = 2 * P_active * pad(R) + 4 * L * H * d_h * (eff_compute / eff_attn) * R * C
    T_step = max(flops / (peak * eff_compute), bytes / (bandwidth * eff_memory)) + t_launch
             + L * k * t_kernel                     kernel launches, k per layer
             + [R > B] * L * k_multi * t_kernel     the q > 1 attention path (someone verifies several rows)
             + R * (V * b_logit / (bandwidth * eff_memory) + t_row)   logits written and read, sampling per row

with W the weight bytes, m_KV = 2 * L * H_kv * d_h * bytes-per-element the KV bytes per token,
P the parameters, L layers, H query heads of d_h, V the vocabulary, pad(R) the smallest CUDA-graph
capture size >= R (R itself above the largest). The first line is the pure roofline, a lower bound
(``Overheads`` "bound" keeps only it); the others are what engines add on top of it, with defaults
from public figures (:data:`OVERHEADS`, each cited there) -- still assumed, never measured here.
Prefill of n tokens is one step with R = n,
B = 1 and C = n / 2 (causal attention sees half the prompt on average). Drafting: model-free
drafters (ngram, suffix) cost ``model_free_draft_s`` per round; the ``model`` drafter with a draft
model config (``--draft-model-config``) costs, per request and round, ``gamma`` one-row steps of the
draft model's own roofline (priced per request: a server that batches the draft model's steps across
requests pays less at large batch), and its weights and KV come out of the memory the KV budget
may use. ``other_s`` is the scheduler / sampling overhead per step, assumed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specledger.errors import SpecLedgerError, require
from specledger.rundir import read_json

#: drafters whose drafting the roofline prices as steps of a draft model (``RooflineCost.draft_model``)
DRAFT_MODEL_DRAFTERS = ("model", "draft_model")
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
               "int8": 1, "fp8": 1, "float8": 1, "int4": 0.5}


@dataclass(frozen=True)
class Hardware:
    """Peak figures from vendor data sheets (dense, no sparsity) and the memory the KV cache may use."""

    name: str
    hbm_bandwidth_gb_s: float  # GB/s
    peak_tflops: float  # dense TFLOP/s at the model's dtype (16-bit for GPUs)
    memory_gb: float
    launch_overhead_s: float  # fixed per-step cost (kernel launches, scheduling on the device)
    note: str = ""


#: Data-sheet peaks (dense bf16/fp16 tensor-core TFLOP/s for GPUs; HBM or DRAM bandwidth).
HARDWARE: dict[str, Hardware] = {
    "a100": Hardware("A100 80GB SXM", 2039.0, 312.0, 80.0, 2e-4, "NVIDIA data sheet: 2.0 TB/s, 312 TFLOP/s bf16"),
    "h100": Hardware("H100 80GB SXM", 3350.0, 989.0, 80.0, 2e-4, "NVIDIA data sheet: 3.35 TB/s, 989 TFLOP/s bf16"),
    "h200": Hardware("H200 141GB SXM", 4800.0, 989.0, 141.0, 2e-4, "NVIDIA data sheet: 4.8 TB/s, 989 TFLOP/s bf16"),
    "l4": Hardware("L4 24GB", 300.0, 121.0, 24.0, 2e-4, "NVIDIA data sheet: 300 GB/s, 121 TFLOP/s bf16 dense"),
    "cpu": Hardware("this CPU (2 cores, assumed)", 20.0, 0.1, 16.0, 1e-3,
                    "assumed: ~20 GB/s DRAM, ~100 GFLOP/s fp32 on two AVX2 cores; calibrate for real figures"),
}


@dataclass(frozen=True)
class ModelConfig:
    """What the roofline needs of a transformer. ``params`` counts every weight read per token."""

    params: float
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    name: str = ""
    vocab: int = 0  # logits per row (0: unknown, sampling's logits traffic left out)

    @property
    def bytes_per_element(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_element

    @property
    def kv_bytes_per_token(self) -> float:
        """m_KV = 2 (K and V) * layers * kv_heads * head_dim * bytes per element."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_element


def _hf_params(d: dict[str, Any]) -> float:
    """Parameters of a Llama-style HF config: embeddings (+ untied head) + per layer attention and SwiGLU MLP."""
    h, n_layers = int(d["hidden_size"]), int(d["num_hidden_layers"])
    heads = int(d["num_attention_heads"])
    kv = int(d.get("num_key_value_heads", heads))
    hd = int(d.get("head_dim") or h // heads)
    ffn = int(d.get("intermediate_size", 4 * h))
    vocab = int(d.get("vocab_size", 32000))
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    mlp = 3 * h * ffn
    head = 0 if d.get("tie_word_embeddings", False) else vocab * h
    return float(vocab * h + head + n_layers * (attn + mlp + 2 * h))


def model_config_from_dict(d: dict[str, Any], name: str = "") -> ModelConfig:
    """Our short form ``{params, layers, kv_heads, head_dim, heads, dtype}`` or a Hugging Face config.json."""
    try:
        if "num_hidden_layers" in d:
            heads = int(d["num_attention_heads"])
            hd = int(d.get("head_dim") or int(d["hidden_size"]) // heads)
            dtype = str(d.get("torch_dtype") or d.get("dtype") or "bfloat16")
            return ModelConfig(params=float(d.get("params") or _hf_params(d)), layers=int(d["num_hidden_layers"]),
                               heads=heads, kv_heads=int(d.get("num_key_value_heads", heads)), head_dim=hd,
                               dtype=dtype, name=name or str(d.get("_name_or_path", "")),
                               vocab=int(d.get("vocab_size", 32000)))
        return ModelConfig(params=float(d["params"]), layers=int(d["layers"]), heads=int(d.get("heads", d["kv_heads"])),
                           kv_heads=int(d["kv_heads"]), head_dim=int(d["head_dim"]),
                           dtype=str(d.get("dtype", "bfloat16")), name=name or str(d.get("name", "")),
                           vocab=int(d.get("vocab", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecLedgerError(f"model config lacks or mistypes {exc}; give params, layers, heads, kv_heads, "
                              "head_dim, dtype (or a Hugging Face config.json)") from None


def load_model_config(path: str | Path) -> ModelConfig:
    p = Path(path)
    require(p.is_file(), f"model config not found: {p}; give a JSON file (a Hugging Face config.json works)")
    d = read_json(p, "give a JSON model config")
    cfg = model_config_from_dict(d, name=p.parent.name if p.name == "config.json" else p.stem)
    require(cfg.dtype in DTYPE_BYTES, f"unknown dtype {cfg.dtype!r} in {p}; use one of {', '.join(DTYPE_BYTES)}")
    return cfg


def hardware(name: str) -> Hardware:
    key = name.lower()
    require(key in HARDWARE, f"unknown hardware {name!r}; use one of {', '.join(HARDWARE)}")
    return HARDWARE[key]


#: vLLM's default CUDA-graph capture sizes (rows per step): 1, 2, 4, then every multiple of 8 up to 512
#: (vLLM's ``CompilationConfig.cudagraph_capture_sizes`` default, ``max_capture_size`` 512 in v1; v0's
#: ``_BATCH_SIZES_TO_CAPTURE`` was the same list up to 256). A step with more rows runs without a graph.
VLLM_CAPTURE_SIZES: tuple[int, ...] = (1, 2, 4, *range(8, 513, 8))


@dataclass(frozen=True)
class Overheads:
    """What a real engine pays on top of the roofline, per step (see the module docstring's formula).

    ``launch_s`` seconds per kernel launch, ``kernels_per_layer`` launches per decoder layer, and
    ``multi_row_kernels`` extra launch-equivalents per layer when any request has more than one row
    (the q > 1 attention path); ``eff_attn`` the fraction of peak FLOP/s attention reaches (None: the
    matmuls' ``eff_compute``); ``logit_bytes`` bytes per row and vocabulary entry that sampling moves
    (written, then read); ``sample_row_s`` a fixed cost per row (sampling / rejection bookkeeping);
    ``capture_sizes`` the CUDA-graph shapes a step's rows round up to (empty: no padding)."""

    name: str
    launch_s: float = 0.0
    kernels_per_layer: int = 0
    multi_row_kernels: float = 0.0
    eff_attn: float | None = None
    logit_bytes: float = 0.0
    sample_row_s: float = 0.0
    capture_sizes: tuple[int, ...] = ()


#: The overhead presets; each default is a public figure (or labelled an assumption where none is known).
#:
#: * ``bound`` -- the pure roofline: nothing on top. A lower bound for any engine.
#: * ``graphs`` (the default) -- a vLLM-like engine with CUDA graphs:
#:   - ``launch_s`` 1 us: NVIDIA's "Getting Started with CUDA Graphs" (A. Gray, NVIDIA developer blog,
#:     2019) times a chain of short (~2.9 us) kernels at ~3.8 us each launched on a stream and ~3.4 us each
#:     from a graph (V100), i.e. roughly 0.5-1 us of launch gap per kernel that graphs do not remove
#:     (figures as recalled, not re-checked here); we take 1 us.
#:   - ``kernels_per_layer`` 10: counted in vLLM's LlamaDecoderLayer (fused add+RMSNorm, QKV GEMM, RoPE,
#:     KV-cache write, attention, O GEMM, fused add+RMSNorm, gate-up GEMM, SiLU-and-mul, down GEMM).
#:   - ``multi_row_kernels`` 1: the varlen / prefill attention path (query-length metadata, masking or a
#:     split-KV merge) priced as one more launch per layer -- an assumption: no public figure isolates it.
#:   - ``eff_attn`` 0.35: FlashAttention-3 (Shah et al., 2024) reports FlashAttention-2 reaching only ~35%
#:     of H100 peak (FA3 itself ~75%, 740 TFLOP/s fp16 at long sequences); verification's short query
#:     tiles do worse, so 0.35 keeps the price a lower bound.
#:   - ``logit_bytes`` 8: float32 logits (vLLM's sampler upcasts to fp32) written once and read once.
#:   - ``sample_row_s`` 1 us: per-row sampling / rejection bookkeeping -- an assumption.
#:   - ``capture_sizes``: :data:`VLLM_CAPTURE_SIZES`.
#: * ``eager`` -- PyTorch eager (Hugging Face transformers-like), no graphs, no padding:
#:   - ``launch_s`` 5 us: the low end of the ~5-10 us per-op framework overhead of eager PyTorch (Horace
#:     He, "Making Deep Learning Go Brrrr From First Principles", 2022, the overhead section; PyTorch
#:     profiler traces of small ops on A100/H100 show the same order).
#:   - ``kernels_per_layer`` 40: counted in transformers' eager LlamaDecoderLayer (two unfused RMSNorms of
#:     ~6 ops each, q/k/v/o and gate/up/down GEMMs, RoPE ~5 ops each for q and k, the cache concatenations,
#:     repeat_kv copies, SDPA, activation, multiply, two residual adds, layout copies).
#:   - the rest as ``graphs``.
OVERHEADS: dict[str, Overheads] = {
    "bound": Overheads("bound"),
    "graphs": Overheads("graphs", 1e-6, 10, 1.0, 0.35, 8.0, 1e-6, VLLM_CAPTURE_SIZES),
    "eager": Overheads("eager", 5e-6, 40, 1.0, 0.35, 8.0, 1e-6, ()),
}


def overheads(name: str) -> Overheads:
    require(name in OVERHEADS, f"unknown roofline terms {name!r}; use one of {', '.join(OVERHEADS)}")
    return OVERHEADS[name]


@dataclass(frozen=True)
class RooflineTerms:
    """One model's roofline constants on one machine: for R rows of B requests at mean context C,

        T = max((flops_row * pad(R) + flops_attn * R * C) / compute, (weights + B * C * kv + R * kv) / memory)
            + launch + launches + [R > B] * multi_row + R * (logits / memory + row_s)

    flops_row = 2 P, flops_attn = 4 L H d_h (eff_compute / eff_attn) (attention's FLOPs at the matmul
    rate), kv = m_KV, compute / memory = the assumed-efficient peaks, launch the fixed per-step cost,
    launches = L k t_kernel, multi_row = L k_multi t_kernel, logits = V b_logit bytes per row, row_s per
    row, pad(R) the smallest of ``capture`` >= R (R above them all). With every overhead zero and no
    capture sizes this is the pure roofline (``Overheads`` "bound"), operation for operation.
    :meth:`time` (floats) and :meth:`times` (arrays) do the same operations in the same order, so a
    simulator that prices steps one at a time or many at once gets the same floats."""

    weights: float
    kv: float
    flops_row: float
    flops_attn: float
    compute: float
    memory: float
    launch: float
    launches: float = 0.0
    multi_row: float = 0.0
    logits: float = 0.0
    row_s: float = 0.0
    capture: tuple[int, ...] = ()

    def pad(self, rows: float) -> float:
        """The smallest capture size >= rows; rows itself above the largest (or with none)."""
        i = bisect_left(self.capture, rows)
        return self.capture[i] if i < len(self.capture) else rows

    def pads(self, rows: np.ndarray) -> np.ndarray:
        """:meth:`pad` of every element."""
        if not self.capture:
            return rows
        cap = np.asarray(self.capture)
        i = np.searchsorted(cap, rows, side="left")
        return np.where(i < cap.shape[0], cap[np.minimum(i, cap.shape[0] - 1)], rows)

    def time(self, rows: float, batch: float, context: float) -> float:
        byt = self.weights + batch * context * self.kv + rows * self.kv
        flops = self.flops_row * self.pad(rows) + self.flops_attn * rows * context
        t = max(flops / self.compute, byt / self.memory) + self.launch
        return (t + self.launches + (self.multi_row if rows > batch else 0.0)
                + rows * (self.logits / self.memory + self.row_s))

    def step_fns(self) -> tuple[Callable[[int, int, float], float],
                                Callable[[int, int, int, float], tuple[float, float]]]:
        """Fused scalar forms for a simulator's hot loop: ``one(rows, batch, context)`` is
        ``time(R, B, C)`` with R = max(1, rows, batch), B = max(1, batch), C = max(0, context) (the
        pricer's clamps plus a step's "at least one row per request"); ``two(rows, base, batch, context)``
        is ``(one(rows, batch, context), one(base, batch, context))`` sharing the batch's terms. The
        constants are bound once and :meth:`pad` is a table lookup up to the largest capture size; the
        operations and their order are :meth:`time`'s, so the floats are the same to the last bit."""
        weights, kv, flops_row, flops_attn = self.weights, self.kv, self.flops_row, self.flops_attn
        compute, memory, launch, launches, multi_row = (self.compute, self.memory, self.launch, self.launches,
                                                        self.multi_row)
        per_row = self.logits / self.memory + self.row_s
        top = max(self.capture) if self.capture else 0
        pad_of = [self.pad(r) for r in range(top + 1)]

        def one(rows: int, batch: int, context: float) -> float:
            r = rows if rows > batch else batch
            R = r if r > 1 else 1
            B = batch if batch > 1 else 1
            C = context if context > 0.0 else 0.0
            byt = weights + B * C * kv + R * kv
            flops = flops_row * (pad_of[R] if R <= top else R) + flops_attn * R * C
            a, m = flops / compute, byt / memory
            return float((m if m > a else a) + launch + launches + (multi_row if R > B else 0.0) + R * per_row)

        def two(rows: int, base: int, batch: int, context: float) -> tuple[float, float]:
            B = batch if batch > 1 else 1
            C = context if context > 0.0 else 0.0
            kv_batch = weights + B * C * kv
            r = rows if rows > batch else batch
            R = r if r > 1 else 1
            flops = flops_row * (pad_of[R] if R <= top else R) + flops_attn * R * C
            a, m = flops / compute, (kv_batch + R * kv) / memory
            f = float((m if m > a else a) + launch + launches + (multi_row if R > B else 0.0) + R * per_row)
            r = base if base > batch else batch
            R = r if r > 1 else 1
            flops = flops_row * (pad_of[R] if R <= top else R) + flops_attn * R * C
            a, m = flops / compute, (kv_batch + R * kv) / memory
            return f, float((m if m > a else a) + launch + launches + (multi_row if R > B else 0.0) + R * per_row)

        return one, two

    def times(self, rows: np.ndarray, batch: float, context: np.ndarray) -> np.ndarray:
        byt = self.weights + batch * context * self.kv + rows * self.kv
        flops = self.flops_row * self.pads(rows) + self.flops_attn * rows * context
        t = np.maximum(flops / self.compute, byt / self.memory) + self.launch
        return (t + self.launches + np.where(rows > batch, self.multi_row, 0.0)
                + rows * (self.logits / self.memory + self.row_s))


@dataclass
class RooflineCost:
    """The roofline :class:`specledger.cost.pricer.StepPricer` (never measured; ``source`` says so)."""

    model: ModelConfig
    hw: Hardware
    eff_memory: float = 0.7
    eff_compute: float = 0.5
    model_free_draft_s: float = 5e-5
    other_base_s: float = 3e-4
    other_per_request_s: float = 2e-5
    draft_model: ModelConfig | None = None
    overheads: Overheads = OVERHEADS["graphs"]
    extra: dict[str, Any] = field(default_factory=dict)
    _terms: dict[ModelConfig, RooflineTerms] = field(default_factory=dict, repr=False, compare=False)

    @property
    def source(self) -> str:
        o = self.overheads
        eff = (f"assumed efficiency: memory {self.eff_memory:.0%}, compute {self.eff_compute:.0%}; not measured")
        if o.name == "bound":
            return f"roofline lower bound {self.hw.name} x {self.model.name or 'model'} ({eff})"
        return (f"roofline lower bound + assumed overheads ({o.name}: {o.launch_s * 1e6:g} us x "
                f"{o.kernels_per_layer} kernels/layer, attention at {self.eff_attn:.0%} of peak, "
                f"{'padded to CUDA-graph sizes, ' if o.capture_sizes else ''}sampling per row) "
                f"{self.hw.name} x {self.model.name or 'model'} ({eff})")

    @property
    def eff_attn(self) -> float:
        """Attention's fraction of peak FLOP/s: the overheads' ``eff_attn``, else the matmuls'."""
        return self.overheads.eff_attn if self.overheads.eff_attn is not None else self.eff_compute

    def terms(self, m: ModelConfig | None = None) -> RooflineTerms:
        """The roofline constants of ``m`` (default: the target) on this machine, with the overheads."""
        m = m or self.model
        cached = self._terms.get(m)
        if cached is not None:
            return cached
        o = self.overheads
        cached = self._terms[m] = RooflineTerms(
            m.weight_bytes, m.kv_bytes_per_token, 2 * m.params,
            4 * m.layers * m.heads * m.head_dim * (self.eff_compute / self.eff_attn),
            self.hw.peak_tflops * 1e12 * self.eff_compute, self.hw.hbm_bandwidth_gb_s * 1e9 * self.eff_memory,
            self.hw.launch_overhead_s, m.layers * o.kernels_per_layer * o.launch_s,
            m.layers * o.multi_row_kernels * o.launch_s, m.vocab * o.logit_bytes, o.sample_row_s, o.capture_sizes)
        return cached

    def _step(self, m: ModelConfig, rows: float, batch: float, context: float) -> float:
        return self.terms(m).time(rows, batch, context)

    def step_s(self, total_rows: int, batch: int, context: float) -> float:
        return self._step(self.model, max(1, total_rows), max(1, batch), max(0.0, context))

    def step_s_many(self, rows: np.ndarray, batch: int, context: np.ndarray) -> np.ndarray:
        """:meth:`step_s` for many steps of one batch size at once (the same floats)."""
        return self.terms().times(np.maximum(rows, 1), max(1, batch), np.maximum(context, 0.0))

    def round_s(self, rows: int, context: float) -> float:
        return self.step_s(rows, 1, context)

    def prefill_s(self, prompt_tokens: int, slots: int = 1) -> float:
        """One step of R = n rows at context n / 2 (the roofline has no slot term: ``slots`` is ignored)."""
        return self._step(self.model, max(1, prompt_tokens), 1, prompt_tokens / 2)

    def draft_s(self, drafter: str, gamma: int, context: float = 0.0) -> float:
        if gamma <= 0:
            return 0.0
        if self.draft_model is not None and drafter in DRAFT_MODEL_DRAFTERS:
            return gamma * self._step(self.draft_model, 1, 1, context)
        return self.model_free_draft_s

    def other_s(self, batch: int = 1) -> float:
        return self.other_base_s + self.other_per_request_s * batch

    def kv_budget_tokens(self, mem_util: float = 0.9) -> int:
        """KV tokens that fit: (memory * utilisation - weights) / m_KV (vLLM's gpu_memory_utilization idea);
        with a draft model, its weights come off the memory and its KV per token is added to m_KV."""
        d = self.draft_model
        free = self.hw.memory_gb * 1e9 * mem_util - self.model.weight_bytes - (d.weight_bytes if d else 0.0)
        require(free > 0, f"{self.model.name or 'the model'}{' and its draft model' if d else ''} do not fit in "
                f"{self.hw.name}'s memory")
        return int(free // (self.model.kv_bytes_per_token + (d.kv_bytes_per_token if d else 0.0)))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "roofline", "source": self.source, "model": asdict(self.model), "hardware": asdict(self.hw),
                "eff_memory": self.eff_memory, "eff_compute": self.eff_compute,
                "model_free_draft_s": self.model_free_draft_s, "other_base_s": self.other_base_s,
                "other_per_request_s": self.other_per_request_s,
                "draft_model": asdict(self.draft_model) if self.draft_model else None,
                "overheads": asdict(self.overheads)}


def roofline_from_dict(d: dict[str, Any]) -> RooflineCost:
    """A roofline profile :meth:`RooflineCost.to_dict` wrote (one written before the overheads: the pure roofline)."""
    o = d.get("overheads") or {"name": "bound"}
    return RooflineCost(ModelConfig(**d["model"]), Hardware(**d["hardware"]), d["eff_memory"], d["eff_compute"],
                        d["model_free_draft_s"], d["other_base_s"], d["other_per_request_s"],
                        ModelConfig(**d["draft_model"]) if d.get("draft_model") else None,
                        Overheads(**{**o, "capture_sizes": tuple(o.get("capture_sizes", ()))}))


def roofline(hw_name: str, model: ModelConfig, eff_memory: float = 0.7, eff_compute: float = 0.5,
             draft_model: ModelConfig | None = None, terms: str = "graphs") -> RooflineCost:
    """A roofline profile; ``terms``: "bound" (the pure roofline), "graphs" (default) or "eager"
    (:data:`OVERHEADS`)."""
    require(0 < eff_memory <= 1 and 0 < eff_compute <= 1, "efficiency factors must lie in (0, 1]")
    return RooflineCost(model, hardware(hw_name), eff_memory, eff_compute, draft_model=draft_model,
                        overheads=overheads(terms))
