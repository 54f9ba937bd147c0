"""The decoder's building blocks, numerics as Hugging Face Llama: RoPE tables and rotation
(rotate-half, float32 tables cast to the activation dtype), RMSNorm (float32, cast back before the
weight multiply), and :class:`Linear`, whose matmul runs on a prepacked, row-invariant copy of its
weight (the bulk of the native model's speed-up, and what greedy exactness rests on)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specledger.engine import kernels
from specledger.engine.kernels import ops
from specledger.engine.model_config import ModelConfig


def rope_cos_sin(config: ModelConfig, n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF Llama RoPE tables: ``inv_freq_i = theta^(-2i/d)``, angle ``p * inv_freq`` duplicated
    to the full head_dim (rotate-half layout). Returns float32 ``cos, sin`` of shape [P, head_dim]."""
    head_dim = int(config.head_dim)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    angles = torch.outer(torch.arange(n_positions, dtype=torch.int64).float(), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with ``rotate_half([a, b]) = [-b, a]`` on the last axis.

    ``x`` is [B, T, heads, head_dim]; ``cos``/``sin`` broadcast to [T, heads, head_dim] in x's dtype.
    A head with ``cos = 1, sin = 0`` passes through unchanged (exactly), which is how the value
    heads ride along in the one fused q|k|v rotation.
    """
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm: ``weight * (x32 / sqrt(mean(x32^2) + eps)).to(x.dtype)``."""
    if x.dtype == torch.float32:
        if x.device.type == "cpu" and weight.dtype == torch.float32 and kernels.lib() is not None:
            return ops.rms_norm(x, weight, eps)
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


#: dtypes this CPU's oneDNN refused to prepack (found at the first attempt, then not retried)
_UNPACKABLE: set[torch.dtype] = set()


def _can_prepack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


class Linear(nn.Linear):
    """``nn.Linear`` whose matmul runs on a prepacked copy of its weight (derived state): the
    native row-invariant kernel of :mod:`specledger.engine.kernels` when it is built (fp32 and
    bf16, every row count), else oneDNN as below.

    Measured on the 2-core EPYC target (benchmarks/bench_model.py): the prepacked kernel
    (``mkldnn._linear_pointwise``) is ~1.7x faster than ``F.linear`` for bf16 decode and costs
    about the same for 1 and 9 rows.

    Row invariance (what greedy exactness rests on): in fp32 the oneDNN kernel gives every row
    the same bits whether 2 or 9 rows share the call, but a 1-row call takes another path with
    other rounding. So a single fp32 row is computed as a 2-row call (the row twice) and a
    decode step rounds exactly like a verify pass -- speculation can then never flip a greedy
    token. bf16 kernels are not row-invariant (results depend on a row's place in the M-block),
    which is why fp32 is the default dtype. The pack is built lazily on the first forward,
    rebuilt whenever the weight is replaced or modified in place, and never copied or saved.
    Set ``prepack = False`` (class or instance) for plain ``F.linear``.
    """

    prepack: bool = True
    #: run on the native row-invariant kernel (``engine/kernels``) when it is built; else oneDNN
    native: bool = True

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features, out_features, bias=bias)
        self._packed: torch.Tensor | None = None
        self._packed_key: tuple | None = None
        self._native = None

    def _weight_key(self) -> tuple:
        w = self.weight
        return (w.data_ptr(), w.dtype, 0 if w.is_inference() else w._version, self.prepack, self.native)

    def _repack(self) -> None:
        self._packed, self._native = None, None
        self._packed_key = self._weight_key()
        if self.prepack and self.native and kernels.supports(self.weight):
            with torch.inference_mode(False), torch.no_grad():
                self._native = kernels.PackedLinear(self.weight, self.bias)
            return
        if self.prepack and _can_prepack(self.weight) and self.weight.dtype not in _UNPACKABLE:
            try:
                with torch.inference_mode(False), torch.no_grad():
                    self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 1)
            except RuntimeError:  # e.g. bf16 packing needs AVX-512 or AVX-NE-CONVERT: plain F.linear then
                _UNPACKABLE.add(self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._weight_key() != self._packed_key:
            self._repack()
        if self._native is not None and x.dtype == self._native.dtype and x.device.type == "cpu":
            return self._native(x)
        if self._packed is None or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        if x.dtype == torch.float32 and x.numel() == x.shape[-1]:  # one row: run it as two (see above)
            pair = torch.cat([x, x], dim=-2)
            return torch.ops.mkldnn._linear_pointwise(pair, self._packed, self.bias, "none", [], "")[..., :1, :]
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def fused_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)``, the add folded into the native fp32 kernel's store (same bits)."""
        if self._weight_key() != self._packed_key:
            self._repack()
        nat = self._native
        if nat is not None and x.dtype == nat.dtype == torch.float32 and x.device.type == "cpu":
            return nat(x, residual)
        return residual + self(x)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_packed": None, "_packed_key": None, "_native": None}
