"""Python wrappers of ``ops.c``: the row-wise float32 decoder ops of the native decode path.

Each op computes every row with a fixed sequence of float operations (see ``ops.c``), so a row's
bits never depend on the other rows of the call: plain decode, verify passes, packed batches and
token trees agree bit for bit. Callers check :func:`specledger.engine.kernels.lib` first; inputs
are CPU float32 and made contiguous here.
"""

from __future__ import annotations

import math

import torch

from specledger.engine import kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x^2) + eps))`` per row of the last axis (HF RMSNorm in float32)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    d = x.shape[-1]
    kernels.lib().specledger_rmsnorm_f32(x.data_ptr(), weight.contiguous().data_ptr(), y.data_ptr(),
                                         x.numel() // d, d, eps)
    return y


def rope_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, rotated: int) -> None:
    """In place on ``qkv`` [M, H, hd] (contiguous): heads ``[0, rotated)`` of row m become
    ``x * cos[p] + rotate_half(x) * sin[p]`` with ``p = positions[m]``; tables [P, hd] float32."""
    m, h, hd = qkv.shape
    kernels.lib().specledger_rope_f32(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
                                      m, h, rotated, hd)


def attend(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
           positions: torch.Tensor, n_heads: int, n_kv_heads: int, tree: bool) -> torch.Tensor:
    """Write each row's new k/v into the caches [S, nkv, cap, hd] at (slot, position), then return
    [M, nh*hd]: per query head ``softmax(q . K[:p+1] / sqrt(hd)) V[:p+1]`` (query head i reads kv
    head ``i // (nh // nkv)``). ``tree``: rows may share positions (siblings), so each row writes
    just before it attends and sees exactly its own path (rows in DFS preorder)."""
    m, _, hd = qkv.shape
    out = torch.empty((m, n_heads * hd), dtype=torch.float32, device="cpu")
    kernels.lib().specledger_attn_f32(qkv.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                                      slots.data_ptr(), positions.data_ptr(), m, n_heads, n_kv_heads, hd,
                                      k_cache.shape[-2], 1.0 / math.sqrt(hd), int(tree), torch.get_num_threads())
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for rows ``[gate | up]`` [M, 2H] -> [M, H], ``silu(g) = g / (1 + exp(-g))``."""
    gate_up = gate_up.contiguous()
    m, h2 = gate_up.shape
    y = torch.empty((m, h2 // 2), dtype=torch.float32, device="cpu")
    kernels.lib().specledger_silu_mul_f32(gate_up.data_ptr(), y.data_ptr(), m, h2 // 2)
    return y
