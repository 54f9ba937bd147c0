"""Weight-only int8 quantization (per-output-channel, symmetric) for the native decoder.

For a weight row ``w_n`` (one output channel) the scale is ``s_n = max|w_n| / 127`` and the
stored weight is ``q_n = round(w_n / s_n)`` clipped to [-127, 127], so ``w_n ~= s_n * q_n`` with
error at most ``s_n / 2`` per entry. Activations stay in the model dtype:
``y = (x @ q^T) * s`` (+ bias).

Kernels: with bf16 activations ``torch.ops.aten._weight_int8pack_mm`` (gpt-fast's CPU path);
with float32 activations that kernel is ~4x slower than dequantizing on the fly, so the fp32
path computes ``F.linear(x, q.to(float32)) * s``.

Measured on the 2-core AMD EPYC target (benchmarks/bench_model.py, 1 thread, SmolLM2-135M):
int8 does NOT pay here. bf16 + int8 decodes at about the speed of the prepacked bf16 model
(~28-31 vs ~29 tok/s) and its verify pass grows faster with T (int8pack is a GEMV kernel);
fp32 + int8 (14 tok/s) is slower than prepacked fp32 (23 tok/s). Teacher-forced top-1
agreement with the unquantized model is 96-98 %, relative logit error ~4-5 %.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from specledger.engine.model import Transformer


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: returns ``(q int8 [N, K], scale float32 [N])`` with
    ``scale = max(|w_row|) / 127`` (a zero row gets scale 1)."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def _int8pack_available(dtype: torch.dtype) -> bool:
    """True if ``_weight_int8pack_mm`` exists and runs for activations of ``dtype``."""
    op = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if op is None:
        return False
    try:
        op(torch.ones(1, 8, dtype=dtype), torch.ones(8, 8, dtype=torch.int8), torch.ones(8, dtype=dtype))
    except (RuntimeError, NotImplementedError):
        return False
    return True


class Int8Linear(nn.Module):
    """``y = (x @ weight^T) * scales (+ bias)`` with an int8 ``weight`` [out, in]."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        dtype = linear.weight.dtype
        q, scale = quantize_per_channel(linear.weight)
        self.register_buffer("weight", q)
        self.register_buffer("scales", scale.to(dtype))
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.use_int8pack = (dtype != torch.float32 and linear.weight.device.type == "cpu"
                             and _int8pack_available(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_int8pack:
            flat = x.reshape(-1, self.in_features)
            y = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)
            y = y.view(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, self.weight.to(x.dtype)) * self.scales
        return y if self.bias is None else y + self.bias


def _swap_linears(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            _swap_linears(child)


def quantize_int8(model: Transformer, quantize_head: bool = True) -> Transformer:
    """A new model (deep copy; nothing mutable shared with ``model``) whose linear layers --
    q|k|v, o, gate|up, down in every block and, if ``quantize_head``, the LM head -- are
    weight-only int8. The embedding table stays in the model dtype (a lookup reads one row)."""
    quantized = copy.deepcopy(model)
    _swap_linears(quantized.layers)
    if quantize_head:
        quantized.lm_head = Int8Linear(quantized.lm_head)
    return quantized.eval().requires_grad_(False)
